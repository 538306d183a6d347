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

/** The families `ooze model init --arch` writes, and their sizes. */
export const ARCHS = ["llama3", "qwen2", "qwen3"] as const;
export type Arch = (typeof ARCHS)[number];
export const SIZES = ["tiny", "small", "0.5b-shape"] as const;
export type Size = (typeof SIZES)[number];

/**
 * Each family's own fields (model_type, rotary settings, biases, head size) at its real vocabulary,
 * at three sizes: `tiny` and `small` for tests and CPU runs, `0.5b-shape` the dimensions of a real
 * half-billion model (Qwen2.5-0.5B, Qwen3-0.6B; for Llama 3, Llama 3.2's fields at ~0.5B).
 * `vocab_size` is the family's (151,936 for Qwen, 128,256 for Llama 3); BOS/EOS are the family's
 * ids, replaced by the tokenizer's when one is given.
 */
export function familyConfig(arch: Arch, size: Size): LlamaHfConfig {
  const dims = {
    tiny: { hidden_size: 64, intermediate_size: 176, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2 },
    small: { hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2 },
  } as const;
  switch (arch) {
    case "llama3": {
      const base = {
        model_type: "llama", architectures: ["LlamaForCausalLM"], vocab_size: 128256, rms_norm_eps: 1e-5, rope_theta: 500000,
        rope_scaling: { rope_type: "llama3", factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
        max_position_embeddings: 131072, tie_word_embeddings: true, bos_token_id: 128000, eos_token_id: 128009,
      };
      if (size === "0.5b-shape")
        return { ...base, hidden_size: 1024, intermediate_size: 4096, num_hidden_layers: 24, num_attention_heads: 16, num_key_value_heads: 4 };
      return { ...base, ...dims[size] };
    }
    case "qwen2": {
      const base = {
        model_type: "qwen2", architectures: ["Qwen2ForCausalLM"], vocab_size: 151936, rms_norm_eps: 1e-6, rope_theta: 1000000,
        max_position_embeddings: 32768, tie_word_embeddings: true, bos_token_id: 151643, eos_token_id: 151645,
      };
      if (size === "0.5b-shape")
        return { ...base, hidden_size: 896, intermediate_size: 4864, num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2 };
      return { ...base, ...dims[size] };
    }
    case "qwen3": {
      const base = {
        model_type: "qwen3", architectures: ["Qwen3ForCausalLM"], vocab_size: 151936, rms_norm_eps: 1e-6, rope_theta: 1000000,
        max_position_embeddings: 40960, tie_word_embeddings: true, bos_token_id: 151643, eos_token_id: 151645, attention_bias: false,
      };
      if (size === "0.5b-shape")
        return { ...base, hidden_size: 1024, intermediate_size: 3072, num_hidden_layers: 28, num_attention_heads: 16, num_key_value_heads: 8, head_dim: 128 };
      // Qwen3 keeps head_dim at 128 whatever the width; the small shapes keep q wider than hidden too.
      return { ...base, ...dims[size], head_dim: size === "tiny" ? 32 : 128 };
    }
  }
}
