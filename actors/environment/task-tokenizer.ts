// The tokenizer a task writes its prompts and observations with and reads the model's turns with:
// the model directory's own (tokenizer.json, through the gateway's loader) when it has one, else the
// embedded model's byte-level tokenizer. The environment encodes its own text once; the model's
// sampled ids are only decoded, never re-encoded (token-in, token-out).
import { existsSync } from "node:fs";
import { join } from "node:path";
import { BOS_ID, BYTE_TOKENIZER_VOCAB, decodeBytes, encodeBytes, EOS_ID } from "../../src/engine/tokenizer.ts";
import { OozeError } from "../../src/errors.ts";
import { loadHfChatModel } from "../../src/gateway/tokenizer.ts";
import { readModelConfig } from "../../native/model-dir.ts";

/** What a task needs of the model's tokenizer. */
export interface TaskTokenizer {
  /** "bytes", or the model directory whose tokenizer.json it is. */
  readonly name: string;
  /** Text → ids; no BOS added. */
  encode(text: string): Int32Array;
  /** Ids → text, special tokens (EOS, BOS) skipped. */
  decode(ids: ArrayLike<number>): string;
  /** Put before a prompt, or null when the tokenizer has no BOS (Qwen). */
  readonly bos: number | null;
  /** The id that ends the model's turn: the model config's eos_token_id, the one the engines stop on. */
  readonly eos: number;
}

/** The embedded model's byte tokenizer: ids 0–255 are bytes, BOS 256, EOS 257 (or `eos`, a model config's). */
export function byteTaskTokenizer(eos: number = EOS_ID): TaskTokenizer {
  return { name: "bytes", encode: (text) => encodeBytes(text), decode: (ids) => decodeBytes(ids), bos: BOS_ID, eos };
}

/** A prompt's ids: the tokenizer's BOS (if it has one), then the text. */
export function encodePrompt(tok: TaskTokenizer, text: string): Int32Array {
  const ids = tok.encode(text);
  if (tok.bos === null) return ids;
  const out = new Int32Array(ids.length + 1);
  out[0] = tok.bos;
  out.set(ids, 1);
  return out;
}

/**
 * The tokenizer of the model directory `modelDir` (null: a preset, whose models are byte-level):
 * its tokenizer.json when it has one (read by the gateway's `loadHfChatModel`, cached per
 * directory), else the byte tokenizer, which needs a vocabulary of at least 259. EOS is config.json's
 * eos_token_id either way. Errors name the directory and what to do.
 */
export async function taskTokenizerFor(modelDir: string | null): Promise<TaskTokenizer> {
  if (modelDir === null) return byteTaskTokenizer();
  const config = await readModelConfig(modelDir);
  if (!existsSync(join(modelDir, "tokenizer.json"))) {
    if (config.vocab_size < BYTE_TOKENIZER_VOCAB)
      throw new OozeError("CONFIG_INVALID", `${join(modelDir, "config.json")}: vocab_size ${config.vocab_size} is too small for the byte tokenizer (needs ${BYTE_TOKENIZER_VOCAB}) and there is no tokenizer.json; copy the model's tokenizer files beside it`);
    return byteTaskTokenizer(config.eos_token_id);
  }
  const hf = loadHfChatModel(modelDir).tokenizer;
  const bosIds = hf.bosToken ? hf.encode(hf.bosToken) : [];
  return {
    name: modelDir,
    encode: (text) => Int32Array.from(hf.encode(text)),
    decode: (ids) => hf.decode(ids, true),
    bos: bosIds.length === 1 ? bosIds[0]! : null,
    eos: config.eos_token_id,
  };
}
