// Reference of native/src/optim.cc: global-norm gradient clipping and AdamW with decoupled weight
// decay (not applied to 1-D tensors, i.e. the RMSNorm weights), in float64.

/** AdamW hyper-parameters (the fields the native Trainer reads). */
export interface AdamWConfig {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  /** Decoupled weight decay for ≥2-D tensors; RMSNorm weights are never decayed. */
  weightDecay: number;
  /** Global L2 norm clip; 0 disables clipping. */
  maxGradNorm: number;
}

/** Moments and step count. */
export interface AdamWState {
  m: Float64Array;
  v: Float64Array;
  step: number;
}

/** Global L2 norm of a gradient buffer. */
export function globalNorm(g: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < g.length; i++) s += g[i]! * g[i]!;
  return Math.sqrt(s);
}

/** Scales g in place so its norm is at most maxNorm (torch's clip_grad_norm_); returns the pre-clip norm and factor. */
export function clipGradNorm(g: Float64Array, maxNorm: number): { norm: number; coef: number } {
  const norm = globalNorm(g);
  const coef = maxNorm > 0 ? Math.min(1, maxNorm / (norm + 1e-6)) : 1;
  if (coef < 1) for (let i = 0; i < g.length; i++) g[i]! *= coef;
  return { norm, coef };
}

/**
 * One clipped AdamW step in place on params. `tensors` gives each tensor's offset, size and rank
 * (rank 1 = no weight decay). Skips the update (returns skipped) when the gradient norm is not finite.
 */
export function adamwStep(
  params: Float64Array, grads: Float64Array, state: AdamWState, c: AdamWConfig,
  tensors: { offset: number; numel: number; shape: number[] }[],
): { gradNorm: number; clipCoef: number; skipped: boolean; step: number } {
  const g = Float64Array.from(grads);
  const { norm, coef } = clipGradNorm(g, c.maxGradNorm);
  if (!Number.isFinite(norm)) return { gradNorm: norm, clipCoef: 1, skipped: true, step: state.step };
  state.step += 1;
  const bc1 = 1 - c.beta1 ** state.step, bc2 = 1 - c.beta2 ** state.step;
  for (const t of tensors) {
    const decay = t.shape.length >= 2 ? 1 - c.lr * c.weightDecay : 1;
    for (let i = t.offset; i < t.offset + t.numel; i++) {
      state.m[i] = c.beta1 * state.m[i]! + (1 - c.beta1) * g[i]!;
      state.v[i] = c.beta2 * state.v[i]! + (1 - c.beta2) * g[i]! * g[i]!;
      const denom = Math.sqrt(state.v[i]!) / Math.sqrt(bc2) + c.eps;
      params[i] = params[i]! * decay - (c.lr / bc1) * (state.m[i]! / denom);
    }
  }
  return { gradNorm: norm, clipCoef: coef, skipped: false, step: state.step };
}

/** Fresh zeroed state for n parameters. */
export function newAdamWState(n: number): AdamWState {
  return { m: new Float64Array(n), v: new Float64Array(n), step: 0 };
}
