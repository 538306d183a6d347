// Group advantage estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++ and its baseline variant, GSPO),
// computed per group and right for uneven groups (any number of samples per prompt, including one)
// and for fan-out groups (one episode producing several trajectories).
//
// Fan-out: the statistics of a group are taken over its EPISODES (distinct rolloutIds), each counted
// once with the mean reward of its trajectories, and every trajectory receives its episode's
// advantage. So an episode that fanned out into five trajectories weighs as much in the baseline as
// one that produced a single trajectory, and a group's size is never assumed from the config.

/** The advantage estimators ooze implements. */
export type AdvantageEstimator = "grpo" | "dr_grpo" | "rloo" | "reinforce_pp" | "reinforce_pp_baseline" | "gspo";

export const ADVANTAGE_ESTIMATORS: readonly AdvantageEstimator[] = [
  "grpo",
  "dr_grpo",
  "rloo",
  "reinforce_pp",
  "reinforce_pp_baseline",
  "gspo",
];

/** What an estimator needs of a sample. */
export interface ScoredSample {
  groupIndex: number;
  rolloutId: string;
  reward: number;
}

export interface AdvantageOptions {
  /** Added to the standard deviation before dividing (GRPO, GSPO, global whitening). Default 1e-6. */
  eps?: number;
  /**
   * Negative-sample reinforcement for groups that failed throughout (group-baseline estimators:
   * grpo, gspo, dr_grpo, rloo). A group of two or more episodes whose rewards are all equal and not
   * above 0 has no contrast, so its advantages are 0 and a policy that put all its probability on a
   * failing answer to that prompt gets no gradient to leave it. With this > 0 each of its episodes gets
   * −failedGroupAdvantage: the sampled answers are pushed down and the probability goes to the others.
   * Default 0 (plain estimators).
   */
  failedGroupAdvantage?: number;
}

/**
 * One scalar advantage per sample, in input order; the trainer broadcasts it over the sample's
 * model tokens. Definitions (r = episode rewards of one group, n = episodes in the group):
 * - grpo / gspo: (rᵢ − mean r) / (std r + eps), std unbiased (n − 1); a group of one episode has no
 *   std and gets rᵢ − mean r = 0. (GSPO differs from GRPO in its loss — a sequence-level ratio —
 *   not in its advantages.)
 * - dr_grpo: rᵢ − mean r (no std division).
 * - rloo: rᵢ − mean of the other episodes' rewards = n/(n−1)·(rᵢ − mean r); 0 for a group of one.
 * - reinforce_pp: the reward itself, whitened over the whole batch (no per-group baseline).
 * - reinforce_pp_baseline: rᵢ − mean r per group, then whitened over the whole batch.
 * Batch whitening counts each episode once, like the group statistics.
 */
export function computeAdvantages(
  samples: readonly ScoredSample[],
  estimator: AdvantageEstimator,
  options: AdvantageOptions = {},
): Float64Array {
  const eps = options.eps ?? 1e-6;
  const penalty = options.failedGroupAdvantage ?? 0;
  if (!(penalty >= 0)) throw new RangeError(`failedGroupAdvantage must be ≥ 0, got ${penalty}`);
  const out = new Float64Array(samples.length);
  // group → episode → sample positions
  const groups = new Map<number, Map<string, number[]>>();
  samples.forEach((s, i) => {
    if (!Number.isFinite(s.reward)) throw new RangeError(`sample ${i} has a non-finite reward (${s.reward})`);
    let g = groups.get(s.groupIndex);
    if (!g) groups.set(s.groupIndex, (g = new Map()));
    let e = g.get(s.rolloutId);
    if (!e) g.set(s.rolloutId, (e = []));
    e.push(i);
  });

  // Per-episode advantage before any batch whitening.
  const episodeAdv: { positions: number[]; adv: number }[] = [];
  for (const episodes of groups.values()) {
    const eps_ = [...episodes.values()];
    const rewards = eps_.map((pos) => mean(pos.map((i) => samples[i]!.reward)));
    const n = rewards.length;
    const m = mean(rewards);
    const sd = n > 1 ? std(rewards, m) : 0;
    const failedThroughout = penalty > 0 && n > 1 && sd === 0 && m <= 0 && estimator !== "reinforce_pp" && estimator !== "reinforce_pp_baseline";
    eps_.forEach((positions, k) => {
      const r = rewards[k]!;
      if (failedThroughout) {
        episodeAdv.push({ positions, adv: -penalty });
        return;
      }
      let adv: number;
      switch (estimator) {
        case "grpo":
        case "gspo":
          adv = n > 1 ? (r - m) / (sd + eps) : 0;
          break;
        case "dr_grpo":
        case "reinforce_pp_baseline":
          adv = r - m;
          break;
        case "rloo":
          adv = n > 1 ? (n / (n - 1)) * (r - m) : 0;
          break;
        case "reinforce_pp":
          adv = r;
          break;
      }
      episodeAdv.push({ positions, adv });
    });
  }

  if (estimator === "reinforce_pp" || estimator === "reinforce_pp_baseline") {
    const all = episodeAdv.map((e) => e.adv);
    const m = mean(all);
    const sd = all.length > 1 ? std(all, m) : 0;
    for (const e of episodeAdv) e.adv = all.length > 1 ? (e.adv - m) / (sd + eps) : 0;
  }
  for (const e of episodeAdv) for (const i of e.positions) out[i] = e.adv;
  return out;
}

/** True when every episode of a group has the same reward: no learning signal (dynamic filter). */
export function isZeroVariance(samples: readonly ScoredSample[]): boolean {
  if (samples.length === 0) return true;
  const first = samples[0]!.reward;
  return samples.every((s) => s.reward === first);
}

function mean(xs: readonly number[]): number {
  let s = 0;
  for (const x of xs) s += x;
  return xs.length ? s / xs.length : 0;
}

/** Unbiased (n − 1) standard deviation. */
function std(xs: readonly number[], m: number): number {
  let s = 0;
  for (const x of xs) s += (x - m) * (x - m);
  return Math.sqrt(s / (xs.length - 1));
}
