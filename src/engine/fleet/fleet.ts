// The fleet: an elastic set of SGLang-compatible engines (embedded or external) behind one router.
// Engines are attached and detached at any time, health-checked, dropped from routing when they fail
// and taken back when they recover. generate() is token-in/token-out with partial rollout: when an
// engine aborts a request (weight update, /abort_request), dies, or leaves the fleet mid-request, the
// tokens and logprobs sampled so far are kept and the rest is generated elsewhere with the remaining
// budget, one weight-version span per run of tokens. A dispatch that fails (error status, lost or
// malformed reply) or misses its progress deadline is retried, elsewhere where there is another
// engine (dispatch.ts, retry.ts). updateWeights() walks every engine through
// pause → update_weights_from_disk → continue; versions only increase. With a bus, the set of engines
// lives in the job's KV bucket so a new fleet recovers it.
import { randomUUID } from "node:crypto";
import { OozeError, TimeoutError } from "../../errors.ts";
import type { FinishReason } from "../backend.ts";
import { EngineClient, type GenerateRequest } from "../client.ts";
import { limitsOfEngine, sendableMaxNewTokens, type LengthLimits } from "../limits.ts";
import { updateEngine, type WeightUpdateOptions, type WeightUpdateReport } from "./weights.ts";
import { dispatch, GRACEFUL_ABORT_MS, sweepDeadlines, type DispatchContext, type DispatchHost, type DispatchOutcome } from "./dispatch.ts";
import { ExternalRouter } from "./external.ts";
import { compareVersions, expectedSignature, modelSignature, signatureDiff, versionAtLeast, type ModelSignature } from "./model.ts";
import { FleetRegistry, type EngineSource } from "./registry.ts";
import { backoffMs, FaultCounter, faultSummary, ProgressDeadlines, type FaultStats, type RetrySettings } from "./retry.ts";
import { PartialRollout } from "./partial.ts";
import type { WireSamplingParams } from "../protocol.ts";
import { Router } from "./router.ts";

export type { EngineSource } from "./registry.ts";
export type { FaultStats } from "./retry.ts";
export type { WeightUpdateOptions, WeightUpdateReport } from "./weights.ts";
export { faultSummary } from "./retry.ts";
export type { WeightVersionSpan } from "./partial.ts";
export type { EngineEntry, FleetGenerateRequest, FleetGenerateResult, FleetOptions } from "./types.ts";
export { normalizeEngineUrl } from "./types.ts";
import {
  normalizeEngineUrl,
  type Attempt,
  type Engine,
  type EngineEntry,
  type FleetGenerateRequest,
  type FleetGenerateResult,
  type FleetOptions,
  type ReqState,
} from "./types.ts";

const errText = (e: unknown) => (e instanceof Error ? e.message : String(e));

/**
 * The progress-deadline sweep over in-flight non-streamed dispatches runs every fifth of the shortest
 * deadline a dispatch may have (so one is noticed at most a fifth of its length late), within these
 * bounds, ms. It ran every 200 ms whatever the deadlines: a sweep visits every engine of the fleet,
 * and at 256 engines with turns lasting tens of seconds (deadlines of minutes) that was ~1 % of a
 * rollout process's time for nothing (Dec 2, docs/experiments/scale.md).
 */
const SWEEP_MIN_MS = 200;
const SWEEP_MAX_MS = 10_000;

/** A request's listener on its caller's signal (outside generate(), so that it closes over the fleet and the id alone). */
const abortListener = (fleet: Fleet, rid: string) => () => void fleet.abort(rid);

/** A request's result, from its tokens and what its dispatches recorded. */
function finished(acc: PartialRollout, res: { engine: string; cachedTokens: number; redispatches: number; faults: string[] }, finishReason: FinishReason): FleetGenerateResult {
  return {
    outputIds: acc.outputIds(),
    logprobs: acc.logprobs(),
    finishReason,
    status: finishReason.type === "stop" ? "completed" : finishReason.type === "length" ? "truncated" : "aborted",
    weightVersions: acc.weightVersions(),
    engine: res.engine,
    cachedTokens: res.cachedTokens,
    redispatches: res.redispatches,
    faults: res.faults,
  };
}

/** Occurrences of each string. */
const countOf = (xs: readonly string[]): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const x of xs) out[x] = (out[x] ?? 0) + 1;
  return out;
};

