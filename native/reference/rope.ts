// TypeScript reference of the rotary inverse frequencies and attention scaling (native/src/model.cc
// rope_inv_freq, rope_attention_scaling): fp32 values as transformers computes them — 1 / theta^(2i/d),
// then `linear`, `llama3` or `yarn` scaling.
import type { RopeScalingJson } from "../index.d.ts";

/** What the frequencies depend on: the config's theta, head size and rope scaling (null: none). */
export interface RopeConfig {
  rope_theta: number;
  rope_scaling?: RopeScalingJson | null;
  max_position_embeddings?: number;
}

/** head_dim / 2 inverse frequencies (each an fp32 value). */
export function ropeInvFreq(c: RopeConfig, headDim: number): Float64Array {
  const f32 = Math.fround;
  const half = headDim / 2;
  const out = new Float64Array(half);
  const r = c.rope_scaling ?? null;
  const type = r?.rope_type ?? r?.type ?? "default";
  for (let i = 0; i < half; i++) {
    let f = f32(1 / f32(Math.pow(c.rope_theta, f32((2 * i) / headDim))));
    if (r && type === "linear") f = f32(f / r.factor!);
    else if (r && type === "llama3") {
      const old = r.original_max_position_embeddings!, lo = r.low_freq_factor!, hi = r.high_freq_factor!, factor = r.factor!;
      const lowWavelen = f32(old / lo), highWavelen = f32(old / hi);
      const wavelen = f32(f32(2 * Math.PI) / f);
      if (wavelen > lowWavelen) f = f32(f / factor);
      else if (!(wavelen < highWavelen)) {
        const smooth = f32(f32(f32(old / wavelen) - lo) / f32(hi - lo));
        f = f32(f32(f32(f32(1 - smooth) * f) / factor) + f32(smooth * f));
      }
    } else if (type !== "default" && type !== "yarn") throw new Error(`rope_type '${type}' has no reference`);
    out[i] = f;
  }
  if (r && type === "yarn") {
    // Interpolate (÷ factor) the dimensions that turn fewer than beta_slow times over the original
    // context, keep those turning more than beta_fast times, ramp between (bounds in double).
    const orig = r.original_max_position_embeddings ?? c.max_position_embeddings ?? 2048;
    const factor = r.factor ?? (c.max_position_embeddings ?? orig) / orig;
    const corr = (rot: number) => (headDim * Math.log(orig / (rot * 2 * Math.PI))) / (2 * Math.log(c.rope_theta));
    let low = corr(r.beta_fast || 32), high = corr(r.beta_slow || 1);
    if (r.truncate !== false) (low = Math.floor(low)), (high = Math.ceil(high));
    low = Math.max(low, 0), high = Math.min(high, headDim - 1);
    if (low === high) high += 0.001;
    for (let i = 0; i < half; i++) {
      const posFreq = f32(Math.pow(c.rope_theta, f32((2 * i) / headDim)));
      const extra = f32(1 / posFreq), inter = f32(1 / f32(factor * posFreq));
      const keep = f32(1 - Math.min(1, Math.max(0, f32(f32(i - f32(low)) / f32(high - low)))));
      out[i] = f32(f32(inter * f32(1 - keep)) + f32(extra * keep));
    }
  }
  return out;
}

/** The factor cos and sin are multiplied by: yarn's attention factor, else 1. */
export function ropeAttentionScaling(c: RopeConfig): number {
  const r = c.rope_scaling ?? null;
  if (!r || (r.rope_type ?? r.type) !== "yarn") return 1;
  if (r.attention_factor) return r.attention_factor;
  const orig = r.original_max_position_embeddings ?? c.max_position_embeddings ?? 2048;
  const factor = r.factor ?? (c.max_position_embeddings ?? orig) / orig;
  const mscale = (scale: number, m: number) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
  if (r.mscale && r.mscale_all_dim) return Math.fround(mscale(factor, r.mscale) / mscale(factor, r.mscale_all_dim));
  return Math.fround(mscale(factor, 1));
}
