// Per-step metrics of a training run: the record written to DIR/metrics.jsonl (one JSON object per
// line), a summary over a run, and the reward chart DIR/reward.svg (hand-written SVG: reward against
// step, and against wall time on a second axis).
import { appendFileSync, readFileSync, existsSync, writeFileSync } from "node:fs";

/** One line of metrics.jsonl. */
export interface StepMetrics {
  step: number;
  reward_mean: number;
  /** Fraction of samples with the full reward (1). */
  reward_max_frac: number;
  /** Fraction of samples whose episode reached the task's goal (Task.success; the full reward if the task has no test). */
  success_rate: number;
  samples: number;
  tokens: number;
  /** Wall seconds since the run (first start) began. */
  seconds: number;
  step_seconds: number;
  rollout_seconds: number;
  train_seconds: number;
  /** Seconds the trainer waited for weight sync: the previous version's before announcing this one (and, at the last step, its own). */
  sync_seconds: number;
  samples_per_s: number;
  weight_version: number;
  /** Versions between the trainer and the oldest token of any trained sample. */
  staleness_max: number;
  /** Trained samples whose tokens were sampled under more than one weight version (partial rollout). */
  partial_samples: number;
  cache_hit_rate: number;
  loss: number;
  kl: number;
  entropy: number;
  clipfrac: number;
  grad_norm: number;
  /** Mean response tokens (model and environment) of the trained samples. */
  response_length_mean: number;
  failed: number;
  dropped_groups: number;
  trainer_restarts: number;
  /** PPO (algorithm: ppo) only: the critic's value loss, the share of the returns' variance its values explained, mean value and return over model tokens, value-clip fraction. */
  value_loss?: number;
  explained_variance?: number;
  value_mean?: number;
  return_mean?: number;
  value_clipfrac?: number;
  /** Learning rate of the step's optimizer update (the actor loop's trainer; absent in older runs). */
  lr?: number;
  /** Entropy-bonus coefficient of the step's update (moves each step under `entropyTarget`). */
  entropy_coef?: number;
  /** The adaptive entropy control's target after the step (`entropyTarget`, moving toward `entropyTargetFinal`). */
  entropy_target?: number;
  /** train.uniformCoef > 0 only: mean cross-entropy of the uniform distribution against the policy (nats; log V at uniform). */
  uniform_ce?: number;
  /**
   * train.explorer on: seconds the explorer files' writes finished since the previous step took
   * (usually the previous step's file, written while this step trained), and of them the encoding
   * on the trainer's event loop. Their share of step_seconds bounds what the files cost the loop.
   */
  explorer_seconds?: number;
  explorer_encode_seconds?: number;
  /** Trained samples by staleness: entry k counts those whose oldest token is k versions behind the trainer. */
  staleness_hist?: number[];
  /**
   * Several policies: each one's figures of the step, as `policy_NAME_reward_mean`,
   * `policy_NAME_success_rate`, `policy_NAME_samples`, and (when it trained) `policy_NAME_loss`,
   * `policy_NAME_entropy`, `policy_NAME_grad_norm`, `policy_NAME_clipfrac`.
   */
  [policyField: `policy_${string}`]: number;
}

/**
 * One record of batches.jsonl: which sample indices the step trained on, which it dropped (filter,
 * failed episodes) and, in fully_async mode, which it requeued (their group was beyond the staleness
 * bound; its prompt is generated again under new sample indices).
 */
export interface BatchRecord {
  step: number;
  trained: number[];
  dropped: number[];
  requeued?: number[];
  /** Prompt indices of the requeued groups. */
  requeuedPrompts?: number[];
  /** fully_async: prompt indices of the groups trained, and of those dropped (filter, or too stale too often). */
  trainedPrompts?: number[];
  droppedPrompts?: number[];
}

/**
 * One record of samples.jsonl (train.recordTokens): a trained sample's tokens (prompt then
 * response) and the [start, end) ranges of positions in them that the model sampled (loss mask 1).
 */
export interface SampleTokensRecord {
  step: number;
  index: number;
  promptLength: number;
  tokens: number[];
  sampled: [number, number][];
}

/** The samples.jsonl record of a sample trained at `step`. */
export function sampleTokensRecord(step: number, s: { index: number; tokens: Int32Array; responseLength: number; lossMask: Uint8Array }): SampleTokensRecord {
  const promptLength = s.tokens.length - s.responseLength;
  const sampled: [number, number][] = [];
  for (let i = 0; i < s.responseLength; i++) {
    if (s.lossMask[i] !== 1) continue;
    const last = sampled.at(-1);
    if (last && last[1] === promptLength + i) last[1]++;
    else sampled.push([promptLength + i, promptLength + i + 1]);
  }
  return { step, index: s.index, promptLength, tokens: Array.from(s.tokens), sampled };
}

/** The share of `xs` for which `f` holds (0 for none). */
function fracOf<T>(xs: readonly T[], f: (x: T) => boolean): number {
  return xs.length ? xs.filter(f).length / xs.length : 0;
}