/** An elastic set of engines with health checks, partial-rollout re-dispatch and weight updates. */
export class Fleet {
  private readonly router: Router;
  private readonly engines = new Map<string, Engine>();
  private readonly requests = new Map<string, ReqState>();
  private readonly waiters = new Set<() => void>();
  /** Requests in a backoff: woken by their own abort or the fleet's close, not by every change. */
  private readonly sleepers = new Set<() => void>();
  private readonly healthIntervalMs: number;
  private readonly healthTimeoutMs: number;
  private readonly controlTimeoutMs: number;
  private readonly unhealthyAfter: number;
  private readonly requestTimeoutMs: number;
  /** lengthLimits()'s answer; undefined: to be worked out. */
  private limitsCache: LengthLimits | null | undefined = undefined;
  private readonly streamIdleTimeoutMs: number;
  private readonly generateTimeoutMs: number;
  private readonly stream: boolean;
  private readonly maxRedispatches: number;
  private readonly maxRetries: number;
  private readonly leaveAfterFailures: number;
  private readonly settings: RetrySettings;
  private readonly deadlines: ProgressDeadlines;
  private readonly faultCounter = new FaultCounter();
  private readonly log: (line: string) => void;
  private readonly registry: Promise<FleetRegistry> | null;
  private readonly external: ExternalRouter | null;
  private reference: ModelSignature | null;
  private current: { version: string; modelDir: string } | null = null;
  /** The version another fleet brings the engines to (followVersion): engines join routing only at it or later. */
  private followed: string | null = null;
  private updating: Promise<void> | null = null;
  private lockChain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | null = null;
  private sweepTimer: NodeJS.Timeout;
  /** What every dispatch asks of this fleet (made once, not per dispatch). */
  private readonly dispatchHost: DispatchHost = {
    closed: () => this.closed,
    stale: (e, why) => this.restartedStale(e, why),
  };
  private closed = false;

  constructor(opts: FleetOptions = {}) {
    this.router = new Router({ policy: opts.routing ?? "cache_aware" });
    this.healthIntervalMs = opts.healthIntervalMs ?? 5000;
    this.healthTimeoutMs = opts.healthTimeoutMs ?? 30_000;
    this.controlTimeoutMs = opts.controlTimeoutMs ?? 30_000;
    this.unhealthyAfter = Math.max(1, opts.unhealthyAfter ?? 3);
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 300_000;
    this.streamIdleTimeoutMs = opts.streamIdleTimeoutMs ?? 120_000;
    this.generateTimeoutMs = opts.generateTimeoutMs ?? 600_000;
    this.stream = opts.stream ?? false;
    this.maxRedispatches = opts.maxRedispatches ?? 32;
    this.maxRetries = opts.maxRetries ?? 10;
    this.leaveAfterFailures = Math.max(1, opts.leaveAfterFailures ?? 5);
    const progressTimeoutMs = opts.progressTimeoutMs ?? 10_000;
    this.settings = {
      progressTimeoutMs,
      progressTimeoutPerTokenMs: opts.progressTimeoutPerTokenMs ?? 50,
      minProgressTimeoutMs: Math.min(progressTimeoutMs, opts.minProgressTimeoutMs ?? 1_000),
      maxDispatchMs: this.generateTimeoutMs,
      maxStreamIdleMs: this.streamIdleTimeoutMs,
      retryBaseMs: opts.retryBaseMs ?? 200,
      retryMaxMs: opts.retryMaxMs ?? 5_000,
      random: opts.random ?? Math.random,
    };
    this.deadlines = new ProgressDeadlines(this.settings);
    this.log = opts.log ?? (() => {});
    this.reference = opts.expectModel ? expectedSignature(opts.expectModel) : null;
    this.external = opts.externalRouter ? new ExternalRouter(opts.externalRouter) : null;
    if (opts.bus && opts.job === undefined) throw new OozeError("CONFIG_INVALID", "Fleet: a bus needs a job id (opts.job) to name its KV bucket");
    this.registry = opts.bus && opts.job !== undefined ? FleetRegistry.open(opts.bus, opts.job) : null;
    this.registry?.catch(() => {}); // reported where it is awaited
    this.sweepTimer = this.nextSweep();
    if (this.healthIntervalMs > 0) {
      this.timer = setInterval(() => this.healthTick(), this.healthIntervalMs);
      this.timer.unref();
    }
  }

  /** Creates a fleet and, with a bus, recovers its engines and weight version from the job's KV bucket. */
  static async open(opts: FleetOptions = {}): Promise<Fleet> {
    const f = new Fleet(opts);
    try {
      await f.recover();
    } catch (e) {
      await f.close();
      throw e;
    }
    return f;
  }

  /**
   * Re-attaches every engine in the KV registry (no-op without a bus). Engines that cannot be
   * reached now stay registered, out of routing, and join when a health check passes.
   */
  async recover(): Promise<EngineEntry[]> {
    if (!this.registry) return this.list();
    const reg = await this.registry;
    const v = await reg.version();
    if (v && (!this.current || compareVersions(v.version, this.current.version) > 0)) this.current = v;
    for (const r of await reg.entries()) {
      const url = normalizeEngineUrl(r.url);
      if (this.engines.has(url)) continue;
      const e = this.newEngine(url, r.source, r.attachedAt);
      this.engines.set(url, e);
      this.limitsCache = undefined;
      try {
        await this.join(e, true);
      } catch (err) {
        e.lastError = errText(err);
        this.log(`fleet: recovered ${url} but it is not in routing yet: ${e.lastError}`);
      }
    }
    return this.list();
  }

  /**
   * For a fleet that only routes while another (the job's fleet actor) updates the engines: from now
   * on an engine joins this fleet's routing only once it serves `version` or a later one. An engine
   * that restarted on its initial weights is kept out until the updating fleet brought it up to date
   * (health checks retry the join), so no token of weights older than the job's is sampled here.
   * Engines already in routing are not affected (their updates pause and resume them).
   */
  followVersion(version: string): void {
    if (this.followed === null || !versionAtLeast(this.followed, version)) this.followed = version;
  }

