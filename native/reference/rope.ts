// TypeScript reference of the rotary inverse frequencies (native/src/model.cc rope_inv_freq): fp32
// values as transformers computes them — 1 / theta^(2i/d), then `linear` or `llama3` scaling.
import type { RopeScalingJson } from "../index.d.ts";

/** What the frequencies depend on: the config's theta, head size and rope scaling (null: none). */
export interface RopeConfig {
  rope_theta: number;
  rope_scaling?: RopeScalingJson | null;
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
    } else if (type !== "default") throw new Error(`rope_type '${type}' has no reference`);
    out[i] = f;
  }
  return out;
}
