// One dispatch of a Fleet request to one engine: the call (plain with a progress deadline watched by
// the fleet's sweep, or streamed with an idle timeout), the sampled tokens appended to the request's
// PartialRollout as they come, and how it ended — finished, to be re-dispatched (the fleet cut it,
// or the engine aborted it), or an engine fault to be retried; and the sweep that abandons
// non-streamed dispatches past their progress deadline.
import { OozeError, TimeoutError } from "../../errors.ts";
import type { FinishReason } from "../backend.ts";
import { engineFaultKind, type GenerateRequest } from "../client.ts";
import { isJobVersion, versionAtLeast } from "./model.ts";
import type { ProgressDeadlines } from "./retry.ts";
import type { Attempt, Engine } from "./types.ts";
import type { PartialRollout } from "./partial.ts";

/** How a dispatch ended. */
export type DispatchOutcome = { done: FinishReason } | { retry: string } | { fault: string; error: OozeError };

/** What a dispatch asks of its fleet (one object per fleet, made once). */
export interface DispatchHost {
  closed(): boolean;
  /**
   * Engine `e` answered under an older weight version than its fleet wants (see staleVersion): it
   * restarted on its initial weights. Returns whether the fleet takes it as that (and brings the
   * engine back to its version); then the reply's tokens are dropped.
   */
  stale(e: Engine, why: string): boolean;
}

/**
 * What a dispatch needs of its fleet and request: plain fields, no closures (a rollout process
 * holds thousands of dispatches in flight).
 */
export interface DispatchContext {
  stream: boolean;
  deadlines: ProgressDeadlines;
  /** Deadlines this request already missed on a live engine. */
  missed: number;
  host: DispatchHost;
  /** The request's state: whether its caller aborted it. */
  request: { readonly userAborted: boolean };
  /** The request's progress callback (streamed dispatches). */
  onTokens?: ((outputIds: Int32Array, logprobs: Float32Array) => void) | undefined;
  /** The version the fleet's engines must serve when the dispatch began (its own, or the one it follows), or null. */
  wantedVersion: string | null;
}

/**
 * Why a reply under weight version `got` cannot be kept, or null when it can: it is older than (or
 * not comparable with) the version the fleet's engines must serve — or, for a fleet that neither
 * updates nor follows, than the one its engine served when the dispatch began (and the fleet has
 * not changed since) — so the engine restarted between two health checks and sampled with its
 * initial weights, which the tokens would be recorded as another version's.
 */
function staleVersion(e: Engine, attempt: Attempt, got: string | null, wanted: string | null): string | null {
  if (got === null || attempt.crossed) return null;
  const floor = wanted ?? (e.weightVersion === attempt.version ? attempt.version : null);
  if (floor === null || versionAtLeast(got, floor)) return null;
  // From a version that is none of the job's (SGLang's "default", before the job's first update) to
  // one of its numbered versions, an engine was updated, not restarted: nothing to drop.
  if (!isJobVersion(floor) && isJobVersion(got)) return null;
  return `${e.id} answered under weight version ${got}, not ${floor} (restarted on its initial weights?)`;
}

/** How long a graceful abort (/abort_request) may take before the dispatch is cut locally, ms. */
export const GRACEFUL_ABORT_MS = 3_000;

/** After an engine acknowledged the abort of a dispatch that missed its deadline, how long its reply may take, ms. */
const ABORT_REPLY_GRACE_MS = 1_000;

/** Thrown inside a dispatch to leave it with its outcome set (shares the stream path's cleanup). */
const DONE = Symbol("done");

/**
 * Runs one dispatch of `call` on `e` (a non-streamed call with its own cap, `timeoutMs`, beyond the
 * progress deadline; a streamed one's idle timeout is set here). Throws only what is not an engine
 * fault: ACTOR_STOPPED when the fleet closed, a request the engine rejected, a bug.
 */