  /** The weight version last applied by updateWeights (or recovered), or null. */
  get weightVersion(): string | null {
    return this.current?.version ?? null;
  }

  /**
   * Attaches an engine: discovers it via /model_info and /server_info, refuses one serving a
   * different model (ENGINE_MISMATCH naming what differs; `expectModel: null` skips the check),
   * brings it to the fleet's weight version, adds it to routing and the registry. Attaching an
   * attached URL returns its entry. With `allowUnreachable`, an engine that cannot be reached yet is
   * registered anyway (out of routing) and joins when a health check passes.
   */
  async attach(
    url: string,
    opts: { source?: EngineSource; expectModel?: Record<string, unknown> | null; allowUnreachable?: boolean } = {},
  ): Promise<EngineEntry> {
    this.assertOpen();
    const id = normalizeEngineUrl(url);
    const have = this.engines.get(id);
    if (have) {
      if (have.draining) {
        have.draining = false;
        this.log(`fleet: ${id} attached again while draining: it stays`);
      }
      if (!have.healthy) await this.join(have, true).catch(() => {});
      return this.entryOf(have);
    }
    const e = this.newEngine(id, opts.source ?? "runtime", Date.now());
    e.expect = opts.expectModel;
    this.engines.set(id, e);
    this.limitsCache = undefined;
    try {
      await this.join(e, true);
    } catch (err) {
      const unreachable = err instanceof OozeError && (err.code === "ENGINE_UNAVAILABLE" || err.code === "TIMEOUT");
      if (!(opts.allowUnreachable && unreachable)) {
        e.detached = true;
        this.engines.delete(id);
        this.limitsCache = undefined;
        throw err;
      }
    }
    if (this.registry) await (await this.registry).put({ url: id, source: e.source, attachedAt: e.attachedAt });
    this.log(`fleet: attached ${id} (${e.source}, weight version ${e.weightVersion ?? "unknown"})`);
    return this.entryOf(e);
  }

  /** Detaches an engine: it leaves routing and the registry; its in-flight requests are re-dispatched. */
  async detach(url: string): Promise<void> {
    const id = normalizeEngineUrl(url);
    const e = this.engines.get(id);
    if (!e) {
      throw new OozeError("ACTOR_NOT_FOUND", `fleet: engine ${id} is not attached (attached: ${[...this.engines.keys()].join(", ") || "none"})`);
    }
    e.detached = true;
    this.engines.delete(id);
    this.limitsCache = undefined;
    this.leave(e, "detached from the fleet", true);
    if (this.registry) await (await this.registry).remove(id);
    if (this.external) await this.external.remove(id).catch((err) => this.log(`fleet: ${errText(err)}`));
    this.log(`fleet: detached ${id}`);
  }

  /**
   * Takes an engine out of routing without cutting its requests in flight: no new dispatch goes to
   * it, and it is detached once the ones running there end (at once when none are). attach() before
   * then keeps it. For handing an engine over to another router (a rollout instance's share moving
   * to another instance): detach() would re-dispatch every request on it.
   */
  drain(url: string): void {
    const id = normalizeEngineUrl(url);
    const e = this.engines.get(id);
    if (!e) throw new OozeError("ACTOR_NOT_FOUND", `fleet: engine ${id} is not attached`);
    if (e.draining) return;
    e.draining = true;
    if (e.healthy) {
      e.healthy = false;
      this.router.removeEngine(e.id);
    }
    this.detachDrained(e);
  }

  /** Detaches a draining engine with nothing left in flight. */
  private detachDrained(e: Engine): void {
    if (!e.draining || e.attempts.size > 0 || e.detached || this.engines.get(e.id) !== e) return;
    void this.detach(e.id).catch((err) => this.log(`fleet: ${errText(err)}`));
  }

  /** Every attached engine. */
  list(): EngineEntry[] {
    return [...this.engines.values()].map((e) => this.entryOf(e));
  }

  /** Aborts a request by rid: it ends as aborted with the tokens sampled so far, never re-dispatched. */
  abort(rid: string): boolean {
    const st = this.requests.get(rid);
    if (!st) return false;
    st.userAborted = true;
    const a = st.attempt;
    if (a) {
      const e = this.engineOf(a);
      // Asked to abort, the engine ends the request itself (a stream with its last chunk); the
      // connection is cut only if it does not within GRACEFUL_ABORT_MS.
      if (e) this.cutGracefully(e, a);
      else a.ctl.abort();
    }
    st.wake?.(); // only this request's wait ends (waking every waiter per abort was O(waiting) each)
    return true;
  }

  /** Forgets a session's engine affinity (call when an episode ends). */
  endSession(sessionId: string): void {
    this.router.endSession(sessionId);
  }

  /**
   * The tightest length limits of the attached engines that report theirs (src/engine/limits.ts),
   * or null when none does: a caller that sizes its requests to them is never refused for length.
   */
  lengthLimits(): LengthLimits | null {
    // Asked before every turn of every episode: worked out again only when an engine came, went or
    // reported its limits (a pass over a thousand engines a turn showed in the controller's profile).
    if (this.limitsCache === undefined) {
      const known = [...this.engines.values()].flatMap((e) => (e.limits ? [e.limits] : []));
      this.limitsCache = known.length === 0 ? null : { contextLength: Math.min(...known.map((l) => l.contextLength)), maxReqInputLen: Math.min(...known.map((l) => l.maxReqInputLen)) };
    }
    return this.limitsCache;
  }

