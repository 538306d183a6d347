// HTTP client of one SGLang-compatible inference server (ooze's embedded engine server or an external
// SGLang server): /generate (plain and SSE streaming) and the control endpoints, with timeouts on
// every call, jittered retries for idempotent calls only, and every foreign failure turned into a
// typed OozeError naming the URL (EngineProtocolError also names the field). Calls and streams go
// over ooze's own keep-alive HTTP/1.1 transport (http.ts: a fraction of fetch's cost per call).
import { EngineProtocolError, OozeError, TimeoutError } from "../errors.ts";
import type { FinishReason } from "./backend.ts";
import { HttpTimeoutError, requestStream, requestText, type HttpStreamResponse, type HttpTextResponse } from "./http.ts";
import { finishStatus, parseGenerateResponse, type GenerateOutput, type WireSamplingParams } from "./protocol.ts";

/** An engine answered an HTTP error status (5xx and 429: ENGINE_UNAVAILABLE, retryable; other 4xx: ENGINE_REJECTED). */
export class EngineHttpError extends OozeError {
  readonly status: number;
  readonly url: string;
  constructor(url: string, status: number, message: string) {
    super(status >= 500 || status === 429 ? "ENGINE_UNAVAILABLE" : "ENGINE_REJECTED", message, { retryable: status >= 500 || status === 429 });
    this.name = "EngineHttpError";
    this.status = status;
    this.url = url;
  }
}

