// Helpers for checking the native trainer against the references: llm.c-style tensor comparison that
// names the first differing values, tiny configs, seeded random params and packed batches.
import { mulberry32 } from "../../src/random.ts";
import type { LlamaHfConfig } from "../index.d.ts";
import { tensorLayout, type TrainModelConfig } from "./train.ts";

/** A tiny Llama config: GQA (4 heads, 2 kv heads), 2 layers; tied or untied lm_head. */
export function tinyTrainConfig(tied: boolean, vocab = 23): LlamaHfConfig {
  return {
    vocab_size: vocab, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 4,
    num_key_value_heads: 2, rms_norm_eps: 1e-5, rope_theta: 10000, tie_word_embeddings: tied,
    max_position_embeddings: 64, bos_token_id: 1, eos_token_id: 2,
  };
}

/** Deterministic pseudo-random numbers in [0, 1) (mulberry32). */
export const rng = mulberry32;

/** Params with larger weights than HF's init (std `scale`) so gradients are not vanishingly small; norms ≈ 1. */
export function randomParams(cfg: TrainModelConfig, seed: number, scale = 0.3): Float32Array {
  const { tensors, numel } = tensorLayout(cfg);
  const r = rng(seed);
  const p = new Float32Array(numel);
  for (const t of tensors)
    for (let i = 0; i < t.numel; i++) p[t.offset + i] = t.shape.length === 1 ? 1 + 0.2 * (r() - 0.5) : scale * 2 * (r() - 0.5);
  return p;
}

/** A packed batch of sequences with the given lengths and random ids. */
export function randomPacked(lengths: number[], vocab: number, seed: number): { tokens: Int32Array; cuSeqlens: Int32Array } {
  const r = rng(seed);
  const cu = new Int32Array(lengths.length + 1);
  lengths.forEach((n, i) => (cu[i + 1] = cu[i]! + n));
  const tokens = new Int32Array(cu[lengths.length]!);
  for (let i = 0; i < tokens.length; i++) tokens[i] = Math.floor(r() * vocab);
  return { tokens, cuSeqlens: cu };
}

/**
 * Compares `actual` to `expected` elementwise: |a − e| ≤ atol + rtol·|e|. Returns "" when all agree,
 * else a report naming the count, the worst index and the first differing values (llm.c check_tensor).
 */
export function checkTensor(name: string, actual: ArrayLike<number>, expected: ArrayLike<number>, atol: number, rtol: number): string {
  if (actual.length !== expected.length) return `${name}: length ${actual.length} != expected ${expected.length}`;
  let bad = 0, worst = 0, worstAt = -1;
  const first: string[] = [];
  for (let i = 0; i < actual.length; i++) {
    const a = actual[i]!, e = expected[i]!, d = Math.abs(a - e);
    if (!(d <= atol + rtol * Math.abs(e))) {
      bad++;
      if (first.length < 5) first.push(`[${i}] ${a} vs ${e}`);
      if (!(d <= worst)) (worst = d), (worstAt = i);
    }
  }
  if (bad === 0) return "";
  return `${name}: ${bad}/${actual.length} differ (atol ${atol}, rtol ${rtol}); worst |diff| ${worst} at ${worstAt}; first: ${first.join(", ")}`;
}

/** Random upstream gradients in [-0.5, 0.5) at every position that has a logprob (not a sequence's first token). */
export function randomUpstream(cu: Int32Array, T: number, seed: number): { dl: Float32Array; de: Float32Array } {
  const r = mulberry32(seed);
  const dl = new Float32Array(T), de = new Float32Array(T);
  for (let s = 0; s + 1 < cu.length; s++)
    for (let i = cu[s]! + 1; i < cu[s + 1]!; i++) (dl[i] = r() - 0.5), (de[i] = r() - 0.5);
  return { dl, de };
}

/** checkTensor over every tensor of `cfg`'s layout: the reports of those that differ (empty when all agree). */
export function checkGrads(cfg: TrainModelConfig, actual: Float32Array, expected: Float64Array, atol: number, rtol: number): string[] {
  const errors: string[] = [];
  for (const ts of tensorLayout(cfg).tensors) {
    const e = checkTensor(ts.name, actual.subarray(ts.offset, ts.offset + ts.numel), expected.subarray(ts.offset, ts.offset + ts.numel), atol, rtol);
    if (e) errors.push(e);
  }
  return errors;
}

/** Max |a − b|. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}
