// One trajectory — all turns of an episode — as ooze's actors pass it around, and the one API that
// appends to it while keeping tokens, loss mask, logprobs and weight-version spans aligned.
// Token-in, token-out: the sampled ids are stored exactly as the engine returned them.

/** Lifecycle of a sample. */
export type SampleStatus = "pending" | "completed" | "truncated" | "aborted" | "failed";

/** Response positions [start, end) generated under one weight version. */
export interface VersionSpan {
  start: number;
  end: number;
  version: string;
}

/** One trajectory. Arrays over the response have length `responseLength`. */
export interface Sample {
  /** Unique, increasing index of the sample in the job. */
  index: number;
  /** The prompt's group: samples of one prompt share it (advantages are computed per group). */
  groupIndex: number;
  /** The episode that produced it; fan-out episodes produce several samples with one rolloutId. */
  rolloutId: string;
  /** The prompt as the task gave it (text or structured), for logs and rewards. */
  prompt: unknown;
  /** Prompt ids followed by response ids. */
  tokens: Int32Array;
  responseLength: number;
  /** Over the response: 1 = sampled by the model (trained on), 0 = environment / tool tokens. */
  lossMask: Uint8Array;
  /** Over the response: the engine's logprob of each sampled token (0 where lossMask is 0). */
  rolloutLogprobs: Float32Array;
  reward: number | null;
  status: SampleStatus;
  /** Which weight version sampled which response positions (model tokens only). */
  weightVersions: VersionSpan[];
  metadata: Record<string, unknown>;
  /** The policy that sampled its model tokens and trains on them (jobs with several policies); absent: the job's one policy. */
  policy?: string;
}

/**
 * Builds a Sample turn by turn. `appendModel` and `appendEnv` are the only ways to add response
 * tokens, so the per-token arrays can never disagree in length.
 */
export class SampleBuilder {
  private ids: Int32Array;
  private mask: Uint8Array;
  private logprobs: Float32Array;
  private length: number;
  private readonly promptLength: number;
  private readonly spans: VersionSpan[] = [];

  constructor(
    readonly index: number,
    readonly groupIndex: number,
    readonly rolloutId: string,
    readonly prompt: unknown,
    promptIds: ArrayLike<number>,
    /** The policy whose turns these are (several policies per job); absent: the job's one policy. */
    readonly policy?: string,
  ) {
    const cap = Math.max(64, promptIds.length * 2);
    this.ids = new Int32Array(cap);
    this.ids.set(promptIds);
    this.mask = new Uint8Array(cap);
    this.logprobs = new Float32Array(cap);
    this.length = promptIds.length;
    this.promptLength = promptIds.length;
  }

  /** Every token so far (prompt + response): what the next /generate request sends. */
  get tokens(): Int32Array {
    return this.ids.subarray(0, this.length);
  }

  get responseLength(): number {
    return this.length - this.promptLength;
  }

  /** Number of response tokens sampled by the model (loss mask 1). */
  get modelTokens(): number {
    let n = 0;
    for (const s of this.spans) n += s.end - s.start;
    return n;
  }

  /** Appends tokens the model sampled, with their logprobs, under weight version `version`. */
  appendModel(ids: ArrayLike<number>, logprobs: ArrayLike<number>, version: string): void {
    if (ids.length !== logprobs.length)
      throw new RangeError(`appendModel: ${ids.length} ids but ${logprobs.length} logprobs`);
    if (ids.length === 0) return;
    const start = this.responseLength;
    this.push(ids, 1, logprobs);
    const last = this.spans[this.spans.length - 1];
    if (last && last.version === version && last.end === start) last.end = this.responseLength;
    else this.spans.push({ start, end: this.responseLength, version });
  }

  /** Appends environment / tool tokens: loss mask 0, logprob 0. */
  appendEnv(ids: ArrayLike<number>): void {
    this.push(ids, 0, null);
  }

  private push(ids: ArrayLike<number>, mask: 0 | 1, logprobs: ArrayLike<number> | null) {
    const need = this.length + ids.length;
    if (need > this.ids.length) {
      const cap = Math.max(need, this.ids.length * 2);
      this.ids = grow(this.ids, cap, Int32Array);
      this.mask = grow(this.mask, cap, Uint8Array);
      this.logprobs = grow(this.logprobs, cap, Float32Array);
    }
    for (let i = 0; i < ids.length; i++) {
      const p = this.length + i;
      this.ids[p] = ids[i]!;
      this.mask[p] = mask;
      this.logprobs[p] = logprobs ? logprobs[i]! : 0;
    }
    this.length = need;
  }

  /** The finished sample, with arrays of exact length (copies). */
  build(reward: number | null, status: SampleStatus, metadata: Record<string, unknown> = {}): Sample {
    const p = this.promptLength;
    return {
      index: this.index,
      groupIndex: this.groupIndex,
      rolloutId: this.rolloutId,
      prompt: this.prompt,
      tokens: this.ids.slice(0, this.length),
      responseLength: this.length - p,
      lossMask: this.mask.slice(p, this.length),
      rolloutLogprobs: this.logprobs.slice(p, this.length),
      reward,
      status,
      weightVersions: this.spans.map((s) => ({ ...s })),
      metadata,
      ...(this.policy !== undefined ? { policy: this.policy } : {}),
    };
  }
}

function grow<T extends Int32Array | Uint8Array | Float32Array>(
  a: T,
  cap: number,
  Ctor: { new (n: number): T },
): T {
  const b = new Ctor(cap);
  b.set(a);
  return b;
}

/** Checks a sample's invariants; returns what is wrong, or null. Used at the bus edge. */
export function sampleProblem(s: Sample): string | null {
  if (s.responseLength < 0 || s.responseLength > s.tokens.length) return "responseLength out of range";
  if (s.lossMask.length !== s.responseLength) return `lossMask has ${s.lossMask.length} entries, not ${s.responseLength}`;
  if (s.rolloutLogprobs.length !== s.responseLength)
    return `rolloutLogprobs has ${s.rolloutLogprobs.length} entries, not ${s.responseLength}`;
  let prev = 0;
  for (const span of s.weightVersions) {
    if (span.start < prev || span.end <= span.start || span.end > s.responseLength) return "weightVersions spans out of order";
    for (let i = span.start; i < span.end; i++) if (s.lossMask[i] !== 1) return `weightVersions span covers env token ${i}`;
    prev = span.end;
  }
  return null;
}

/** Oldest weight version that produced any of a sample's tokens (as a number), or null. */
export function oldestVersion(s: Sample): number | null {
  let v: number | null = null;
  for (const span of s.weightVersions) {
    const n = Number(span.version);
    if (Number.isFinite(n) && (v === null || n < v)) v = n;
  }
  return v;
}