/** Socket errors that are this process's or host's limits (file descriptors, buffers, ports), not the engine's doing. */
const LOCAL_LIMITS = new Set(["EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "EADDRNOTAVAIL"]);

/**
 * What went wrong with an engine call, as a short fault name: `http-503` (an error status),
 * `unreachable` (nothing listens: connection refused), `connection-lost` (reset or closed before
 * a whole reply), `timeout`, `malformed-reply` (a body that breaks the protocol), `engine-error`
 * (an error event mid-stream), `local-limit` (this side ran out of file descriptors, buffers or
 * ports: no fault of the engine's). null: not an engine fault (a rejected request, an abort, a bug).
 */
export function engineFaultKind(e: unknown): string | null {
  if (!(e instanceof OozeError)) return null;
  if (e instanceof EngineHttpError) return e.retryable ? `http-${e.status}` : null;
  if (e.code === "TIMEOUT") return "timeout";
  if (e.code === "ENGINE_PROTOCOL") return "malformed-reply";
  if (e.code === "ENGINE_UNAVAILABLE") {
    for (let c: unknown = e.cause; c && typeof c === "object"; c = (c as { cause?: unknown }).cause) {
      const code = (c as { code?: unknown }).code;
      if (code === "ECONNREFUSED") return "unreachable";
      if (typeof code === "string" && LOCAL_LIMITS.has(code)) return "local-limit";
    }
    return "connection-lost";
  }
  return null;
}

/** The headers of a request with a JSON body (shared: never modified). */
const JSON_HEADERS: Readonly<Record<string, string>> = Object.freeze({ "content-type": "application/json" });

/** Header that carries a session id so a router keeps an episode on one engine. */
export const ROUTING_KEY_HEADER = "X-SMG-Routing-Key";

/** Options of an EngineClient. */
export interface EngineClientOptions {
  /** Deadline of control calls, ms (default 30 000). */
  timeoutMs?: number;
  /** Deadline of a non-streamed /generate, ms (default 600 000). */
  generateTimeoutMs?: number;
  /** Longest silence between two streamed chunks, ms (default 120 000). */
  streamIdleTimeoutMs?: number;
  /** Retries of idempotent calls after the first attempt (default 3). Never applied to /generate. */
  retries?: number;
  /** Base of the exponential backoff, ms (default 100); each delay is jittered by ×[0.5, 1.5). */
  retryBaseMs?: number;
  /** Random source for jitter (tests). */
  random?: () => number;
  /**
   * Its non-streamed calls are control or health calls that must not wait behind generations for a
   * socket (http.ts, PRIORITY_SOCKETS): the fleet's control and probe clients.
   */
  priority?: boolean;
}

/** One generation request. `sampling` uses SGLang's field names. */
export interface GenerateRequest {
  inputIds: ArrayLike<number>;
  sampling?: WireSamplingParams;
  returnLogprob?: boolean;
  rid?: string;
  /** Sent as X-SMG-Routing-Key. */
  routingKey?: string;
  /** The LoRA adapter to generate with, by the name the engine loaded it under (SGLang's lora_path); absent or null: the base. */
  lora?: string | null;
  /** Overrides the client's deadline for this call, ms. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** A finished generation. `logprobs` is empty unless returnLogprob was set. */
export interface GenerateResult extends GenerateOutput {
  finishReason: FinishReason;
  status: "completed" | "truncated" | "aborted";
}

/** Result of /update_weights_from_disk. */
export interface UpdateWeightsResult {
  success: boolean;
  message: string;
  numPausedRequests: number;
}

/** Summed load of an engine from /v1/loads (or the older /get_load list form). */
export interface EngineLoad {
  running: number;
  waiting: number;
  /** running + waiting. */
  total: number;
  raw: unknown;
}

type Method = "GET" | "POST";

interface CallSpec {
  method: Method;
  path: string;
  body?: unknown;
  idempotent: boolean;
  timeoutMs?: number;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Statuses answered normally rather than thrown (besides 2xx). */
  accept?: number[];
}

interface RawResponse {
  status: number;
  text: string;
  url: string;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function causeText(e: unknown): string {
  if (!(e instanceof Error)) return String(e);
  const c = (e as { cause?: unknown }).cause;
  const code = c && typeof c === "object" && "code" in c ? String((c as { code: unknown }).code) : "";
  const cm = c instanceof Error ? c.message : "";
  return [e.message, code, cm].filter(Boolean).join(": ");
}

function errorMessageOf(text: string): string {
  try {
    const j = JSON.parse(text) as unknown;
    if (j && typeof j === "object") {
      const o = j as Record<string, unknown>;
      if (typeof o.message === "string") return o.message;
      const e = o.error;
      if (e && typeof e === "object" && typeof (e as Record<string, unknown>).message === "string") {
        return (e as Record<string, string>).message!;
      }
      if (typeof e === "string") return e;
    }
  } catch {
    // not JSON: use the text
  }
  if (text.trim() === "") return "(the reply has no body)";
  return text.length > 300 ? `${text.slice(0, 300)}…` : text;
}

/**
 * A streamed chunk made cumulative. SGLang streams cumulative chunks by default; with
 * `--incremental-streaming-output` each carries only the new ids (and logprobs), which shows as
 * fewer ids than `meta_info.completion_tokens` (always the count so far) that exactly complete the
 * previous chunk's: those are appended to it.
 */
function cumulative(chunk: GenerateOutput, prev: GenerateOutput | null): GenerateOutput {
  const n = chunk.outputIds.length;
  const total = chunk.meta.completionTokens;
  if (prev === null || n >= total || prev.outputIds.length + n !== total) return chunk;
  // A last chunk that repeats the start of the previous one is a cumulative one trimmed of its tail.
  if (chunk.finishReason !== null && chunk.outputIds.every((id, i) => id === prev.outputIds[i])) return chunk;
  const join = <T extends Int32Array | Float32Array>(a: T, b: T, make: (len: number) => T): T => {
    const out = make(a.length + b.length);
    out.set(a);
    out.set(b, a.length);
    return out;
  };
  return {
    ...chunk,
    outputIds: join(prev.outputIds, chunk.outputIds, (k) => new Int32Array(k)),
    logprobs: chunk.logprobs.length === 0 && prev.logprobs.length === 0 ? chunk.logprobs : join(prev.logprobs, chunk.logprobs, (k) => new Float32Array(k)),
    text: prev.text + chunk.text,
  };
}

/**
 * An abort the engine decided with status 400 — SGLang's scheduler refusing a request it was sent
 * (an input at or over max_req_input_len, src/engine/limits.ts): refused, not interrupted, so it is
 * an ENGINE_REJECTED error (as the same refusal of a non-streamed request, a 400), never a resume.
 */
function refusal(endpoint: string, out: GenerateOutput): EngineHttpError | null {
  const f = out.meta.raw.finish_reason as { status_code?: unknown } | null | undefined;
  if (out.finishReason?.type !== "abort" || f?.status_code !== 400) return null;
  return new EngineHttpError(endpoint, 400, `${endpoint}: the engine rejected the request with 400: ${out.finishReason.message}`);
}

/** Client of one SGLang-compatible server at `url` (e.g. "http://127.0.0.1:30000"). */
export class EngineClient {
  readonly url: string;
  /** `${url}/generate`, made once (a rollout process holds thousands of generations at once). */
  private readonly generateUrl: string;
  private readonly timeoutMs: number;
  private readonly generateTimeoutMs: number;
  private readonly streamIdleTimeoutMs: number;
  private readonly retries: number;
  private readonly retryBaseMs: number;
  private readonly random: () => number;
  private readonly priority: boolean;

  constructor(url: string, opts: EngineClientOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    this.generateUrl = `${this.url}/generate`;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.generateTimeoutMs = opts.generateTimeoutMs ?? 600_000;
    this.streamIdleTimeoutMs = opts.streamIdleTimeoutMs ?? 120_000;
    this.retries = opts.retries ?? 3;
    this.retryBaseMs = opts.retryBaseMs ?? 100;
    this.random = opts.random ?? Math.random;
    this.priority = opts.priority ?? false;
  }

  /**
   * Generates from `inputIds`; ids and logprobs come exactly as the server returned them. The hot
   * path of every rollout: one frame waits on the exchange (a rollout process holds thousands at
   * once), so it sends the request itself rather than through call().
   */
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const wantLogprobs = req.returnLogprob ?? false;
    const endpoint = this.generateUrl;
    const ms = req.timeoutMs ?? this.generateTimeoutMs;
    let res: HttpTextResponse;
    try {
      res = await requestText(endpoint, {
        method: "POST",
        headers: req.routingKey === undefined ? JSON_HEADERS : { ...JSON_HEADERS, [ROUTING_KEY_HEADER]: req.routingKey },
        body: this.generateJson(req, false),
        timeoutMs: ms,
        priority: this.priority,
        ...(req.signal ? { signal: req.signal } : {}),
      });
    } catch (e) {
      throw this.transportError(endpoint, e, e instanceof HttpTimeoutError, ms, req.signal);
    }
    const json = this.parseJson(this.checked(endpoint, res));
    const out = parseGenerateResponse(endpoint, Array.isArray(json) && json.length === 1 ? json[0] : json, { wantLogprobs, final: true });
    const refused = refusal(endpoint, out);
    if (refused) throw refused;
    return { ...out, finishReason: out.finishReason!, status: finishStatus(out.finishReason!) };
  }

  /**
   * Streams a generation: yields cumulative chunks (whole ids and logprobs so far); the last one
   * carries the finish reason. A server that streams incremental chunks (SGLang's
   * `--incremental-streaming-output`: only the new ids) is read the same way. A connection reset,
   * a stream without `[DONE]`, or an error event throws a typed error naming the URL.
   */
  async *generateStream(req: GenerateRequest): AsyncGenerator<GenerateOutput, GenerateResult, void> {
    const wantLogprobs = req.returnLogprob ?? false;
    const endpoint = `${this.url}/generate`;
    const ctl = new AbortController();
    const idle = req.timeoutMs ?? this.streamIdleTimeoutMs;
    let timer: NodeJS.Timeout | undefined;
    let timedOut = false;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        timedOut = true;
        ctl.abort();
      }, idle);
    };
    const onCallerAbort = () => ctl.abort(req.signal?.reason);
    req.signal?.addEventListener("abort", onCallerAbort, { once: true });
    arm();
    let chunks = 0;
    let last: GenerateOutput | null = null;
    try {
      let res: HttpStreamResponse;
      try {
        res = await requestStream(endpoint, {
          method: "POST",
          headers: { "content-type": "application/json", accept: "text/event-stream", ...this.routingHeaders(req) },
          body: this.generateJson(req, true),
          signal: ctl.signal,
        });
      } catch (e) {
        throw this.transportError(endpoint, e, timedOut, idle, req.signal);
      }
      if (res.status < 200 || res.status >= 300) {
        const text = await res.text().catch(() => "");
        throw this.statusError(endpoint, res.status, text);
      }
      const reader = res.body[Symbol.asyncIterator]();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        let r: IteratorResult<Buffer>;
        try {
          r = await reader.next();
        } catch (e) {
          if (timedOut) throw new TimeoutError(`${endpoint}: no streamed chunk within ${idle} ms (after ${chunks} chunks)`, { cause: e });
          if (req.signal?.aborted) throw req.signal.reason;
          throw new OozeError(
            "ENGINE_UNAVAILABLE",
            `${endpoint}: the connection was closed mid-stream after ${chunks} chunks (${causeText(e)}); the request may be retried on another engine`,
            { retryable: true, cause: e },
          );
        }
        if (r.done) break;
        arm();
        buf += decoder.decode(r.value, { stream: true }).replace(/\r\n/g, "\n");
        let sep: number;
        while ((sep = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, sep);
          buf = buf.slice(sep + 2);
          const data = event
            .split("\n")
            .filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).replace(/^ /, ""))
            .join("\n");
          if (data === "") continue;
          if (data === "[DONE]") {
            if (!last || !last.finishReason) {
              throw new EngineProtocolError(endpoint, "meta_info.finish_reason", "the stream ended with [DONE] before a chunk with a finish reason");
            }
            return { ...last, finishReason: last.finishReason, status: finishStatus(last.finishReason) };
          }
          let json: unknown;
          try {
            json = JSON.parse(data);
          } catch (e) {
            throw new EngineProtocolError(endpoint, "data", `streamed chunk ${chunks} is not valid JSON: ${causeText(e)}`);
          }
          if (json && typeof json === "object" && "error" in json) {
            throw new OozeError("ENGINE_REJECTED", `${endpoint}: the engine reported an error mid-stream: ${errorMessageOf(data)}`, { retryable: false });
          }
          last = cumulative(parseGenerateResponse(endpoint, json, { wantLogprobs, final: false, prefix: `data[${chunks}]` }), last);
          const refused = refusal(endpoint, last);
          if (refused) throw refused;
          chunks++;
          yield last;
        }
      }
      throw new OozeError("ENGINE_UNAVAILABLE", `${endpoint}: the stream ended without data: [DONE] after ${chunks} chunks`, { retryable: true });
    } finally {
      clearTimeout(timer);
      req.signal?.removeEventListener("abort", onCallerAbort);
      ctl.abort();
    }
  }

  /** Aborts one request by rid, or every request with `{all: true}`. */
  async abort(target: { rid: string } | { all: true }): Promise<void> {
    const body = "rid" in target ? { rid: target.rid } : { abort_all: true };
    await this.call({ method: "POST", path: "/abort_request", body, idempotent: false });
  }

  /** true when GET /health answers 200; false when it answers 503 or cannot be reached after retries. */
  async health(opts: { generate?: boolean; timeoutMs?: number } = {}): Promise<boolean> {
    return (await this.healthCheck(opts)) === "ok";
  }

  /**
   * GET /health: "ok" (200), "down" (an error status, or no connection after retries) or "silent"
   * (no whole answer within the deadline: down, or busy, or this process too late to read it).
   */
  async healthCheck(opts: { generate?: boolean; timeoutMs?: number } = {}): Promise<"ok" | "down" | "silent"> {
    try {
      await this.call({
        method: "GET",
        path: opts.generate ? "/health_generate" : "/health",
        idempotent: true,
        ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
      });
      return "ok";
    } catch (e) {
      if (e instanceof OozeError && e.code === "TIMEOUT") return "silent";
      if (e instanceof OozeError && e.code === "ENGINE_UNAVAILABLE") return "down";
      throw e;
    }
  }

  /** GET /model_info (falls back to /get_model_info on 404). */
  async modelInfo(): Promise<Record<string, unknown>> {
    return this.getObject(["/model_info", "/get_model_info"], "model_path");
  }

  /** GET /server_info (falls back to /get_server_info on 404). */
  async serverInfo(): Promise<Record<string, unknown>> {
    return this.getObject(["/server_info", "/get_server_info"], null);
  }

  /** GET /get_weight_version → the version string, or null. */
  async weightVersion(): Promise<string | null> {
    const res = await this.call({ method: "GET", path: "/get_weight_version", idempotent: true });
    const j = this.parseJson(res);
    if (!j || typeof j !== "object" || Array.isArray(j)) throw new EngineProtocolError(res.url, "body", "expected a JSON object");
    const v = (j as Record<string, unknown>).weight_version;
    if (v === null || v === undefined) return null;
    if (typeof v !== "string") throw new EngineProtocolError(res.url, "weight_version", `expected a string or null, got ${typeof v}`);
    return v;
  }

  /** Flushes the prefix cache: true when flushed, false when the engine was busy (400). */
  async flushCache(): Promise<boolean> {
    const res = await this.call({ method: "POST", path: "/flush_cache", idempotent: false, accept: [400] });
    return res.status === 200;
  }

  /** POST /update_weights_from_disk; a 400 with success:false is returned, not thrown. */
  async updateWeightsFromDisk(req: {
    modelPath: string;
    weightVersion?: string;
    loadFormat?: string;
    abortAllRequests?: boolean;
    flushCache?: boolean;
    timeoutMs?: number;
  }): Promise<UpdateWeightsResult> {
    const body: Record<string, unknown> = { model_path: req.modelPath };
    if (req.weightVersion !== undefined) body.weight_version = req.weightVersion;
    if (req.loadFormat !== undefined) body.load_format = req.loadFormat;
    if (req.abortAllRequests !== undefined) body.abort_all_requests = req.abortAllRequests;
    if (req.flushCache !== undefined) body.flush_cache = req.flushCache;
    const res = await this.call({
      method: "POST",
      path: "/update_weights_from_disk",
      body,
      idempotent: false,
      accept: [400],
      timeoutMs: req.timeoutMs ?? this.generateTimeoutMs,
    });
    const j = this.parseJson(res);
    if (!j || typeof j !== "object" || Array.isArray(j)) throw new EngineProtocolError(res.url, "body", "expected a JSON object");
    const o = j as Record<string, unknown>;
    if (typeof o.success !== "boolean") {
      if (res.status === 400) throw this.statusError(res.url, 400, res.text);
      throw new EngineProtocolError(res.url, "success", "expected a boolean");
    }
    const n = o.num_paused_requests ?? 0;
    if (typeof n !== "number") throw new EngineProtocolError(res.url, "num_paused_requests", "expected a number");
    return { success: o.success, message: typeof o.message === "string" ? o.message : "", numPausedRequests: n };
  }

  /** POST /pause_generation with a mode: abort (in-flight finish as aborted), retract (requeued), in_place (kept). */
  async pauseGeneration(mode: "abort" | "retract" | "in_place" = "abort"): Promise<void> {
    await this.call({ method: "POST", path: "/pause_generation", body: { mode }, idempotent: false });
  }

  /** POST /continue_generation. */
  async continueGeneration(): Promise<void> {
    await this.call({ method: "POST", path: "/continue_generation", body: {}, idempotent: false });
  }

  /** GET /v1/loads, summing running and waiting requests over the engine's ranks. */
  async loads(): Promise<EngineLoad> {
    const res = await this.call({ method: "GET", path: "/v1/loads", idempotent: true });
    const j = this.parseJson(res);
    const list = Array.isArray(j) ? j : j && typeof j === "object" ? (j as Record<string, unknown>).loads : undefined;
    if (!Array.isArray(list)) throw new EngineProtocolError(res.url, "loads", "expected a list of per-rank loads");
    let running = 0;
    let waiting = 0;
    list.forEach((l, i) => {
      if (!l || typeof l !== "object") throw new EngineProtocolError(res.url, `loads[${i}]`, "expected an object");
      const o = l as Record<string, unknown>;
      const r = o.num_running_reqs ?? o.num_reqs ?? 0;
      const w = o.num_waiting_reqs ?? 0;
      if (typeof r !== "number") throw new EngineProtocolError(res.url, `loads[${i}].num_running_reqs`, "expected a number");
      if (typeof w !== "number") throw new EngineProtocolError(res.url, `loads[${i}].num_waiting_reqs`, "expected a number");
      running += r;
      waiting += w;
    });
    return { running, waiting, total: running + waiting, raw: j };
  }

  // ---------------------------------------------------------------------------------------------

  /**
   * A /generate body as JSON text, written straight from the ids (what JSON.stringify would give for
   * `{ input_ids: [...], sampling_params, ... }`): no array of numbers is built for it, and a rollout
   * process holds thousands of these requests at once while their engines generate.
   */
  private generateJson(req: GenerateRequest, stream: boolean): string {
    let json = `{"input_ids":[${Array.prototype.join.call(req.inputIds, ",")}],"sampling_params":${JSON.stringify(req.sampling ?? {})}`;
    if (req.returnLogprob) json += `,"return_logprob":true`;
    if (req.rid !== undefined) json += `,"rid":${JSON.stringify(req.rid)}`;
    if (req.lora) json += `,"lora_path":${JSON.stringify(req.lora)}`;
    if (stream) json += `,"stream":true`;
    return json + "}";
  }

  private routingHeaders(req: GenerateRequest): Record<string, string> {
    return req.routingKey === undefined ? {} : { [ROUTING_KEY_HEADER]: req.routingKey };
  }

  private async getObject(paths: string[], required: string | null): Promise<Record<string, unknown>> {
    let res: RawResponse | null = null;
    for (const path of paths) {
      res = await this.call({ method: "GET", path, idempotent: true, accept: [404] });
      if (res.status !== 404) break;
    }
    if (res!.status === 404) throw this.statusError(res!.url, 404, res!.text);
    const j = this.parseJson(res!);
    if (!j || typeof j !== "object" || Array.isArray(j)) throw new EngineProtocolError(res!.url, "body", "expected a JSON object");
    if (required !== null && !(required in j)) throw new EngineProtocolError(res!.url, required, "missing");
    return j as Record<string, unknown>;
  }

  private parseJson(res: RawResponse): unknown {
    try {
      return JSON.parse(res.text);
    } catch (e) {
      throw new EngineProtocolError(res.url, "body", `not valid JSON (${causeText(e)}): ${res.text.slice(0, 120)}`);
    }
  }

  private statusError(endpoint: string, status: number, text: string): OozeError {
    const msg = errorMessageOf(text);
    if (status >= 500 || status === 429) return new EngineHttpError(endpoint, status, `${endpoint}: the engine answered ${status}: ${msg}`);
    return new EngineHttpError(endpoint, status, `${endpoint}: the engine rejected the request with ${status}: ${msg}`);
  }

  private transportError(endpoint: string, e: unknown, timedOut: boolean, ms: number, signal?: AbortSignal): unknown {
    if (timedOut) return new TimeoutError(`${endpoint}: no response within ${ms} ms`, { cause: e });
    if (signal?.aborted) return signal.reason;
    return new OozeError("ENGINE_UNAVAILABLE", `${endpoint}: cannot reach the engine (${causeText(e)}); check that it runs and the URL is right`, {
      retryable: true,
      cause: e,
    });
  }

  private async once(spec: CallSpec): Promise<RawResponse> {
    const endpoint = `${this.url}${spec.path}`;
    const ms = spec.timeoutMs ?? this.timeoutMs;
    let res: HttpTextResponse;
    try {
      const body = spec.body !== undefined ? JSON.stringify(spec.body) : undefined;
      const headers = body === undefined ? (spec.headers ?? {}) : { ...spec.headers, "content-type": "application/json" };
      res = await requestText(endpoint, {
        method: spec.method,
        headers,
        timeoutMs: ms,
        priority: this.priority,
        ...(spec.signal ? { signal: spec.signal } : {}),
        ...(body !== undefined ? { body } : {}),
      });
    } catch (e) {
      throw this.transportError(endpoint, e, e instanceof HttpTimeoutError, ms, spec.signal);
    }
    return this.checked(endpoint, res, spec.accept);
  }

  /** A response as returned: 2xx or a status in `accept`; any other is thrown as the engine's error. */
  private checked(endpoint: string, res: HttpTextResponse, accept?: number[]): RawResponse {
    if ((res.status >= 200 && res.status < 300) || accept?.includes(res.status)) return { status: res.status, text: res.text, url: endpoint };
    throw this.statusError(endpoint, res.status, res.text);
  }

  private call(spec: CallSpec): Promise<RawResponse> {
    // One attempt: no frame of its own waits on it.
    return spec.idempotent && this.retries > 0 ? this.retrying(spec, 1 + this.retries) : this.once(spec);
  }

  private async retrying(spec: CallSpec, attempts: number): Promise<RawResponse> {
    for (let i = 0; ; i++) {
      try {
        // Transport failures, timeouts and 5xx are retried; a malformed body is reported at once.
        return await this.once(spec);
      } catch (e) {
        const retryable = e instanceof OozeError && e.retryable;
        if (!retryable || i + 1 >= attempts || spec.signal?.aborted) throw e;
        await sleep(this.retryBaseMs * 2 ** i * (0.5 + this.random()));
      }
    }
  }
}