export async function dispatch(e: Engine, attempt: Attempt, call: GenerateRequest, budget: number, acc: PartialRollout, ctx: DispatchContext): Promise<{ outcome: DispatchOutcome; cachedTokens: number }> {
  let outcome: DispatchOutcome | null = null;
  let cachedTokens = 0;
  let streamed = false;
  try {
    if (!ctx.stream) {
      const t0 = performance.now();
      attempt.watch = { start: t0, budget, missed: ctx.missed };
      const r = await e.gen.generate(call);
      const stale = staleVersion(e, attempt, r.meta.weightVersion, ctx.wantedVersion);
      if (stale !== null && ctx.host.stale(e, stale)) {
        // Its tokens came from other weights than the version they would be recorded under: dropped.
        outcome = { retry: stale };
        throw DONE;
      }
      if (r.finishReason.type !== "abort") ctx.deadlines.observe(performance.now() - t0);
      cachedTokens += r.meta.cachedTokens;
      streamed = true;
      // One version per dispatch; a dispatch that crossed an in_place update is recorded under
      // the older version (staleness is over-, never under-estimated).
      acc.update(r.outputIds, r.logprobs, attempt.crossed ? attempt.version : r.meta.weightVersion, true);
      outcome = { done: r.finishReason };
      throw DONE;
    }
    const gen = e.gen.generateStream({ ...call, timeoutMs: ctx.deadlines.streamIdleMs(ctx.missed) });
    for (;;) {
      const n = await gen.next();
      const stale = acc.attemptLength === 0 ? staleVersion(e, attempt, n.value.meta.weightVersion, ctx.wantedVersion) : null;
      if (stale !== null && ctx.host.stale(e, stale)) {
        await gen.return(undefined as never);
        return { outcome: { retry: stale }, cachedTokens };
      }
      if (!streamed) {
        cachedTokens += n.value.meta.cachedTokens;
        streamed = true;
      }
      const had = acc.length;
      acc.update(n.value.outputIds, n.value.logprobs, n.value.meta.weightVersion, n.done === true);
      if (ctx.onTokens && acc.length > had) ctx.onTokens(acc.outputIds(), acc.logprobs());
      if (n.done) return { outcome: { done: n.value.finishReason }, cachedTokens };
    }
  } catch (err) {
    if (err === DONE) return { outcome: outcome!, cachedTokens };
    const kind = engineFaultKind(err);
    if (ctx.host.closed()) throw new OozeError("ACTOR_STOPPED", `fleet closed while request ${call.rid ?? ""} was running`);
    if (attempt.expired !== null) return { outcome: { fault: "timeout", error: new TimeoutError(attempt.expired) }, cachedTokens };
    if (kind !== null && !ctx.request.userAborted) return { outcome: { fault: kind, error: err as OozeError }, cachedTokens };
    if (attempt.redispatch !== null) return { outcome: { retry: attempt.redispatch }, cachedTokens };
    if (ctx.request.userAborted) return { outcome: { done: { type: "abort", message: "Aborted by the caller (fleet.abort)" } }, cachedTokens };
    // An error event after the request was accepted: the engine failed it, not the request itself.
    if (err instanceof OozeError && err.code === "ENGINE_REJECTED" && streamed) return { outcome: { fault: "engine-error", error: err }, cachedTokens };
    throw err;
  }
}

/** Expires every non-streamed dispatch past its progress deadline (recomputed now: it tightens as durations are seen). */
export function sweepDeadlines(engines: Iterable<Engine>, deadlines: ProgressDeadlines, log: (line: string) => void): void {
  const now = performance.now();
  // No deadline is shorter than that of a dispatch with no budget that missed none. An engine's
  // attempts are in the order they started (added, then watched, in one synchronous run), so the
  // first one younger than that ends the engine's sweep: at 8,000 dispatches in flight a full walk
  // five times a second was 7 % of a rollout process (Nov 30).
  const floor = deadlines.dispatchMs(0, 0);
  for (const e of engines) {
    for (const a of e.attempts) {
      if (a.watch === null || a.expired !== null) continue;
      if (now - a.watch.start <= floor) break;
      const ms = deadlines.dispatchMs(a.watch.budget, a.watch.missed);
      if (now - a.watch.start > ms) expire(e, a, `no reply from ${e.id} within ${Math.round(ms)} ms (progress deadline)`, log);
    }
  }
}

/**
 * A dispatch missed its progress deadline: the engine is asked to abort it (a live engine answers
 * with the tokens sampled so far); the connection is cut ABORT_REPLY_GRACE_MS after the engine
 * acknowledged the abort without answering the dispatch, or GRACEFUL_ABORT_MS after the deadline.
 */
function expire(e: Engine, a: Attempt, why: string, log: (line: string) => void): void {
  if (a.ctl.signal.aborted || a.expired !== null || !e.attempts.has(a)) return;
  a.expired = why;
  log(`fleet: ${a.rid}: ${why}; aborting it on the engine`);
  if (a.cutTimer !== null) return; // a graceful cut is under way already
  a.cutTimer = setTimeout(() => a.ctl.abort(), GRACEFUL_ABORT_MS);
  e.ctl.abort({ rid: a.rid }).then(
    () => {
      if (!e.attempts.has(a) || a.ctl.signal.aborted) return;
      if (a.cutTimer) clearTimeout(a.cutTimer);
      a.cutTimer = setTimeout(() => a.ctl.abort(), ABORT_REPLY_GRACE_MS);
    },
    () => a.ctl.abort(),
  );
}
