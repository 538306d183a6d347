// Generalized advantage estimation (GAE, Schulman et al. 2016) over multi-turn samples, token-level:
// only model tokens (loss mask 1) are steps; environment tokens between turns are skipped, not valued
// as actions, so the step after a turn's last token is the next turn's first model token (its value
// sees the observation). Rewards: each turn's reward at the last model token of that turn, the final
// reward at the sample's last model token; the episode ends there (the value after it is 0).
// Advantages can be whitened over the batch's model tokens; returns (A + V, before whitening) are the
// critic's targets.

/** What GAE needs of one sample; arrays over the response. */
export interface GaeSample {
  /** 1 = model token (a step), 0 = environment/tool token (skipped). */
  lossMask: ArrayLike<number>;
  /** The critic's value of the state before each response token (read where lossMask is 1). */
  values: ArrayLike<number>;
  /** Final reward, given at the last model token. */
  reward: number;
  /**
   * Per-turn rewards: reward k goes to the last model token before response position ends[k]
   * (a turn's end); null when the task rewards only the end.
   */
  turnRewards: { ends: readonly number[]; rewards: readonly number[] } | null;
}

/** How advantages are normalised over the batch. */
export type AdvantageWhitening = "none" | "batch";

export interface GaeOptions {
  /** Discount per model-token step. */
  gamma: number;
  /** GAE λ: 0 = one-step TD, 1 = Monte Carlo returns minus the value. */
  lambda: number;
  /** "batch": (A − mean) / (std + eps) over every model token of the batch. Default "batch". */
  whitening?: AdvantageWhitening;
  /** Added to the std when whitening. Default 1e-8. */
  eps?: number;
}

/** Per-sample advantages and returns over the response (0 where lossMask is 0). */
export interface GaeResult {
  advantages: Float32Array[];
  returns: Float32Array[];
}

/** Rewards per response position: the per-turn rewards at their turns' last model tokens, the final reward at the last one. */
export function placeRewards(s: GaeSample, sampleIndex = 0): Float64Array {
  const n = s.lossMask.length;
  const r = new Float64Array(n);
  const steps: number[] = [];
  for (let i = 0; i < n; i++) if (s.lossMask[i]) steps.push(i);
  if (steps.length === 0) return r;
  if (!Number.isFinite(s.reward)) throw new RangeError(`sample ${sampleIndex}: reward ${s.reward} is not finite`);
  r[steps[steps.length - 1]!]! += s.reward;
  if (s.turnRewards) {
    const { ends, rewards } = s.turnRewards;
    if (ends.length !== rewards.length)
      throw new RangeError(`sample ${sampleIndex}: turnRewards has ${ends.length} ends and ${rewards.length} rewards`);
    ends.forEach((end, k) => {
      const rew = rewards[k]!;
      if (!Number.isFinite(rew)) throw new RangeError(`sample ${sampleIndex}: turn ${k} reward ${rew} is not finite`);
      if (!(end >= 0 && end <= n)) throw new RangeError(`sample ${sampleIndex}: turn ${k} ends at ${end}, outside the response (0..${n})`);
      let at = -1;
      for (const i of steps) if (i < end) at = i;
      r[at >= 0 ? at : steps[0]!]! += rew; // a turn without model tokens: its reward goes to the first step
    });
  }
  return r;
}

/**
 * GAE per sample: δ_s = r_s + γ·V_{s+1} − V_s over the model-token steps s (V after the last step = 0),
 * A_s = δ_s + γλ·A_{s+1}, R_s = A_s + V_s; then optional batch whitening of A.
 */
export function computeGae(samples: readonly GaeSample[], o: GaeOptions): GaeResult {
  if (!(o.gamma >= 0 && o.gamma <= 1)) throw new RangeError(`gamma must be in [0, 1], got ${o.gamma}`);
  if (!(o.lambda >= 0 && o.lambda <= 1)) throw new RangeError(`lambda must be in [0, 1], got ${o.lambda}`);
  const advantages: Float32Array[] = [], returns: Float32Array[] = [];
  const raw: Float64Array[] = [];
  samples.forEach((s, k) => {
    const n = s.lossMask.length;
    if (s.values.length !== n) throw new RangeError(`sample ${k}: values has ${s.values.length} entries, lossMask ${n}`);
    const r = placeRewards(s, k);
    const adv = new Float64Array(n), ret = new Float32Array(n);
    let nextV = 0, nextA = 0;
    for (let i = n - 1; i >= 0; i--) {
      if (!s.lossMask[i]) continue;
      const v = s.values[i]!;
      const delta = r[i]! + o.gamma * nextV - v;
      const a = delta + o.gamma * o.lambda * nextA;
      adv[i] = a;
      ret[i] = a + v;
      nextV = v;
      nextA = a;
    }
    raw.push(adv);
    returns.push(ret);
  });
  let mean = 0, sd = 1;
  if ((o.whitening ?? "batch") === "batch") {
    const all: number[] = [];
    samples.forEach((s, k) => {
      for (let i = 0; i < s.lossMask.length; i++) if (s.lossMask[i]) all.push(raw[k]![i]!);
    });
    if (all.length > 1) {
      mean = all.reduce((x, y) => x + y, 0) / all.length;
      sd = Math.sqrt(all.reduce((x, y) => x + (y - mean) ** 2, 0) / (all.length - 1)) + (o.eps ?? 1e-8);
    }
  }
  samples.forEach((s, k) => {
    const out = new Float32Array(s.lossMask.length);
    for (let i = 0; i < out.length; i++) if (s.lossMask[i]) out[i] = (raw[k]![i]! - mean) / sd;
    advantages.push(out);
  });
  return { advantages, returns };
}

/** Share of the returns' variance the values explain: 1 − Var(R − V) / Var(R) over model tokens (NaN when Var(R) = 0). */
export function explainedVariance(lossMask: ArrayLike<number>[], values: ArrayLike<number>[], returns: ArrayLike<number>[]): number {
  let n = 0, sr = 0, srr = 0, sd = 0, sdd = 0;
  lossMask.forEach((mask, k) => {
    for (let i = 0; i < mask.length; i++) {
      if (!mask[i]) continue;
      const R = returns[k]![i]!, d = R - values[k]![i]!;
      n++, (sr += R), (srr += R * R), (sd += d), (sdd += d * d);
    }
  });
  if (n < 2) return Number.NaN;
  const varR = srr / n - (sr / n) ** 2, varD = sdd / n - (sd / n) ** 2;
  return varR > 0 ? 1 - varD / varR : Number.NaN;
}