/** Reward statistics of a step's samples (those with a reward; failed generations have none). */
export function rewardStats(samples: readonly { reward: number | null; metadata: Record<string, unknown> }[]): Pick<StepMetrics, "reward_mean" | "reward_max_frac" | "success_rate"> {
  const ok = samples.filter((s) => s.reward !== null);
  return {
    reward_mean: ok.length ? ok.reduce((a, s) => a + s.reward!, 0) / ok.length : 0,
    reward_max_frac: fracOf(ok, (s) => s.reward! >= 1),
    // a sample whose success is null (a context of several branches: a rate, not one outcome) does not count
    success_rate: fracOf(ok.filter((s) => s.metadata.success !== null), (s) => (typeof s.metadata.success === "boolean" ? s.metadata.success : s.reward! >= 1)),
  };
}

/** Appends one record to a JSONL file. */
export function appendJsonl(path: string, record: unknown): void {
  appendFileSync(path, `${JSON.stringify(record)}\n`);
}

/** Reads a JSONL file (missing file → []). */
export function readJsonl<T>(path: string): T[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as T);
}

/** Mean of the last `k` values (NaN for none). */
export function tailMean(xs: readonly number[], k: number): number {
  const t = xs.slice(-k);
  return t.length ? t.reduce((a, b) => a + b, 0) / t.length : Number.NaN;
}

/** First step whose trailing mean over `window` steps reaches `target`, or null. */
export function firstReaching(ms: readonly StepMetrics[], target: number, window = 5): StepMetrics | null {
  for (let i = 0; i < ms.length; i++) {
    const from = Math.max(0, i - window + 1);
    const w = ms.slice(from, i + 1);
    if (w.length === window && w.reduce((a, m) => a + m.reward_mean, 0) / w.length >= target) return ms[i]!;
  }
  return null;
}

const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

/** The reward chart: reward_mean (and the success rate) against step, with wall time marked on the top axis. */
export function rewardSvg(ms: readonly Pick<StepMetrics, "step" | "reward_mean" | "success_rate" | "seconds">[], title: string): string {
  const W = 640, H = 360, L = 56, R = 20, T = 44, B = 44;
  const pw = W - L - R, ph = H - T - B;
  const maxStep = Math.max(1, ...ms.map((m) => m.step));
  const maxSec = Math.max(1, ...ms.map((m) => m.seconds));
  const x = (step: number) => L + (step / maxStep) * pw;
  const y = (r: number) => T + (1 - Math.min(1, Math.max(0, r))) * ph;
  const path = (f: (m: (typeof ms)[number]) => number) =>
    ms.map((m, i) => `${i === 0 ? "M" : "L"}${x(m.step).toFixed(1)},${y(f(m)).toFixed(1)}`).join(" ");
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">`);
  parts.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  parts.push(`<text x="${W / 2}" y="16" text-anchor="middle" font-size="13">${esc(title)}</text>`);
  for (let i = 0; i <= 5; i++) {
    const r = i / 5;
    parts.push(`<line x1="${L}" x2="${L + pw}" y1="${y(r)}" y2="${y(r)}" stroke="#ddd"/>`);
    parts.push(`<text x="${L - 6}" y="${y(r) + 4}" text-anchor="end">${r.toFixed(1)}</text>`);
  }
  for (let i = 0; i <= 5; i++) {
    const s = Math.round((maxStep * i) / 5);
    parts.push(`<text x="${x(s)}" y="${T + ph + 16}" text-anchor="middle">${s}</text>`);
    const sec = (maxSec * i) / 5;
    parts.push(`<text x="${L + (pw * i) / 5}" y="${T - 8}" text-anchor="middle" fill="#888">${sec.toFixed(0)}s</text>`);
  }
  parts.push(`<rect x="${L}" y="${T}" width="${pw}" height="${ph}" fill="none" stroke="#444"/>`);
  parts.push(`<text x="${L + pw / 2}" y="${H - 8}" text-anchor="middle">step (top axis: wall seconds, approx.)</text>`);
  parts.push(`<text x="14" y="${T + ph / 2}" text-anchor="middle" transform="rotate(-90 14 ${T + ph / 2})">reward</text>`);
  if (ms.length > 0) {
    parts.push(`<path d="${path((m) => m.success_rate)}" fill="none" stroke="#e39b2d" stroke-width="1.5"/>`);
    parts.push(`<path d="${path((m) => m.reward_mean)}" fill="none" stroke="#2d6be3" stroke-width="2"/>`);
  }
  parts.push(`<text x="${L + 8}" y="${T + 14}" fill="#2d6be3">reward_mean</text>`);
  parts.push(`<text x="${L + 100}" y="${T + 14}" fill="#e39b2d">success rate</text>`);
  parts.push(`</svg>`);
  return parts.join("\n");
}

/** Writes DIR/reward.svg from the metrics so far. */
export function writeRewardSvg(path: string, ms: readonly StepMetrics[], title: string): void {
  writeFileSync(path, rewardSvg(ms, title));
}
