// The Fleet's public types (requests, results, engine entries, options) and the internal records it
// keeps per engine, per dispatch and per request; URL normalisation of engine ids.
import { OozeError } from "../../errors.ts";
import type { Bus } from "../../transport/bus.ts";
import type { FinishReason } from "../backend.ts";
import type { EngineClient } from "../client.ts";
import type { LengthLimits } from "../limits.ts";
import type { ModelSignature } from "./model.ts";
import type { EngineSource } from "./registry.ts";
import type { PartialRollout, WeightVersionSpan } from "./partial.ts";
import type { WireSamplingParams } from "../protocol.ts";
import type { RoutingPolicy } from "./router.ts";

/** One generation request to the fleet. */
export interface FleetGenerateRequest {
  inputIds: Int32Array;
  /**
   * SGLang's sampling_params; `max_new_tokens` is required (the budget shared by all re-dispatches).
   * Each dispatch asks for no more than its engine's context leaves (it would refuse more).
   */
  sampling: WireSamplingParams;
  /** Session id: routing affinity and the X-SMG-Routing-Key header. */
  sessionId?: string;
  /** The LoRA adapter (policy) to generate with, as the engines loaded it (SGLang's lora_path); absent or null: the base. */
  lora?: string | null;
  /** Request id (default: a fresh uuid); `abort(rid)` uses it. Re-dispatches send `rid.N` to engines. */
  rid?: string;
  /** Aborting it is the same as `abort(rid)`: the request ends as aborted and is not re-dispatched. */
  signal?: AbortSignal;
  /** Streams this request's dispatches (SGLang `stream: true`); default: the fleet's `stream` option. */
  stream?: boolean;
  /**
   * With a streamed request: called whenever a chunk brings new tokens, with every token sampled so
   * far (across re-dispatches) and their logprobs. The result's ids are the last call's, or fewer
   * when an engine's final chunk trimmed its tail. It must not throw (what it throws fails the request).
   */
  onTokens?: (outputIds: Int32Array, logprobs: Float32Array) => void;
}

/** A finished generation, possibly assembled from several dispatches. */
export interface FleetGenerateResult {
  /** Exactly as the engines sampled them, across re-dispatches (never decoded and re-encoded). */
  outputIds: Int32Array;
  logprobs: Float32Array;
  finishReason: FinishReason;
  status: "completed" | "truncated" | "aborted";
  /** Weight version of each run of output tokens, `[start, end)` over outputIds. */
  weightVersions: WeightVersionSpan[];
  /** Engine that produced the last tokens. */
  engine: string;
  /** Prompt tokens served from the prefix cache, summed over dispatches. */
  cachedTokens: number;
  redispatches: number;
  /** The fault kind of each failed dispatch that was retried, in order (e.g. ["http-503", "timeout"]). */
  faults: string[];
}

/** What `list()` shows about one engine. */
export interface EngineEntry {
  /** The engine's id (its normalised URL). */
  id: string;
  url: string;
  /** In the routing set. */
  healthy: boolean;
  /** Leaving: out of routing, detached once its requests in flight end (Fleet.drain). */
  draining: boolean;
  /** Fleet requests running on it now. */
  inFlight: number;
  weightVersion: string | null;
  source: EngineSource;
  lastError: string | null;
  /** ms since epoch */
  attachedAt: number;
  /** What identifies its model (null until discovered). */
  model: ModelSignature | null;
}