  /** Tokens a running request has sampled so far (over all its dispatches), or null when it is not running. */
  progress(rid: string): number | null {
    return this.requests.get(rid)?.acc.length ?? null;
  }

  /**
   * Generates with partial rollout: an engine that aborts the request (weight update, /abort_request),
   * dies, or leaves the fleet keeps nothing from it — the fleet keeps the sampled ids and logprobs and
   * sends prompt + sampled ids to a healthy engine with the remaining budget, waiting for one up to
   * requestTimeoutMs. A dispatch that fails (an error status, a lost or malformed reply) or misses its
   * progress deadline is retried with the same sampling params (seed included) from the tokens
   * already held, on another engine where there is one and after a jittered backoff otherwise; a
   * lost non-streamed reply held no tokens the fleet knows of, so none is recorded twice. Fails with
   * ENGINE_UNAVAILABLE naming the faults when retries or re-dispatches run out or no engine comes,
   * and with ENGINE_REJECTED when an engine refuses the request itself. Each dispatch asks for no
   * more than its engine's context leaves (src/engine/limits.ts), so an engine that reports its
   * limits refuses none for length: a generation ends `length` where the context does, and one
   * whose input leaves no room at all is not sent (ENGINE_REJECTED, naming the lengths).
   */
  async generate(req: FleetGenerateRequest): Promise<FleetGenerateResult> {
    this.assertOpen();
    const maxNew = req.sampling.max_new_tokens;
    if (typeof maxNew !== "number" || !Number.isInteger(maxNew) || maxNew < 0) {
      throw new OozeError("CONFIG_INVALID", `fleet.generate: sampling.max_new_tokens must be a non-negative integer (got ${String(maxNew)}); the fleet needs a budget to share across re-dispatches`);
    }
    if (req.sampling.n !== undefined && req.sampling.n !== null && req.sampling.n !== 1) {
      throw new OozeError("CONFIG_INVALID", `fleet.generate: sampling.n must be 1 (got ${String(req.sampling.n)}); send one request per sample`);
    }
    if (req.inputIds.length === 0) throw new OozeError("CONFIG_INVALID", "fleet.generate: inputIds is empty");
    const rid = req.rid ?? randomUUID().replace(/-/g, "");
    if (this.requests.has(rid)) throw new OozeError("CONFIG_INVALID", `fleet.generate: request id '${rid}' is already in flight`);
    const acc = new PartialRollout();
    const st: ReqState = { userAborted: false, attempt: null, acc, wake: null };
    this.requests.set(rid, st);
    // (no closure over this call's variables: one would keep them in a context object of their own,
    // beside the suspended frame, for every request in flight)
    const onSignal = req.signal ? abortListener(this, rid) : null;
    if (req.signal?.aborted) st.userAborted = true;
    if (onSignal) req.signal!.addEventListener("abort", onSignal, { once: true });
    const deadline = Date.now() + this.requestTimeoutMs;
    const minNew = typeof req.sampling.min_new_tokens === "number" ? req.sampling.min_new_tokens : 0;
    /** The result so far: engine, tokens cached, re-dispatches and failed dispatches (the retry budget). */
    const res = { engine: "", cachedTokens: 0, redispatches: 0, faults: [] as string[] };
    let dispatched = false;
    /** Deadlines a live engine missed. */
    let missed = 0;
    let avoid: string | null = null;
    try {
      for (;;) {
        if (st.userAborted) return finished(acc, res, { type: "abort", message: "Aborted by the caller (fleet.abort)" });
        if (dispatched && acc.length >= maxNew) return finished(acc, res, { type: "length", length: acc.length });
        const input = acc.continuation(req.inputIds);
        const e = await this.acquire(input, req.sessionId, st, deadline, rid, avoid);
        if (!e) continue;
        // Sized to the engine's context (limits.ts): it would refuse a longer request, not cut it.
        const room = e.limits ? sendableMaxNewTokens(e.limits, input.length) : Infinity;
        if (room === 0) {
          this.router.release(e.id);
          // A resume whose tokens filled the context ends there, as the whole generation would have.
          if (acc.length > 0) return finished(acc, res, { type: "length", length: acc.length });
          throw new OozeError(
            "ENGINE_REJECTED",
            `fleet: request ${rid} was not sent: its input of ${input.length} tokens leaves no room in the context of ${e.id} ` +
              `(${e.limits!.contextLength} tokens; inputs below ${e.limits!.maxReqInputLen} tokens are served); shorten the input`,
          );
        }
        const attempt: Attempt = {
          rid: res.redispatches === 0 ? rid : `${rid}.${res.redispatches}`,
          engine: e.id,
          ctl: new AbortController(),
          redispatch: null,
          epoch: e.epoch,
          version: e.weightVersion,
          crossed: false,
          cutTimer: null,
          expired: null,
          watch: null,
          stream: req.stream ?? this.stream,
        };
        e.attempts.add(attempt);
        st.attempt = attempt;
        acc.beginAttempt();
        dispatched = true;
        res.engine = e.id;
        let outcome: DispatchOutcome;
        try {
          const budget = Math.min(maxNew - acc.length, room);
          const sampling: WireSamplingParams = { ...req.sampling, max_new_tokens: budget };
          if (minNew > 0) sampling.min_new_tokens = Math.min(budget, Math.max(0, minNew - acc.length));
          const call: GenerateRequest = {
            inputIds: input,
            sampling,
            returnLogprob: true,
            rid: attempt.rid,
            // a non-streamed call's cap, beyond its progress deadline
            timeoutMs: this.generateTimeoutMs + GRACEFUL_ABORT_MS,
            signal: attempt.ctl.signal,
          };
          if (req.sessionId !== undefined) call.routingKey = req.sessionId;
          if (req.lora) call.lora = req.lora;
          const ctx: DispatchContext = {
            stream: attempt.stream,
            onTokens: req.onTokens,
            deadlines: this.deadlines,
            missed,
            host: this.dispatchHost,
            request: st,
            wantedVersion: this.wantedVersion,
          };
          const d = await dispatch(e, attempt, call, budget, acc, ctx);
          outcome = d.outcome;
          res.cachedTokens += d.cachedTokens;
        } finally {
          if (attempt.cutTimer) clearTimeout(attempt.cutTimer);
          e.attempts.delete(attempt);
          st.attempt = null;
          if (attempt.epoch === e.epoch && e.healthy) this.router.release(e.id);
          if (e.draining) this.detachDrained(e);
        }
        if ("done" in outcome) {
          e.answeredAt = performance.now();
          const f = outcome.done;
          if (f.type !== "abort" || st.userAborted || this.closed) {
            e.dispatchFailures = 0;
            if (f.type === "length") return finished(acc, res, { type: "length", length: acc.length });
            return finished(acc, res, f);
          }
          if (attempt.expired !== null) {
            // The engine answered the abort sent at the deadline: it is alive but slow (its tokens are
            // kept), so this request's next deadline is doubled. A reply that never came doubles nothing.
            missed++;
            outcome = acc.attemptLength > 0 ? { retry: attempt.expired } : { fault: "timeout", error: new TimeoutError(attempt.expired) };
          } else outcome = { retry: `${e.id} aborted the request: ${f.message}` };
        }
        if (this.closed) throw new OozeError("ACTOR_STOPPED", `fleet closed while request ${rid} was running`);
        let why: string;
        let wait = 0;
        if ("fault" in outcome) {
          res.faults.push(outcome.fault);
          // A limit of this process's (out of file descriptors) says nothing of the engine: it stays
          // in routing, and the request waits a backoff instead of moving on (every engine would fail
          // the same way; taking them out one by one piled the load on the last, at 1,024 engines).
          const local = outcome.fault === "local-limit";
          if (!local) this.noteFailure(e, outcome.fault, outcome.error);
          if (res.faults.length > this.maxRetries) {
            this.faultCounter.record(outcome.fault, false);
            throw new OozeError(
              "ENGINE_UNAVAILABLE",
              `fleet: request ${rid} failed ${res.faults.length} dispatches (${faultSummary(countOf(res.faults))}), retries exhausted (maxRetries ${this.maxRetries}); last: ${outcome.error.message}`,
              { retryable: true, cause: outcome.error },
            );
          }
          this.faultCounter.record(outcome.fault, true);
          why = `${outcome.fault}: ${outcome.error.message}`;
          avoid = local ? null : e.id;
          // The first failures move on to the other engines at once; once this request has failed
          // as many times as there are other engines (every one tried: all faulty or unreachable,
          // e.g. a partition), each retry waits a backoff — without it a brief outage of every
          // engine spent the whole retry budget in milliseconds (found by test/property/fleet-schedules).
          const others = this.othersInRouting(e.id);
          wait = local ? backoffMs(this.settings, res.faults.length) : res.faults.length > others ? backoffMs(this.settings, res.faults.length - others) : 0;
        } else {
          why = outcome.retry;
          avoid = null;
        }
        res.redispatches++;
        if (res.redispatches > this.maxRedispatches) {
          throw new OozeError("ENGINE_UNAVAILABLE", `fleet: request ${rid} was re-dispatched ${this.maxRedispatches} times (${acc.length} tokens sampled); last reason: ${why}`, {
            retryable: true,
          });
        }
        this.log(`fleet: re-dispatching ${rid} after ${acc.length} tokens (${why})${wait > 0 ? ` after a backoff of ${Math.round(wait)} ms` : ""}`);
        if (wait > 0) await this.backoff(wait, st);
      }
    } finally {
      if (onSignal) req.signal!.removeEventListener("abort", onSignal);
      this.requests.delete(rid);
    }
  }

