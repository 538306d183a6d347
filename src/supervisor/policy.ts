// Restart policy of an OTP-style supervisor as pure logic: restart intensity (at most N restarts in
// a period of T ms), exponential backoff with jitter, and the restart-or-escalate decision taken
// from an error's code and `retryable` (never its message). The clock and the random source are
// injected so that the policy can be checked exactly (test/property/supervision*.test.ts).
import { OozeError, type ErrorCode } from "../errors.ts";

/** How a supervisor restarts its children. Mirrors the topology's `supervision` section. */
export interface SupervisionPolicy {
  /** one_for_one: restart only the child that crashed; one_for_all: restart every child. */
  strategy: "one_for_one" | "one_for_all";
  /** At most this many restarts within `periodMs`; one more crash escalates. */
  maxRestarts: number;
  periodMs: number;
  /** Backoff before restart n (1-based within the window): min(max, min * factor^(n-1)). */
  backoffMinMs: number;
  backoffMaxMs: number;
  backoffFactor: number;
  /** Fraction in [0, 1]: the delay is multiplied by a uniform factor in [1 - jitter, 1]. */
  jitter: number;
  /** Codes that escalate at once even when retryable (restarting cannot help). */
  escalateCodes: readonly ErrorCode[];
}

/** The policy used when a topology or spawn names none. */
export const DEFAULT_POLICY: SupervisionPolicy = {
  strategy: "one_for_one",
  maxRestarts: 5,
  periodMs: 10_000,
  backoffMinMs: 50,
  backoffMaxMs: 5_000,
  backoffFactor: 2,
  jitter: 0.2,
  escalateCodes: [],
};

/** Fills a partial policy with defaults and checks its ranges; throws CONFIG_INVALID naming the field. */
export function resolvePolicy(p: Partial<SupervisionPolicy> = {}): SupervisionPolicy {
  const r: SupervisionPolicy = { ...DEFAULT_POLICY, ...p };
  const bad = (field: string, want: string): never => {
    throw new OozeError(
      "CONFIG_INVALID",
      `supervision.${field} = ${JSON.stringify((r as unknown as Record<string, unknown>)[field])} is invalid: ${want}`,
    );
  };
  if (r.strategy !== "one_for_one" && r.strategy !== "one_for_all") bad("strategy", "use one_for_one or one_for_all");
  if (!Number.isInteger(r.maxRestarts) || r.maxRestarts < 0) bad("maxRestarts", "use an integer >= 0");
  if (!(r.periodMs > 0)) bad("periodMs", "use a number of milliseconds > 0");
  if (!(r.backoffMinMs >= 0)) bad("backoffMinMs", "use a number of milliseconds >= 0");
  if (!(r.backoffMaxMs >= r.backoffMinMs)) bad("backoffMaxMs", "use a value >= backoffMinMs");
  if (!(r.backoffFactor >= 1)) bad("backoffFactor", "use a factor >= 1");
  if (!(r.jitter >= 0 && r.jitter <= 1)) bad("jitter", "use a fraction between 0 and 1");
  return r;
}

/** What a supervisor does about one crash. */
export type Decision =
  | { kind: "restart"; delayMs: number; attempt: number }
  | { kind: "escalate"; reason: "intensity" | "non_retryable"; crashes: number };

/** Backoff before restart `attempt` (1-based), with `u` a uniform draw in [0, 1). */
export function backoffDelay(p: SupervisionPolicy, attempt: number, u: number): number {
  const base = Math.min(p.backoffMaxMs, p.backoffMinMs * Math.pow(p.backoffFactor, Math.max(0, attempt - 1)));
  return Math.max(0, base * (1 - p.jitter * u));
}

/** Whether an error may be cured by a restart: decided from `code` and `retryable` only. */
export function isRestartable(p: SupervisionPolicy, err: OozeError): boolean {
  return err.retryable && !p.escalateCodes.includes(err.code);
}

/** Sources of time and randomness; injectable for exact tests. */
export interface PolicyClock {
  now(): number;
  random(): number;
}

export const REAL_CLOCK: PolicyClock = { now: () => Date.now(), random: () => Math.random() };

/** Counts restarts in the sliding window and decides restart (with delay) or escalate. */
export class RestartTracker {
  readonly policy: SupervisionPolicy;
  private readonly clock: PolicyClock;
  private restarts: number[] = [];
  /** Crashes seen in total (restarted or not). */
  crashes = 0;

  constructor(policy: SupervisionPolicy, clock: PolicyClock = REAL_CLOCK) {
    this.policy = policy;
    this.clock = clock;
  }

  /** Restarts inside the current window. */
  get recentRestarts(): number {
    this.prune(this.clock.now());
    return this.restarts.length;
  }

  /** Records one crash and returns the decision. */
  onCrash(err: OozeError): Decision {
    this.crashes++;
    const t = this.clock.now();
    this.prune(t);
    if (!isRestartable(this.policy, err)) return { kind: "escalate", reason: "non_retryable", crashes: this.restarts.length + 1 };
    if (this.restarts.length >= this.policy.maxRestarts) {
      return { kind: "escalate", reason: "intensity", crashes: this.restarts.length + 1 };
    }
    this.restarts.push(t);
    const attempt = this.restarts.length;
    return { kind: "restart", delayMs: backoffDelay(this.policy, attempt, this.clock.random()), attempt };
  }

  /** Forgets the window (used when the supervisor itself is restarted). */
  reset(): void {
    this.restarts = [];
  }

  private prune(t: number): void {
    const from = t - this.policy.periodMs;
    while (this.restarts.length > 0 && (this.restarts[0] as number) <= from) this.restarts.shift();
  }
}

/** Turns anything a handler threw into an OozeError tagged with the actor; plain errors become ACTOR_CRASHED (retryable). */
export function crashError(e: unknown, actor: string): OozeError {
  if (e instanceof OozeError) {
    if (e.actor !== null) return e;
    return new OozeError(e.code, e.message, { retryable: e.retryable, cause: e, actor });
  }
  const msg = e instanceof Error ? e.message : String(e);
  return new OozeError("ACTOR_CRASHED", `actor '${actor}' threw: ${msg}`, { retryable: true, cause: e, actor });
}

/** The error a supervisor raises when it gives up on a child: says which actor, how many crashes, the last error. */
export function escalationError(
  supervisor: string,
  actor: string,
  d: Extract<Decision, { kind: "escalate" }>,
  p: SupervisionPolicy,
  last: OozeError,
): OozeError {
  const why =
    d.reason === "intensity"
      ? `crashed ${d.crashes} times within ${p.periodMs} ms (limit: ${p.maxRestarts} restarts)`
      : `failed with an error that a restart cannot fix (retryable: ${last.retryable})`;
  return new OozeError(
    "ACTOR_ESCALATED",
    `supervisor '${supervisor}' gave up on actor '${actor}': it ${why}; last error [${last.code}] ${last.message}. ` +
      `Fix the cause (see the actor's events) and start the job again.`,
    // A parent may retry the whole subtree after an intensity escalation, never after a permanent error.
    { retryable: d.reason === "intensity", cause: last, actor },
  );
}
