// Policy-gradient losses of RL training, per token over a packed batch (reference of
// native/src/loss.cc, and the public definitions behind ooze/algorithms): PPO clip with asymmetric
// bounds, dual clip, KL penalty estimators k1/k2/k3, entropy bonus, truncated importance sampling, a
// cross-entropy against the uniform distribution, per-token or per-sample reduction. Each function
// returns the loss terms and their gradients.

/** KL estimator of KL(π_θ ‖ π_ref) from δ = logπ_θ(a) − logπ_ref(a) at a token a sampled from the policy. */
export type KlType = "k1" | "k2" | "k3";
/** "token": Σ mask·ℓ / Σ mask over the batch. "sample": mean over samples of each sample's masked mean. */
export type Reduction = "token" | "sample";

/** Loss configuration (the same fields the native Trainer reads). */
export interface PolicyLossConfig {
  /** Ratio lower bound 1 − epsClip. */
  epsClip: number;
  /** Ratio upper bound 1 + epsClipHigh (DAPO's clip-higher when larger than epsClip). */
  epsClipHigh: number;
  /** Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at −c·A; null disables. */
  epsClipC: number | null;
  /** Weight of the KL penalty; needs reference logprobs when non-zero. */
  klCoef: number;
  klType: KlType;
  /** Entropy bonus: the loss subtracts entropyCoef · entropy. */
  entropyCoef: number;
  /**
   * The loss adds uniformCoef · CE(uniform, π) = uniformCoef · −(1/V)·Σ_v log π(v) at every trained
   * token. Its gradient on the logits, uniformCoef·(π − 1/V), does not vanish where one token has
   * probability near 1 (where the entropy bonus's and the policy gradient's do), so it keeps a
   * collapsed policy able to move. Needs the forward's uniformCe; 0 (the default) turns it off.
   */
  uniformCoef?: number;
  /** Truncated importance sampling cap on exp(old − rollout); null disables. Needs rollout logprobs. */
  tisCap: number | null;
  reduction: Reduction;
  /** Divide by this count instead of the batch's own (tokens or samples), for micro-batching; null: own. */
  normalizer: number | null;
}

/** Defaults: PPO clip 0.2 symmetric, no dual clip, no KL, no entropy bonus, no TIS, per-token mean. */
export const defaultPolicyLossConfig: PolicyLossConfig = {
  epsClip: 0.2, epsClipHigh: 0.2, epsClipC: null, klCoef: 0, klType: "k3",
  entropyCoef: 0, uniformCoef: 0, tisCap: null, reduction: "token", normalizer: null,
};

/** Per-token inputs aligned with the packed tokens; sequence s spans cuSeqlens[s] .. cuSeqlens[s+1]. */
export interface PolicyLossInputs {
  cuSeqlens: Int32Array;
  /** Current policy's logprobs of each token (train forward). */
  logprobs: ArrayLike<number>;
  /** Current policy's entropy at each token. */
  entropy: ArrayLike<number>;
  /** 1 = model token trained on, 0 = prompt / environment token. */
  lossMask: ArrayLike<number>;
  advantages: ArrayLike<number>;
  /** Logprobs of the policy the ratio is taken against (before this step's updates). */
  oldLogprobs: ArrayLike<number>;
  /** Logprobs the inference engine reported when sampling (for TIS); null when not used. */
  rolloutLogprobs: ArrayLike<number> | null;
  /** Reference policy's logprobs (for KL); null when not used. */
  refLogprobs: ArrayLike<number> | null;
  /** The uniform distribution's cross-entropy against the current policy at each token; needed when uniformCoef > 0. */
  uniformCe?: ArrayLike<number> | null;
}

/** Metrics of one loss evaluation; means use the reduction's weights. */
export interface PolicyLossMetrics {
  loss: number;
  pgLoss: number;
  kl: number;
  entropy: number;
  /** Share of tokens where the PPO clip bound the loss. */
  clipfrac: number;
  /** Share of tokens where the dual clip bound the loss. */
  dualClipfrac: number;
  ratioMean: number;
  ratioMin: number;
  ratioMax: number;
  tisMean: number;
  /** Mean of old − new logprob: how far the policy moved from the old one. */
  ppoKl: number;
  /** Mean cross-entropy of the uniform distribution against the policy (0 unless uniformCoef > 0). */
  uniformCe: number;
  numTokens: number;
  numSamples: number;
}

/** The loss, its metrics, and dL/dlogprobs, dL/dentropy, dL/duniformCe per token. */
export interface PolicyLossResult {
  metrics: PolicyLossMetrics;
  dLogprobs: Float64Array;
  dEntropy: Float64Array;
  dUniform: Float64Array;
}

/** KL estimate and its derivative wrt logπ_θ for δ = logπ_θ − logπ_ref: k1 = δ, k2 = δ²/2, k3 = e^{−δ} − 1 + δ. */
export function klEstimate(delta: number, type: KlType): { value: number; grad: number } {
  switch (type) {
    case "k1": return { value: delta, grad: 1 };
    case "k2": return { value: 0.5 * delta * delta, grad: delta };
    case "k3": return { value: Math.exp(-delta) - 1 + delta, grad: 1 - Math.exp(-delta) };
  }
}

/**
 * PPO clipped surrogate for one token, with optional dual clip: returns the loss, its derivative wrt
 * the new logprob, and which clip was active. r = exp(logp − old).
 */