  /** Engine faults met since the last call, by kind, with the count retried and exhausted. */
  takeFaultStats(): FaultStats {
    return this.faultCounter.take();
  }

  /**
   * Loads new weights on every engine in routing: pause_generation(mode) → update_weights_from_disk
   * (model_path, weight_version) → continue_generation, then checks /get_weight_version. New requests
   * and re-dispatches wait until it is done. A version not above the current one is refused
   * (CONFIG_INVALID). Engines that fail leave routing and are updated when they rejoin; when no
   * engine took the update, it throws and the version is not recorded. With opts.loadFormat (e.g. a
   * delta file), an engine that refuses it loads opts.fullModelDir instead (reported in fullFallbacks).
   */
  async updateWeights(modelDir: string, version: string, opts: WeightUpdateOptions = {}): Promise<WeightUpdateReport> {
    this.assertOpen();
    const mode = opts.mode ?? "abort";
    const plain = opts.loadFormat === undefined || opts.loadFormat === "auto" || opts.loadFormat === "safetensors";
    if (!plain && opts.fullModelDir === undefined)
      throw new OozeError("CONFIG_INVALID", `fleet: a '${opts.loadFormat}' weight update needs fullModelDir (the same version as a model directory) for engines that refuse it or join later`);
    const load = opts.loadFormat === undefined ? null : { format: opts.loadFormat, fullModelDir: opts.fullModelDir ?? modelDir };
    const report: WeightUpdateReport = { version, fullFallbacks: [] };
    await this.locked(async () => {
      if (this.current && compareVersions(version, this.current.version) <= 0) {
        throw new OozeError("CONFIG_INVALID", `fleet: weight version '${version}' is not above the current '${this.current.version}'; versions only increase`);
      }
      let open!: () => void;
      this.updating = new Promise<void>((r) => (open = r));
      try {
        const targets = [...this.engines.values()].filter((e) => e.healthy);
        const results = await Promise.allSettled(targets.map((e) => updateEngine(e, modelDir, version, mode, this.log, load, report.fullFallbacks, opts.flushCache ?? true)));
        const failed = targets.map((e, i) => ({ e, r: results[i]! })).filter((x) => x.r.status === "rejected");
        const why = failed.map((x) => `${x.e.id}: ${errText((x.r as PromiseRejectedResult).reason)}`);
        if (targets.length > 0 && failed.length === targets.length) {
          // An engine that refused the update keeps serving its old weights; one that failed otherwise leaves.
          for (const x of failed) {
            const reason = (x.r as PromiseRejectedResult).reason as unknown;
            if (!(reason instanceof OozeError && reason.code === "ENGINE_REJECTED")) this.leave(x.e, "weight update failed", true);
          }
          throw new OozeError("ENGINE_REJECTED", `fleet: no engine took weight version '${version}' from ${modelDir}: ${why.join("; ")}`);
        }
        for (const x of failed) {
          x.e.lastError = `weight update to '${version}' failed: ${errText((x.r as PromiseRejectedResult).reason)}`;
          this.leave(x.e, "weight update failed; it rejoins with the new weights when healthy", true);
        }
        this.current = { version, modelDir: load ? load.fullModelDir : modelDir };
        if (this.registry) await (await this.registry).putVersion(this.current);
        this.log(`fleet: weight version ${version} on ${targets.length - failed.length}/${targets.length} engines${why.length ? ` (failed: ${why.join("; ")})` : ""}`);
      } finally {
        this.updating = null;
        open();
        this.notify();
      }
    });
    return report;
  }

