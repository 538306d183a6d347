// How the Fleet retries a dispatch that failed and abandons one that makes no progress: the
// progress deadline of a dispatch (fixed from max_new_tokens, tightened by the durations the fleet
// has seen, doubled for each deadline the request already missed), the jittered backoff before a
// retry on the same engine, and the count of engine faults the fleet recovered from.

/** The retry and deadline settings of a Fleet (see FleetOptions for each). */
export interface RetrySettings {
  progressTimeoutMs: number;
  progressTimeoutPerTokenMs: number;
  minProgressTimeoutMs: number;
  maxDispatchMs: number;
  maxStreamIdleMs: number;
  retryBaseMs: number;
  retryMaxMs: number;
  random: () => number;
}

/** Successful dispatches remembered for the adaptive deadline. */
const WINDOW = 64;
/** Successful dispatches seen before the deadline adapts. */
const MIN_SEEN = 8;
/** The adaptive deadline is this many times the slowest recent dispatch. */
const SLACK = 4;

/**
 * Progress deadlines. A non-streamed dispatch must answer within
 * `(progressTimeoutMs + progressTimeoutPerTokenMs × max_new_tokens) × 2^missed`, or, once the fleet
 * has seen MIN_SEEN dispatches succeed, within `max(minProgressTimeoutMs, SLACK × the slowest of the
 * last WINDOW) × 2^missed` when that is shorter, so a hung engine is noticed in seconds on a small
 * model and in minutes on a large one; `missed` is the number of deadlines this request already
 * missed while its engine was alive (it answered the abort sent at the deadline), so a slow engine is
 * given ever more time while a lost reply is abandoned as soon as the first time. Capped at maxDispatchMs. A streamed
 * dispatch may be silent for `progressTimeoutMs × 2^missed` between chunks, capped at maxStreamIdleMs.
 */
export class ProgressDeadlines {
  private readonly recent: number[] = [];
  private next = 0;
  private seen = 0;
  /**
   * The slowest of `recent`, kept as they change: the deadline sweep asks for every dispatch in
   * flight five times a second (at 8,000 in flight, taking the maximum each time was 15 % of a
   * rollout process's CPU, Nov 30).
   */
  private slowest = 0;

  constructor(private readonly s: RetrySettings) {}

  /** Records how long a dispatch that finished took, ms. */
  observe(ms: number): void {
    const dropped = this.recent.length < WINDOW ? -Infinity : this.recent[this.next]!;
    if (this.recent.length < WINDOW) this.recent.push(ms);
    else this.recent[this.next] = ms;
    this.next = (this.next + 1) % WINDOW;
    this.seen++;
    if (ms >= this.slowest) this.slowest = ms;
    else if (dropped >= this.slowest) this.slowest = Math.max(...this.recent);
  }

  /** Deadline of a non-streamed dispatch of `maxNew` tokens, ms. */
  dispatchMs(maxNew: number, missed: number): number {
    let base = this.s.progressTimeoutMs + this.s.progressTimeoutPerTokenMs * maxNew;
    if (this.seen >= MIN_SEEN) base = Math.min(base, Math.max(this.s.minProgressTimeoutMs, SLACK * this.slowest));
    return Math.min(this.s.maxDispatchMs, base * 2 ** Math.min(missed, 20));
  }

  /** Longest silence between two streamed chunks, ms. */
  streamIdleMs(missed: number): number {
    return Math.min(this.s.maxStreamIdleMs, this.s.progressTimeoutMs * 2 ** Math.min(missed, 20));
  }
}

/** Delay before retrying on the same engine after the `failures`-th failed dispatch, ms: exponential, jittered ×[0.5, 1.5). */
export function backoffMs(s: RetrySettings, failures: number): number {
  return Math.min(s.retryMaxMs, s.retryBaseMs * 2 ** Math.max(0, Math.min(failures - 1, 20))) * (0.5 + s.random());
}

/** Engine faults a Fleet met, by kind (see engineFaultKind), and what became of the requests. */
export interface FaultStats {
  /** Failed dispatches by fault kind (e.g. {"http-503": 9, timeout: 2}). */
  faults: Record<string, number>;
  /** Failed dispatches that were retried. */
  retried: number;
  /** Requests that failed because their retries ran out. */
  exhausted: number;
}

/** Counts engine faults; `take()` returns them and starts again. */
export class FaultCounter {
  private stats: FaultStats = { faults: {}, retried: 0, exhausted: 0 };

  record(kind: string, retried: boolean): void {
    this.stats.faults[kind] = (this.stats.faults[kind] ?? 0) + 1;
    if (retried) this.stats.retried++;
    else this.stats.exhausted++;
  }

  /** The counts so far. */
  peek(): FaultStats {
    return { faults: { ...this.stats.faults }, retried: this.stats.retried, exhausted: this.stats.exhausted };
  }

  /** The counts since the last take. */
  take(): FaultStats {
    const s = this.stats;
    this.stats = { faults: {}, retried: 0, exhausted: 0 };
    return s;
  }
}

/** "http-503 ×9, timeout ×2" (or "none"). */
export function faultSummary(faults: Record<string, number>): string {
  const parts = Object.entries(faults)
    .sort((a, b) => b[1] - a[1])
    .map(([k, n]) => `${k} ×${n}`);
  return parts.length > 0 ? parts.join(", ") : "none";
}
