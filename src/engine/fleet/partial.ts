// The tokens of one generation that may span several dispatches (partial rollout): ids and logprobs
// exactly as the engines sampled them, appended attempt by attempt from cumulative stream chunks,
// with one weight-version span per run of tokens sampled under the same version.

/** A run of output tokens `[start, end)` sampled under one weight version. */
export interface WeightVersionSpan {
  start: number;
  end: number;
  version: string;
}

/** Version recorded for tokens whose engine reported no weight_version. */
export const UNKNOWN_VERSION = "unknown";

/**
 * Accumulates a generation across dispatches. Each dispatch is an attempt: `beginAttempt()`, then
 * `update(ids, logprobs, version)` with each cumulative chunk of that attempt (ids sampled by this
 * attempt only); tokens already seen are never rewritten, so whatever a dead engine streamed stays.
 */
export class PartialRollout {
  private ids: number[] = [];
  private lps: number[] = [];
  private spans: WeightVersionSpan[] = [];
  /** Tokens present when the current attempt began. */
  private base = 0;

  /** Tokens sampled so far, over all attempts. */
  get length(): number {
    return this.ids.length;
  }

  /** Starts a new attempt: later chunks are relative to the tokens held now. */
  beginAttempt(): void {
    this.base = this.ids.length;
  }

  /** Tokens sampled by the current attempt so far. */
  get attemptLength(): number {
    return this.ids.length - this.base;
  }

  /**
   * Takes a cumulative chunk of the current attempt: `ids`/`logprobs` are everything this attempt
   * has sampled. Only the tokens beyond those already held are appended, under `version`.
   * A final chunk that is shorter (a server trimmed a stop token) truncates the attempt's tail.
   */
  update(ids: ArrayLike<number>, logprobs: ArrayLike<number>, version: string | null, final = false): void {
    const have = this.attemptLength;
    if (final && ids.length < have) {
      this.truncate(this.base + ids.length);
      return;
    }
    if (ids.length <= have) return;
    const v = version ?? UNKNOWN_VERSION;
    for (let i = have; i < ids.length; i++) {
      this.ids.push(ids[i]!);
      this.lps.push(i < logprobs.length ? logprobs[i]! : Number.NaN);
    }
    const end = this.ids.length;
    const last = this.spans[this.spans.length - 1];
    if (last && last.version === v && last.end === this.base + have) last.end = end;
    else this.spans.push({ start: this.base + have, end, version: v });
  }

  private truncate(n: number): void {
    this.ids.length = n;
    this.lps.length = n;
    this.spans = this.spans.filter((s) => s.start < n).map((s) => ({ ...s, end: Math.min(s.end, n) }));
  }

  /** The prompt followed by every token sampled so far: the input of the next dispatch. */
  continuation(prompt: ArrayLike<number>): Int32Array {
    if (this.ids.length === 0 && prompt instanceof Int32Array) return prompt; // nothing sampled yet: the prompt itself, not a copy
    const out = new Int32Array(prompt.length + this.ids.length);
    for (let i = 0; i < prompt.length; i++) out[i] = prompt[i]!;
    out.set(this.ids, prompt.length);
    return out;
  }

  /** Output ids sampled so far. */
  outputIds(): Int32Array {
    return Int32Array.from(this.ids);
  }

  /** Logprobs of the output ids (NaN where an engine returned none). */
  logprobs(): Float32Array {
    return Float32Array.from(this.lps);
  }

  /** Weight-version spans covering the output ids, in order, adjacent equal versions merged. */
  weightVersions(): WeightVersionSpan[] {
    const out: WeightVersionSpan[] = [];
    for (const s of this.spans) {
      const last = out[out.length - 1];
      if (last && last.version === s.version && last.end === s.start) last.end = s.end;
      else out.push({ ...s });
    }
    return out;
  }
}
