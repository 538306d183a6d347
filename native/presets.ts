// Model size presets: HF Llama configs for the byte tokenizer (vocab 259) or a 32k vocabulary.
import type { LlamaHfConfig } from "./index.d.ts";
import { referenceLayout } from "./reference/model.ts";
import { BOS_ID, BYTE_TOKENIZER_VOCAB, EOS_ID } from "../src/engine/tokenizer.ts";

type SizeFields =
  | "vocab_size"
  | "hidden_size"
  | "intermediate_size"
  | "num_hidden_layers"
  | "num_attention_heads"
  | "num_key_value_heads"
  | "max_position_embeddings"
  | "tie_word_embeddings";

function llama(fields: Pick<LlamaHfConfig, SizeFields>): LlamaHfConfig {
  return { rms_norm_eps: 1e-5, rope_theta: 10000, bos_token_id: BOS_ID, eos_token_id: EOS_ID, ...fields };
}

/** Named presets. Parameter counts: tiny ≈ 0.12M, quickstart ≈ 0.69M, small ≈ 9.5M, base100m ≈ 100M. */
export const PRESETS = {
  /** For tests: fast, untied lm_head so both head paths are exercised. */
  tiny: llama({
    vocab_size: BYTE_TOKENIZER_VOCAB,
    hidden_size: 64,
    intermediate_size: 176,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    max_position_embeddings: 512,
    tie_word_embeddings: false,
  }),
  /** The quickstart model: learns 2-digit addition by RL within minutes on 2 CPU cores. */
  quickstart: llama({
    vocab_size: BYTE_TOKENIZER_VOCAB,
    hidden_size: 128,
    intermediate_size: 352,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    max_position_embeddings: 512,
    tie_word_embeddings: true,
  }),
  /** About 10M parameters, byte vocabulary. */
  small: llama({
    vocab_size: BYTE_TOKENIZER_VOCAB,
    hidden_size: 384,
    intermediate_size: 1024,
    num_hidden_layers: 6,
    num_attention_heads: 6,
    num_key_value_heads: 2,
    max_position_embeddings: 1024,
    tie_word_embeddings: true,
  }),
  /** About 100M parameters with a 32000-token vocabulary (ids 256/257 stay BOS/EOS for byte prompts). */
  base100m: llama({
    vocab_size: 32000,
    hidden_size: 768,
    intermediate_size: 2048,
    num_hidden_layers: 12,
    num_attention_heads: 12,
    num_key_value_heads: 4,
    max_position_embeddings: 2048,
    tie_word_embeddings: true,
  }),
} as const satisfies Record<string, LlamaHfConfig>;

export type PresetName = keyof typeof PRESETS;

/** Whether `name` is a preset. */
export function isPresetName(name: string): name is PresetName {
  return Object.hasOwn(PRESETS, name);
}

/** Number of parameters of a config (embedding, layers with their biases and q/k norms, final norm, lm_head unless tied). */
export function paramCount(c: LlamaHfConfig): number {
  return referenceLayout(c).reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
}