export function ppoClipToken(
  logp: number, old: number, advantage: number, epsClip: number, epsClipHigh: number, epsClipC: number | null,
): { loss: number; grad: number; ratio: number; clipped: boolean; dualClipped: boolean } {
  const ratio = Math.exp(logp - old);
  const pg1 = -advantage * ratio;
  const pg2 = -advantage * Math.min(Math.max(ratio, 1 - epsClip), 1 + epsClipHigh);
  let loss = Math.max(pg1, pg2);
  let grad = pg1 >= pg2 ? -advantage * ratio : 0;
  let dualClipped = false;
  if (epsClipC !== null && advantage < 0 && -advantage * epsClipC < loss) {
    loss = -advantage * epsClipC;
    grad = 0;
    dualClipped = true;
  }
  return { loss, grad, ratio, clipped: pg2 > pg1, dualClipped };
}

/** Reduction weight of every token: the loss is Σ weight·ℓ. */
export function reductionWeights(
  cuSeqlens: Int32Array, lossMask: ArrayLike<number>, reduction: Reduction, normalizer: number | null,
): { weights: Float64Array; numTokens: number; numSamples: number } {
  const T = lossMask.length;
  const weights = new Float64Array(T);
  let numTokens = 0, numSamples = 0;
  for (let s = 0; s + 1 < cuSeqlens.length; s++) {
    let n = 0;
    for (let t = cuSeqlens[s]!; t < cuSeqlens[s + 1]!; t++) n += lossMask[t] ? 1 : 0;
    numTokens += n;
    if (n > 0) numSamples++;
    if (reduction === "sample" && n > 0)
      for (let t = cuSeqlens[s]!; t < cuSeqlens[s + 1]!; t++) weights[t] = lossMask[t] ? 1 / n : 0;
  }
  let denom = normalizer ?? (reduction === "token" ? numTokens : numSamples);
  if (denom <= 0) denom = 1;
  for (let t = 0; t < T; t++) weights[t] = reduction === "token" ? (lossMask[t] ? 1 / denom : 0) : weights[t]! / denom;
  return { weights, numTokens, numSamples };
}

/**
 * The full policy loss: per masked token
 * ℓ = tis·ppo + klCoef·k(logp − ref) − entropyCoef·entropy + uniformCoef·uniformCe, with
 * tis = min(exp(old − rollout), tisCap) (applied to the policy-gradient term only), reduced per token or
 * per sample.
 */
export function policyLoss(c: PolicyLossConfig, x: PolicyLossInputs): PolicyLossResult {
  if (c.klCoef !== 0 && x.refLogprobs === null) throw new Error("klCoef is set but refLogprobs is null");
  if (c.tisCap !== null && x.rolloutLogprobs === null) throw new Error("tisCap is set but rolloutLogprobs is null");
  const uc = c.uniformCoef ?? 0;
  if (uc < 0) throw new Error("uniformCoef must be >= 0");
  if (uc > 0 && !x.uniformCe) throw new Error("uniformCoef is set but uniformCe is missing");
  const T = x.lossMask.length;
  const { weights, numTokens, numSamples } = reductionWeights(x.cuSeqlens, x.lossMask, c.reduction, c.normalizer);
  const m: PolicyLossMetrics = {
    loss: 0, pgLoss: 0, kl: 0, entropy: 0, clipfrac: 0, dualClipfrac: 0, ratioMean: 0,
    ratioMin: Infinity, ratioMax: -Infinity, tisMean: 0, ppoKl: 0, uniformCe: 0, numTokens, numSamples,
  };
  const dLogprobs = new Float64Array(T), dEntropy = new Float64Array(T), dUniform = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    if (!x.lossMask[t]) continue;
    const w = weights[t]!, lp = x.logprobs[t]!, old = x.oldLogprobs[t]!;
    const pg = ppoClipToken(lp, old, x.advantages[t]!, c.epsClip, c.epsClipHigh, c.epsClipC);
    const tis = c.tisCap !== null ? Math.min(Math.exp(old - x.rolloutLogprobs![t]!), c.tisCap) : 1;
    const kl = x.refLogprobs !== null ? klEstimate(lp - x.refLogprobs[t]!, c.klType) : { value: 0, grad: 0 };
    const ent = x.entropy[t]!, uce = uc > 0 ? x.uniformCe![t]! : 0;
    m.loss += w * (tis * pg.loss + c.klCoef * kl.value - c.entropyCoef * ent + uc * uce);
    m.uniformCe += w * uce;
    m.pgLoss += w * tis * pg.loss;
    m.kl += w * kl.value;
    m.entropy += w * ent;
    m.clipfrac += w * (pg.clipped ? 1 : 0);
    m.dualClipfrac += w * (pg.dualClipped ? 1 : 0);
    m.ratioMean += w * pg.ratio;
    m.ppoKl += w * (old - lp);
    m.tisMean += w * tis;
    m.ratioMin = Math.min(m.ratioMin, pg.ratio);
    m.ratioMax = Math.max(m.ratioMax, pg.ratio);
    dLogprobs[t] = w * (tis * pg.grad + c.klCoef * kl.grad);
    dEntropy[t] = -w * c.entropyCoef;
    dUniform[t] = w * uc;
  }
  if (numTokens === 0) m.ratioMin = m.ratioMax = 0;
  return { metrics: m, dLogprobs, dEntropy, dUniform };
}