  /** Engines in routing besides `id`. */
  private othersInRouting(id: string): number {
    return this.router.size - (this.router.has(id) ? 1 : 0);
  }

  /** Arms the next progress-deadline sweep (see SWEEP_MIN_MS), which arms the one after it. */
  private nextSweep(): NodeJS.Timeout {
    const every = Math.min(SWEEP_MAX_MS, Math.max(SWEEP_MIN_MS, this.deadlines.dispatchMs(0, 0) / 5));
    const t = setTimeout(() => {
      if (this.closed) return;
      sweepDeadlines(this.engines.values(), this.deadlines, this.log);
      this.sweepTimer = this.nextSweep();
    }, every);
    t.unref();
    return t;
  }

  /** Stops health checks; running requests fail with ACTOR_STOPPED. The registry is kept for recovery. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    clearTimeout(this.sweepTimer);
    for (const e of this.engines.values()) for (const a of e.attempts) a.ctl.abort();
    this.notify();
    for (const w of [...this.sleepers]) w();
  }

  // ---------------------------------------------------------------------------------------------

  private assertOpen(): void {
    if (this.closed) throw new OozeError("ACTOR_STOPPED", "fleet: closed");
  }

  private newEngine(id: string, source: EngineSource, attachedAt: number): Engine {
    return {
      id,
      url: id,
      source,
      attachedAt,
      gen: new EngineClient(id, { retries: 0, streamIdleTimeoutMs: this.streamIdleTimeoutMs }),
      ctl: new EngineClient(id, { retries: 2, timeoutMs: this.controlTimeoutMs, priority: true }),
      probe: new EngineClient(id, { retries: 0, timeoutMs: this.healthTimeoutMs, priority: true }),
      healthy: false,
      detached: false,
      draining: false,
      model: null,
      limits: null,
      weightVersion: null,
      lastError: null,
      failures: 0,
      dispatchFailures: 0,
      answeredAt: -1,
      checkedAt: -1,
      checking: false,
      joining: null,
      attempts: new Set(),
      epoch: 0,
      expect: undefined,
    };
  }

  private entryOf(e: Engine): EngineEntry {
    return {
      id: e.id,
      url: e.url,
      healthy: e.healthy,
      draining: e.draining,
      inFlight: e.attempts.size,
      weightVersion: e.weightVersion,
      source: e.source,
      lastError: e.lastError,
      attachedAt: e.attachedAt,
      model: e.model,
    };
  }

  private notify(): void {
    for (const w of [...this.waiters]) w();
  }

  /** Waits for a change (a join, the end of an update, close), `st`'s abort, or `ms`. */
  private changed(ms: number, st: ReqState | null = null): Promise<void> {
    return this.sleep(ms, st, this.waiters);
  }

