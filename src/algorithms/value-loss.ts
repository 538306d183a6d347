// The critic's clipped value loss (reference of value_loss in native/src/loss.cc), as PPO defines it:
// per masked token ℓ = max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²) / 2, reduced with the same
// weights as the policy loss (per token or per sample, optional normalizer), scaled by valueCoef.
import { reductionWeights, type Reduction } from "./losses.ts";

/** Value-loss settings (the same fields the native Trainer reads). */
export interface ValueLossConfig {
  /** Weight of the value loss in the total loss. */
  valueCoef: number;
  /** ε_v: the clipped term keeps V within oldValues ± valueClip; null or <= 0: no clipping. */
  valueClip: number | null;
  reduction: Reduction;
  normalizer: number | null;
}

/** Per-token inputs aligned with the packed tokens (one entry per token). */
export interface ValueLossInputs {
  cuSeqlens: Int32Array;
  lossMask: ArrayLike<number>;
  /** The critic's current values. */
  values: ArrayLike<number>;
  /** The critic's values when the returns were computed. */
  oldValues: ArrayLike<number>;
  /** Value targets (GAE returns). */
  returns: ArrayLike<number>;
}

/** Metrics of the value loss; means use the reduction's weights. */
export interface ValueLossMetrics {
  /** The reduced value loss (without valueCoef). */
  valueLoss: number;
  /** Share of tokens where the clipped term was the larger one. */
  valueClipfrac: number;
  /** Mean of the current values. */
  valueMean: number;
}

/** The value loss, its metrics, and dL/dvalues per token (valueCoef included). */
export function valueLoss(c: ValueLossConfig, x: ValueLossInputs): { loss: number; metrics: ValueLossMetrics; dValues: Float64Array } {
  const T = x.lossMask.length;
  const { weights } = reductionWeights(x.cuSeqlens, x.lossMask, c.reduction, c.normalizer);
  const m: ValueLossMetrics = { valueLoss: 0, valueClipfrac: 0, valueMean: 0 };
  const dValues = new Float64Array(T);
  const clip = c.valueClip !== null && c.valueClip > 0 ? c.valueClip : null;
  for (let t = 0; t < T; t++) {
    if (!x.lossMask[t]) continue;
    const v = x.values[t]!, old = x.oldValues[t]!, R = x.returns[t]!, w = weights[t]!;
    const l1 = 0.5 * (v - R) ** 2;
    let l = l1, dv = v - R, clipped = false;
    if (clip !== null) {
      const vc = old + Math.min(Math.max(v - old, -clip), clip);
      const l2 = 0.5 * (vc - R) ** 2;
      // l2 > l1 only when V lies outside the clip range, where Vc does not depend on V
      if (l2 > l1) (l = l2), (dv = 0), (clipped = true);
    }
    m.valueLoss += w * l;
    m.valueClipfrac += w * (clipped ? 1 : 0);
    m.valueMean += w * v;
    dValues[t] = w * c.valueCoef * dv;
  }
  return { loss: c.valueCoef * m.valueLoss, metrics: m, dValues };
}