/** Options of a Fleet. */
export interface FleetOptions {
  /** Routing policy (default cache_aware). */
  routing?: RoutingPolicy;
  /** Interval of /health checks, ms (default 5000; 0 = no health loop). */
  healthIntervalMs?: number;
  /**
   * Deadline of one /health check, ms (default 30 000: above the 20 s an SGLang server, or ours,
   * gives its own one-token health generation, so a busy engine answers 503 rather than nothing).
   */
  healthTimeoutMs?: number;
  /**
   * Deadline of one control request to an engine (pause, weight update, continue, model info), ms
   * (default 30 000). A weight update must finish within it: raise it for engines whose updates take
   * longer (large checkpoints from disk, or a simulated fleet on a slowed clock).
   */
  controlTimeoutMs?: number;
  /** Failed checks in a row that take an engine out of routing (default 3; a failed request takes it out at once). */
  unhealthyAfter?: number;
  /** Longest a request may wait for a healthy engine, over all its dispatches, ms (default 300 000). */
  requestTimeoutMs?: number;
  /**
   * Stream every generation (default false). Streamed, the tokens an engine sent before it died are
   * kept, and the spans of a request that crosses an in_place update are exact per token; but every
   * chunk carries all ids and logprobs so far, which costs several times the generation itself on
   * small models. Not streamed, a request aborted by its engine (weight update, /abort_request, a
   * detach, which sends /abort_request) still keeps its tokens from the abort response; only an
   * engine that dies loses the tokens of its current dispatch, which are generated again elsewhere.
   */
  stream?: boolean;
  /**
   * Progress deadline, ms (default 10 000). A non-streamed dispatch that has not answered within
   * `progressTimeoutMs + progressTimeoutPerTokenMs × max_new_tokens` (or, once dispatches have
   * succeeded, 4 × the slowest recent one if that is shorter, but at least minProgressTimeoutMs) is
   * abandoned: the engine is asked to abort it (a live engine answers with the tokens sampled so
   * far, which are kept) and it is re-dispatched, on another engine where there is one. A streamed
   * dispatch may be silent this long between chunks. Each deadline a request misses doubles its next.
   */
  progressTimeoutMs?: number;
  /** Added to a non-streamed dispatch's deadline per token of its budget, ms (default 50). */
  progressTimeoutPerTokenMs?: number;
  /** Floor of the adaptive deadline, ms (default 1 000; set it to progressTimeoutMs to turn adaptation off). */
  minProgressTimeoutMs?: number;
  /** Cap of the silence between two streamed chunks, ms (default 120 000). */
  streamIdleTimeoutMs?: number;
  /** Cap of the deadline of one non-streamed dispatch, ms (default 600 000). */
  generateTimeoutMs?: number;
  /**
   * Failed dispatches of one request (an error status, a lost or malformed reply, a missed
   * deadline) retried before it fails with ENGINE_UNAVAILABLE naming the faults (default 10).
   */
  maxRetries?: number;
  /** Base of the backoff before a retry on the same engine, ms (default 200; doubled per failure, capped by retryMaxMs, jittered ×[0.5, 1.5)). */
  retryBaseMs?: number;
  /** Cap of that backoff, ms (default 5 000). */
  retryMaxMs?: number;
  /** Failed dispatches in a row (no success between) that take an engine out of routing until a health check passes (default 5); a refused connection takes it out at once. */
  leaveAfterFailures?: number;
  /** Random source of the backoff's jitter (tests). */
  random?: () => number;
  /** Re-dispatches of one request, for any reason, before it fails with ENGINE_UNAVAILABLE (default 32). */
  maxRedispatches?: number;
  /** With `job`: the engine registry lives in the job's KV bucket. */
  bus?: Bus;
  job?: string;
  /** An external SGLang router to register engines with (POST /workers, DELETE /workers/{id}). */
  externalRouter?: string;
  /** The model every engine must serve (an HF config or a signature); default: the first engine's. */
  expectModel?: Record<string, unknown>;
  log?: (line: string) => void;
}

/** One dispatch of a request to one engine (internal). */
export interface Attempt {
  /** The rid the engine knows this dispatch by. */
  rid: string;
  engine: string;
  ctl: AbortController;
  /** Set when the fleet cut the attempt so that the request moves elsewhere. */
  redispatch: string | null;
  epoch: number;
  /** The engine's weight version when the attempt was sent; `crossed` when an in_place update happened meanwhile. */
  version: string | null;
  crossed: boolean;
  /** Fallback cut of a graceful abort. */
  cutTimer: NodeJS.Timeout | null;
  /** Set when the dispatch missed its progress deadline (the message says which). */
  expired: string | null;
  /** A non-streamed dispatch under the progress deadline: when it was sent (performance.now()), its budget, the deadlines its request missed. */
  watch: { start: number; budget: number; missed: number } | null;
  /** Sent with `stream: true`. */
  stream: boolean;
}

/** An attached engine (internal). */
export interface Engine {
  id: string;
  url: string;
  source: EngineSource;
  attachedAt: number;
  gen: EngineClient;
  ctl: EngineClient;
  probe: EngineClient;
  healthy: boolean;
  detached: boolean;
  /** Out of routing, detached once its dispatches end (Fleet.drain); attach() takes it back. */
  draining: boolean;
  model: ModelSignature | null;
  /** Its length limits as it reports them (limits.ts), or null: requests to it are sized to them. */
  limits: LengthLimits | null;
  weightVersion: string | null;
  lastError: string | null;
  failures: number;
  /** Failed dispatches in a row, reset by a dispatch that succeeds. */
  dispatchFailures: number;
  /** When (performance.now) a dispatch on it last ended with the engine's answer; -1 before the first. */
  answeredAt: number;
  /** When its last health check began; -1 before the first. */
  checkedAt: number;
  checking: boolean;
  joining: Promise<void> | null;
  attempts: Set<Attempt>;
  /** Bumped on every join, so releases of older routings are not counted against the new one. */
  epoch: number;
  /** The model this engine must serve: an expectation, null (unchecked), or undefined (the fleet's). */
  expect: Record<string, unknown> | null | undefined;
}

/** A running request (internal). */
export interface ReqState {
  userAborted: boolean;
  attempt: Attempt | null;
  acc: PartialRollout;
  /** Ends the request's current wait (set while it waits): its abort wakes it alone. */
  wake: (() => void) | null;
}

/** Normalises an engine URL: scheme added when missing, trailing slashes removed. */
export function normalizeEngineUrl(url: string): string {
  let u = url.trim().replace(/\/+$/, "");
  if (!/^https?:\/\//.test(u)) u = `http://${u}`;
  try {
    const p = new URL(u);
    return `${p.protocol}//${p.host}${p.pathname === "/" ? "" : p.pathname.replace(/\/+$/, "")}`;
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `'${url}' is not an engine URL (expected http://HOST:PORT)`, { cause: e });
  }
}