  /**
   * Waits `ms`, ending early at `st`'s abort or when one of `wakers` is called: `waiters` (any
   * change, notify) or `sleepers` (only the fleet's close). A backoff waits for no change: at 8,000
   * requests in flight, every engine that joined or left woke each waiting request, thousands of
   * timers and promises at once (Nov 30).
   */
  private sleep(ms: number, st: ReqState | null, wakers: Set<() => void>): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        wakers.delete(done);
        if (st !== null && st.wake === done) st.wake = null;
        resolve();
      };
      const t = setTimeout(done, Math.max(1, ms));
      wakers.add(done);
      if (st !== null) st.wake = done;
    });
  }

  /** Routes a dispatch: waits out a weight update and for a healthy engine; null when aborted meanwhile. */
  private async acquire(input: Int32Array, sessionId: string | undefined, st: ReqState, deadline: number, rid: string, avoid: string | null): Promise<Engine | null> {
    for (;;) {
      if (st.userAborted) return null;
      if (this.closed) throw new OozeError("ACTOR_STOPPED", `fleet closed while request ${rid} was waiting for an engine`);
      if (this.updating) {
        await Promise.race([this.updating, this.changed(1000, st)]);
        continue;
      }
      if (this.router.size > 0) {
        const id = this.router.route({ inputIds: input, ...(sessionId === undefined ? {} : { routingKey: sessionId }), ...(avoid === null ? {} : { avoid }) });
        const e = this.engines.get(id);
        if (e && e.healthy) return e;
        this.router.removeEngine(id); // stale: cannot happen while the two maps agree
        continue;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        const known = this.list().map((x) => `${x.id}${x.lastError ? ` (${x.lastError})` : ""}`);
        throw new OozeError("ENGINE_UNAVAILABLE", `fleet: no healthy engine for request ${rid} within ${this.requestTimeoutMs} ms; engines: ${known.join(", ") || "none attached"}`, {
          retryable: true,
        });
      }
      await this.changed(Math.min(left, 1000), st);
    }
  }

  /** Serialises joins and weight updates, so no engine joins with weights older than the fleet's. */
  private locked<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.lockChain.then(fn, fn);
    this.lockChain = p.catch(() => undefined);
    return p;
  }

  /** Discovers an engine, checks its model, brings it to the fleet's version and adds it to routing. */
  private join(e: Engine, rethrow: boolean): Promise<void> {
    const expect = e.expect;
    e.joining ??= (async () => {
      try {
        const [mi, si] = await Promise.all([e.ctl.modelInfo(), e.ctl.serverInfo()]);
        const sig = modelSignature(mi, si);
        const want = expect === null ? null : expect !== undefined ? expectedSignature(expect) : this.reference;
        if (want) {
          const diff = signatureDiff(sig, want);
          if (diff.length > 0) {
            throw new OozeError("ENGINE_MISMATCH", `fleet: ${e.id} serves a different model (${String(mi.model_path)}): ${diff.join("; ")}; attach an engine serving the fleet's model`);
          }
        }
        e.model = sig;
        e.limits = limitsOfEngine(si, sig.context_length);
        this.limitsCache = undefined;
        if (this.reference === null && expect === undefined) this.reference = sig;
        e.weightVersion = typeof mi.weight_version === "string" ? mi.weight_version : await e.ctl.weightVersion();
        const followed = this.followed;
        if (followed !== null && (e.weightVersion === null || !versionAtLeast(e.weightVersion, followed))) {
          throw new OozeError("ENGINE_UNAVAILABLE", `fleet: ${e.id} serves weight version ${e.weightVersion ?? "unknown"} and the job is at ${followed}; it joins routing once it is brought to that version`, { retryable: true });
        }
        await this.locked(async () => {
          if (e.detached || e.draining || this.closed || e.healthy) return;
          const cur = this.current;
          if (cur && e.weightVersion !== cur.version) await updateEngine(e, cur.modelDir, cur.version, "abort", this.log);
          e.healthy = true;
          e.failures = 0;
          e.lastError = null;
          e.epoch++;
          this.router.addEngine(e.id);
        });
        if (this.external && !e.detached) await this.external.add(e.id).catch((err) => this.log(`fleet: ${errText(err)}`));
        this.notify();
      } catch (err) {
        e.lastError = errText(err);
        throw err;
      } finally {
        e.joining = null;
      }
    })();
    return rethrow ? e.joining : e.joining.catch(() => {});
  }

  /** Takes an engine out of routing; its in-flight requests are cut and re-dispatched. */
  private leave(e: Engine, reason: string, graceful = false): void {
    if (e.healthy) {
      e.healthy = false;
      this.router.removeEngine(e.id);
      this.log(`fleet: ${e.id} left routing: ${reason}`);
    }
    for (const a of e.attempts) {
      a.redispatch ??= `${e.id} ${reason}`;
      if (graceful && !a.stream) this.cutGracefully(e, a);
      else a.ctl.abort();
    }
  }

  private engineOf(a: Attempt): Engine | null {
    const e = this.engines.get(a.engine);
    return e && e.attempts.has(a) ? e : null;
  }

  /**
   * Asks the engine to abort a dispatch (its response then carries the tokens sampled so far),
   * cutting the connection if the answer does not come within GRACEFUL_ABORT_MS.
   */
  private cutGracefully(e: Engine, a: Attempt): void {
    if (a.cutTimer !== null || a.ctl.signal.aborted) return;
    a.cutTimer = setTimeout(() => a.ctl.abort(), GRACEFUL_ABORT_MS);
    e.ctl.abort({ rid: a.rid }).catch(() => a.ctl.abort());
  }

  /**
   * A dispatch failed on `e`: a refused connection (nothing listens) takes it out of routing at once;
   * other faults only after leaveAfterFailures in a row and while another engine is in routing, so
   * one lost reply does not cut the requests running beside it. A health check that passes brings it back.
   */
  private noteFailure(e: Engine, kind: string, err: OozeError): void {
    e.lastError = err.message;
    if (kind === "unreachable") {
      e.failures = Math.max(e.failures, this.unhealthyAfter);
      this.leave(e, `refused a connection: ${err.message}`);
      return;
    }
    if (++e.dispatchFailures < this.leaveAfterFailures) return;
    // The only engine in routing stays: its requests back off instead, and health checks watch it.
    if (this.othersInRouting(e.id) === 0) return;
    e.dispatchFailures = 0;
    e.lastError = `failed ${this.leaveAfterFailures} dispatches in a row (last: ${kind}: ${err.message})`;
    this.leave(e, e.lastError, true);
  }

  /** Waits `ms` before a retry on the same engine; ends early when the request is aborted or the fleet closes. */
  private async backoff(ms: number, st: ReqState): Promise<void> {
    const until = Date.now() + ms;
    while (!st.userAborted && !this.closed && Date.now() < until) await this.sleep(until - Date.now(), st, this.sleepers);
  }

  private healthTick(): void {
    if (this.closed) return;
    for (const e of this.engines.values()) {
      if (e.checking || e.joining) continue;
      e.checking = true;
      void this.check(e).finally(() => (e.checking = false));
    }
  }

  /** The version an engine in routing must serve: the fleet's own, or the one it follows. */
  private get wantedVersion(): string | null {
    return this.current?.version ?? this.followed;
  }

  /**
   * A reply showed an engine in routing back on older weights than the fleet brought it to (a
   * restart between health checks): unless an update is running (its versions are in flux), it
   * leaves routing and joins again, which brings it up to date. Returns whether it was taken so.
   */
  private restartedStale(e: Engine, why: string): boolean {
    if (this.updating !== null || e.detached || this.closed) return false;
    this.leave(e, why);
    void this.join(e, false);
    return true;
  }

  /**
   * An engine in routing that restarted between two health checks answers them and serves its
   * initial weights: one that serves a version older than the fleet's (or the one it follows), or one
   * not comparable with it, leaves routing and joins again, which brings it up to date (or, when
   * following, waits for the updating fleet to). Skipped while an update runs.
   */
  private async checkVersion(e: Engine): Promise<void> {
    const want = this.wantedVersion;
    if (want === null || this.updating !== null || (this.current !== null && e.weightVersion !== want)) return;
    let v: string | null;
    try {
      v = await e.probe.weightVersion();
    } catch {
      return; // the health checks deal with an engine that does not answer
    }
    if (e.detached || this.closed || !e.healthy || this.updating !== null || want !== this.wantedVersion) return;
    // A later version is another updater's doing (not a restart): left as it is.
    if (v !== null && versionAtLeast(v, want)) return;
    this.leave(e, `it serves weight version ${v ?? "unknown"}, not ${want} (restarted on its initial weights?); it joins again once at that version`);
    await this.join(e, false);
  }

  private async check(e: Engine): Promise<void> {
    const previous = e.checkedAt;
    e.checkedAt = performance.now();
    let r: "ok" | "down" | "silent";
    try {
      r = await e.probe.healthCheck({ timeoutMs: this.healthTimeoutMs });
    } catch {
      r = "down";
    }
    if (e.detached || this.closed) return;
    // A health check that got no answer in time does not count against an engine that answered a
    // dispatch since the previous check began: it is busy, or this process was too late to read the
    // answer (its event loop stalled past the deadline). At 1,024 engines on two cores such checks
    // took 698 engines out of routing in 20 minutes, each leave re-dispatching its requests, which
    // loaded the processes further (Dec 1, docs/experiments/scale.md). An error status still counts.
    if (r === "silent" && e.healthy && e.answeredAt > previous) return;
    const ok = r === "ok";
    if (ok) {
      e.failures = 0;
      if (e.draining) return;
      if (!e.healthy) await this.join(e, false);
      else await this.checkVersion(e);
      return;
    }
    e.failures++;
    if (e.healthy && e.failures >= this.unhealthyAfter) {
      e.lastError = `failed ${e.failures} health checks in a row`;
      this.leave(e, e.lastError);
    }
  }
}
