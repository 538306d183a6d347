// ooze's SGLang-compatible HTTP engine server (node:http) over an InferenceBackend: /generate (plain,
// batched, n > 1, SSE streaming, logprobs, stop strings, LoRA adapters per request) and the control
// endpoints of /work/shared/sglang-api.md, SGLang's LoRA endpoints included (lora-api.ts). Bad requests get SGLang's 400 bodies, requests too long for the context
// are refused and capped as SGLang does (limits.ts); no request can crash the server.
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { z } from "zod";
import { OozeError } from "../errors.ts";
import { counter, gauge, histogram, newRegistry, sendMetrics } from "../metrics.ts";
import type { InferenceBackend } from "./backend.ts";
import { lengthRefusal, limitsOfContext, outputCap, type LengthLimits } from "./limits.ts";
import { loraApi } from "./lora-api.ts";
import { badRequestBody, parseGenerateRequest, type GenerateItem, type WireGenerateResponse, type WireMetaInfo } from "./protocol.ts";
import { newSchedRequest, Scheduler, type PauseMode, type SchedRequest } from "./scheduler.ts";
import { decodeBytes, encodeBytes } from "./tokenizer.ts";

/** Replaces the weights for /update_weights_from_disk. The default loads a model directory; a delta format plugs in here. */
export type LoadWeightsHook = (req: {
  modelPath: string;
  loadFormat: string | null;
  /** The version the request asks to set (null: unchanged). */
  weightVersion: string | null;
  /** The version the engine serves now. */
  currentVersion: string;
  /** The request's flush_cache was false: keep the prefix cache (the backend's loadWeights opts.keepCache). */
  keepCache?: boolean;
}) => Promise<void>;

/** Options of startEngineServer. */
export interface EngineServerOptions {
  backend: InferenceBackend;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (OS-assigned). */
  port?: number;
  /** Reported weight version (default "default", SGLang's). */
  weightVersion?: string;
  /** Reported model path (default backend.info.modelPath). */
  modelPath?: string;
  /** The backend's batch size, for load reporting (default 64). */
  maxRunning?: number;
  /** Default: backend.loadWeights(modelPath) for load_format null/"auto"/"safetensors". */
  loadWeights?: LoadWeightsHook;
  /** /health's generation deadline, ms (default 20 000). */
  healthTimeoutMs?: number;
  /** Largest accepted request body, bytes (default 64 MiB). */
  maxBodyBytes?: number;
  /**
   * How long a connection may take to send a whole request, ms (Node's requestTimeout, and its
   * headersTimeout the same); answered 408 past it. Default 0: no limit, as SGLang's uvicorn has none.
   * Node's own defaults (60 s for the head, 300 s for the whole) failed 312 requests with 408 in ten
   * minutes on a loaded machine at 1,024 simulated engines (Dec 1): a request is answered late there,
   * not refused.
   */
  requestReadTimeoutMs?: number;
  /**
   * How long an idle keep-alive connection stays open, ms (Node's keepAliveTimeout, announced in
   * `Keep-Alive: timeout=N`). Default 30 000.
   */
  keepAliveMs?: number;
}

/** A running engine server. Closing it does not close the backend. */
export interface EngineServer {
  url: string;
  port: number;
  close(): Promise<void>;
}

const newRid = () => randomUUID().replace(/-/g, "");
const OK_PAUSE = { message: "Generation paused successfully.", status: "ok" };
const OK_CONTINUE = { message: "Generation continued successfully.", status: "ok" };
// SGLang's /flush_cache (python/sglang/srt/entrypoints/http_server.py, v0.5.x): this text in both cases,
// status 200 when flushed and 400 (HTTPStatus.BAD_REQUEST) when the scheduler had running or waiting
// requests (Scheduler.flush_cache returns false and logs "Cache not flushed because there are pending
// requests"); a plain starlette Response, so no content-type header.
const FLUSH_TEXT = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";

const updateSchema = z.looseObject({
  model_path: z.string().min(1, "model_path is required"),
  load_format: z.string().nullable().optional(),
  weight_version: z.string().nullable().optional(),
  abort_all_requests: z.boolean().nullable().optional(),
  flush_cache: z.boolean().nullable().optional(),
});
const pauseSchema = z.looseObject({ mode: z.enum(["abort", "retract", "in_place"]).nullable().optional() });
const abortSchema = z.looseObject({ rid: z.string().nullable().optional(), abort_all: z.boolean().nullable().optional() });

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(typeof body === "string" ? body : JSON.stringify(body));
  }
}

/** A text body without a content-type header (as starlette's plain Response sends it). */
class UntypedText {
  constructor(readonly text: string) {}
}

function send(res: ServerResponse, status: number, body: unknown): void {
  if (res.headersSent || res.destroyed) return;
  if (body instanceof UntypedText) {
    res.writeHead(status, { "content-length": Buffer.byteLength(body.text) });
    res.end(body.text);
  } else if (body === null) {
    res.writeHead(status, { "content-length": "0" });
    res.end();
  } else if (typeof body === "string") {
    res.writeHead(status, { "content-type": "text/plain; charset=utf-8" });
    res.end(body);
  } else {
    const text = JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
  }
}

function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        reject(new HttpError(413, badRequestBody(`request body exceeds ${limit} bytes`)));
        req.removeAllListeners("data");
        req.resume();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

function parseJsonBody(text: string, emptyOk: boolean): unknown {
  if (text.trim() === "") {
    if (emptyOk) return {};
    throw new HttpError(400, badRequestBody("the request body is empty; send a JSON object"));
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new HttpError(400, badRequestBody(`the request body is not valid JSON: ${(e as Error).message}`));
  }
}

function zodMessage(err: z.ZodError): string {
  const i = err.issues[0];
  return i ? `${i.path.join(".") || "body"}: ${i.message}` : "invalid request";
}

/** Starts the server; resolves once it listens. */
export async function startEngineServer(opts: EngineServerOptions): Promise<EngineServer> {
  const backend = opts.backend;
  const host = opts.host ?? "127.0.0.1";
  const maxRunning = opts.maxRunning ?? 64;
  const healthTimeoutMs = opts.healthTimeoutMs ?? 20_000;
  const maxBody = opts.maxBodyBytes ?? 64 * 1024 * 1024;
  const vocab = typeof backend.info.config.vocab_size === "number" ? backend.info.config.vocab_size : undefined;
  const loadWeights: LoadWeightsHook =
    opts.loadWeights ??
    (async ({ modelPath, loadFormat, keepCache }) => {
      if (loadFormat !== null && loadFormat !== "auto" && loadFormat !== "safetensors") {
        throw new OozeError("BAD_REQUEST", `load_format '${loadFormat}' is not supported; use a model directory (auto or safetensors)`);
      }
      await backend.loadWeights(modelPath, { keepCache: keepCache ?? false });
    });
  const sched = new Scheduler(backend);
  const lora = loraApi(backend);
  // SGLang's limits: max_req_len = min(context − 1, KV pool − 1), inputs below it − 5 (limits.ts).
  const limits = (): LengthLimits => limitsOfContext(backend.info.maxContext, backend.cacheStats().budgetTokens);
  let status: "starting" | "ready" | "stopping" = "starting";
  let weightVersion = opts.weightVersion ?? "default";
  let modelPath = opts.modelPath ?? backend.info.modelPath;
  let updating = false;
  let updateChain: Promise<unknown> = Promise.resolve();
  let port = 0;

  // Prometheus metrics, named as SGLang names its own (sglang:*, label model_name), at GET /metrics.
  const registry = newRegistry();
  const modelName = modelPath; // the served model's name, as at start (weight updates keep it)
  const m = {
    promptTokens: counter(registry, "sglang:prompt_tokens_total", "Number of prefill tokens processed.", ["model_name"]),
    generationTokens: counter(registry, "sglang:generation_tokens_total", "Number of generation tokens processed.", ["model_name"]),
    cachedTokens: counter(registry, "sglang:cached_tokens_total", "Number of prompt tokens served from the prefix cache.", ["model_name"]),
    requests: counter(registry, "sglang:num_requests_total", "Number of requests finished.", ["model_name"]),
    ttft: histogram(registry, "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ["model_name"]),
    e2e: histogram(registry, "sglang:e2e_request_latency_seconds", "Histogram of end-to-end request latency in seconds.", ["model_name"]),
    errors: counter(registry, "ooze_engine_http_errors_total", "Requests answered with an HTTP error, by status code.", ["model_name", "code"]),
  };
  gauge(registry, "sglang:num_running_reqs", "The number of running requests.", ["model_name"], (g) => g.set({ model_name: modelName }, sched.counts(maxRunning).running));
  gauge(registry, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", ["model_name"], (g) => g.set({ model_name: modelName }, sched.counts(maxRunning).waiting));
  gauge(registry, "sglang:token_usage", "The token usage (share of the KV budget in use).", ["model_name"], (g) => {
    const st = backend.cacheStats();
    g.set({ model_name: modelName }, st.budgetTokens > 0 ? st.cachedTokens / st.budgetTokens : 0);
  });
  gauge(registry, "sglang:cache_hit_rate", "The prefix cache hit rate (prompt tokens served from the cache).", ["model_name"], (g) => {
    const st = backend.cacheStats();
    g.set({ model_name: modelName }, st.promptTokens > 0 ? st.hitTokens / st.promptTokens : 0);
  });

  /** Requests the scheduler refused for their length (streamed: answered with an abort finish reason carrying status 400). */
  const refused = new WeakSet<SchedRequest>();

  function responseOf(item: GenerateItem, r: SchedRequest, t0: number, index: number | null): WireGenerateResponse {
    let ids = r.outIds;
    const f = r.finish;
    if (f && f.type === "stop" && typeof f.matched === "number" && !item.noStopTrim) ids = ids.slice(0, -1);
    let text = decodeBytes(ids, item.skipSpecialTokens);
    if (r.stopAt !== null && !item.noStopTrim) text = decodeBytes(r.outIds, true).slice(0, r.stopAt);
    const meta: WireMetaInfo = {
      id: r.rid,
      finish_reason: f && refused.has(r) ? { ...f, status_code: 400, err_type: "BadRequestError" } : f,
      prompt_tokens: r.promptIds.length,
      completion_tokens: r.outIds.length,
      cached_tokens: r.cachedTokens,
      e2e_latency: (performance.now() - t0) / 1000,
      weight_version: weightVersion,
    };
    if (item.returnLogprob) {
      meta.input_token_logprobs = [];
      meta.output_token_logprobs = r.outIds.map((id, k) => [r.logprobs[k]!, id, item.returnTextInLogprobs ? decodeBytes([id], item.skipSpecialTokens) : null]);
    }
    const out: WireGenerateResponse = { text, output_ids: [...r.outIds], meta_info: meta };
    if (index !== null) out.index = index;
    return out;
  }

  async function generate(req: IncomingMessage, res: ServerResponse, body: unknown): Promise<void> {
    const parsed = parseGenerateRequest(body, newRid, vocab);
    if (!parsed.ok) throw new HttpError(400, badRequestBody(parsed.message));
    if (status !== "ready") throw new HttpError(503, { error: { message: `the server is ${status}` } });
    const { items, isBatch, stream } = parsed.call;
    const t0 = performance.now();
    const recs: SchedRequest[] = [];
    let done = 0;
    let ended = false;
    const finishAll = () => {
      ended = true;
      if (stream) {
        if (!res.destroyed) res.end("data: [DONE]\n\n");
        return;
      }
      const failed = recs.find((r) => r.error !== null);
      if (failed) return send(res, 500, { error: { message: failed.error } });
      const outs = recs.map((r, i) => responseOf(items[i]!, r, t0, null));
      send(res, 200, isBatch ? outs : outs[0]);
    };
    const firstToken = new Set<SchedRequest>();
    const onUpdate = (i: number) => (r: SchedRequest) => {
      if (r.outIds.length > 0 && !firstToken.has(r)) {
        firstToken.add(r);
        m.ttft.observe({ model_name: modelName }, (performance.now() - t0) / 1000);
      }
      if (r.state === "done" && !refused.has(r)) {
        m.requests.inc({ model_name: modelName });
        m.promptTokens.inc({ model_name: modelName }, r.promptIds.length);
        m.cachedTokens.inc({ model_name: modelName }, r.cachedTokens);
        m.generationTokens.inc({ model_name: modelName }, r.outIds.length);
        m.e2e.observe({ model_name: modelName }, (performance.now() - t0) / 1000);
      }
      if (stream && !res.destroyed) {
        if (r.error !== null) res.write(`data: ${JSON.stringify({ error: { message: r.error } })}\n\n`);
        else res.write(`data: ${JSON.stringify(responseOf(items[i]!, r, t0, isBatch ? i : null))}\n\n`);
      }
      if (r.state === "done" && ++done === recs.length) finishAll();
    };
    // Lengths as SGLang checks them (limits.ts): every input is validated (against max_new_tokens as
    // sent: an absent one is not checked) before any runs; one that fails validation fails the whole
    // call (streamed: an error event), one the scheduler refuses fails a non-streamed call and ends
    // with an abort finish reason (status_code 400) in a stream. Admitted requests get SGLang's cap
    // on max_new_tokens (the default and null included): the context left, less its reserve.
    const lim = limits();
    const late: { i: number; rec: SchedRequest; message: string }[] = [];
    let early: string | null = lora.refusal(items.map((it) => it.lora));
    items.forEach((it, i) => {
      const prompt = it.inputIds ?? encodeBytes(it.text ?? "", true);
      const why = lengthRefusal(lim, prompt.length, it.maxNewTokensSent);
      if (why?.stage === "validate") early ??= why.message;
      const cap = outputCap(lim, prompt.length);
      const maxNewTokens = Math.min(it.sampling.maxNewTokens ?? cap, cap);
      const sampling = { ...it.sampling, maxNewTokens, minNewTokens: Math.min(it.sampling.minNewTokens, maxNewTokens) };
      const rec = newSchedRequest(it.rid, prompt, sampling, it.stop, onUpdate(i), false, it.lora);
      if (why?.stage === "scheduler") late.push({ i, rec, message: why.message });
      recs.push(rec);
    });
    if (early !== null || (late.length > 0 && !stream)) {
      const message = early ?? late[0]!.message;
      if (!stream) throw new HttpError(400, { error: { message } });
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
      res.write(`data: ${JSON.stringify({ error: { message } })}\n\n`);
      res.end("data: [DONE]\n\n");
      return;
    }
    if (stream) {
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
      res.flushHeaders();
    }
    res.on("close", () => {
      if (ended) return;
      ended = true;
      for (const r of recs) if (r.state !== "done") sched.abort(r.rid, "the client disconnected");
    });
    for (const { rec, message } of late) {
      refused.add(rec);
      rec.state = "done";
      rec.finish = { type: "abort", message };
    }
    const admitted = recs.filter((r) => !refused.has(r));
    try {
      sched.submit(admitted);
      for (const { i, rec } of late) onUpdate(i)(rec);
    } catch (e) {
      ended = true;
      const message = e instanceof Error ? e.message : String(e);
      if (stream) {
        res.write(`data: ${JSON.stringify({ error: { message } })}\n\n`);
        res.end("data: [DONE]\n\n");
        return;
      }
      throw new HttpError(400, { error: { message } });
    }
  }

  async function health(): Promise<void> {
    if (status !== "ready") throw new HttpError(503, null);
    // A paused or updating engine is alive: its scheduler is held on purpose.
    if (sched.pauseMode !== null || updating) return;
    const rid = `HEALTH_CHECK_${newRid()}`;
    const ok = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => {
        sched.abort(rid, "health check timed out");
        resolve(false);
      }, healthTimeoutMs);
      const rec = newSchedRequest(
        rid,
        new Int32Array([0]),
        { maxNewTokens: 1, temperature: 0, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: false, seed: 0 },
        [],
        (r) => {
          if (r.state !== "done") return;
          clearTimeout(timer);
          resolve(r.error === null && r.outIds.length > 0);
        },
        true,
      );
      try {
        sched.submit([rec]);
      } catch {
        clearTimeout(timer);
        resolve(false);
      }
    });
    if (!ok) throw new HttpError(503, null);
  }

  async function updateWeights(body: unknown): Promise<[number, unknown]> {
    const p = updateSchema.safeParse(body);
    if (!p.success) throw new HttpError(400, badRequestBody(zodMessage(p.error)));
    const u = p.data;
    const run = async (): Promise<[number, unknown]> => {
      updating = true;
      let paused = 0;
      try {
        if (u.abort_all_requests) sched.abortAll("Aborted by /update_weights_from_disk (abort_all_requests)");
        const kept = await sched.holdAndDrain();
        paused = sched.pauseMode === null ? 0 : kept;
        const flush = u.flush_cache ?? true;
        await loadWeights({ modelPath: u.model_path, loadFormat: u.load_format ?? null, weightVersion: u.weight_version ?? null, currentVersion: weightVersion, keepCache: !flush });
        modelPath = u.model_path;
        if (u.weight_version !== undefined && u.weight_version !== null) weightVersion = u.weight_version;
        if (flush) backend.flushCache();
        return [200, { success: true, message: "Succeeded to update model weights.", num_paused_requests: paused }];
      } catch (e) {
        const message = `Failed to update weights: ${e instanceof Error ? e.message : String(e)}`;
        return [400, { success: false, message, num_paused_requests: paused }];
      } finally {
        sched.release();
        updating = false;
      }
    };
    const result = updateChain.then(run, run);
    updateChain = result.catch(() => undefined);
    return result;
  }

  function loads(): Record<string, unknown> {
    const c = sched.counts(maxRunning);
    const stats = backend.cacheStats();
    return {
      timestamp: Date.now() / 1000,
      dp_rank_count: 1,
      loads: [
        {
          dp_rank: 0,
          num_running_reqs: c.running,
          num_waiting_reqs: c.waiting,
          num_used_tokens: stats.cachedTokens,
          max_total_num_tokens: stats.budgetTokens,
          token_usage: stats.budgetTokens > 0 ? stats.cachedTokens / stats.budgetTokens : 0,
        },
      ],
    };
  }

  function modelInfo(): Record<string, unknown> {
    const cfg = backend.info.config;
    return {
      model_path: modelPath,
      tokenizer_path: null,
      is_generation: true,
      preferred_sampling_params: null,
      weight_version: weightVersion,
      has_image_understanding: false,
      has_audio_understanding: false,
      model_type: typeof cfg.model_type === "string" ? cfg.model_type : "llama",
      architectures: Array.isArray(cfg.architectures) ? cfg.architectures : null,
      // Not in SGLang's answer: the HF config, so a fleet can check dimensions and vocabulary too.
      config: cfg,
    };
  }

  function serverInfo(): Record<string, unknown> {
    const stats = backend.cacheStats();
    return {
      model_path: modelPath,
      tokenizer_path: null,
      host,
      port,
      tp_size: 1,
      dp_size: 1,
      pp_size: 1,
      page_size: 1,
      max_running_requests: maxRunning,
      context_length: backend.info.maxContext,
      skip_tokenizer_init: false,
      max_total_num_tokens: stats.budgetTokens,
      max_req_input_len: limits().maxReqInputLen,
      weight_version: weightVersion,
      ...lora.info(),
      version: "ooze-0.1.0",
      internal_states: [{ cache: stats, paused: sched.pauseMode }],
    };
  }

  type Handler = (req: IncomingMessage, res: ServerResponse, body: unknown) => Promise<[number, unknown] | void>;
  const routes = new Map<string, { methods: string[]; emptyBodyOk: boolean; handler: Handler }>();
  const route = (paths: string[], methods: string[], handler: Handler, emptyBodyOk = true) => {
    for (const p of paths) routes.set(p, { methods, emptyBodyOk, handler });
  };
  route(["/generate"], ["POST", "PUT"], (req, res, body) => generate(req, res, body), false);
  route(["/health", "/health_generate"], ["GET", "POST"], async () => {
    await health();
    return [200, null];
  });
  route(["/model_info", "/get_model_info"], ["GET"], async () => [200, modelInfo()]);
  route(["/server_info", "/get_server_info"], ["GET"], async () => [200, serverInfo()]);
  route(["/get_weight_version"], ["GET"], async () => [200, { weight_version: weightVersion }]);
  route(["/flush_cache"], ["GET", "POST"], async () => {
    // Running, waiting (paused or held) or updating: nothing is flushed, as in SGLang.
    if (sched.busy() || updating) return [400, new UntypedText(FLUSH_TEXT)];
    return [backend.flushCache() ? 200 : 400, new UntypedText(FLUSH_TEXT)];
  });
  route(["/update_weights_from_disk"], ["POST"], async (_q, _r, body) => updateWeights(body));
  route(["/pause_generation"], ["POST"], async (_q, _r, body) => {
    const p = pauseSchema.safeParse(body);
    if (!p.success) throw new HttpError(400, badRequestBody(zodMessage(p.error)));
    await sched.pause((p.data.mode ?? "abort") as PauseMode);
    return [200, OK_PAUSE];
  });
  route(["/continue_generation"], ["POST"], async () => {
    sched.resume();
    return [200, OK_CONTINUE];
  });
  route(["/abort_request"], ["POST"], async (_q, _r, body) => {
    const p = abortSchema.safeParse(body);
    if (!p.success) throw new HttpError(400, badRequestBody(zodMessage(p.error)));
    if (p.data.abort_all) sched.abortAll();
    else if (p.data.rid) sched.abort(p.data.rid);
    return [200, null];
  });
  route(["/load_lora_adapter"], ["POST"], async (_q, _r, body) => lora.load(body), false);
  route(["/unload_lora_adapter"], ["POST"], async (_q, _r, body) => lora.unload(body), false);
  route(["/v1/loads", "/get_loads"], ["GET"], async () => [200, loads()]);
  route(["/metrics"], ["GET"], async (_q, res) => sendMetrics(res, registry));

  const readTimeoutMs = opts.requestReadTimeoutMs ?? 0;
  // (Node checks the deadlines on this interval; its default, 30 s, would let a short one run long)
  const server = createServer({ connectionsCheckingInterval: readTimeoutMs > 0 ? Math.max(100, Math.min(30_000, readTimeoutMs / 4)) : 30_000 }, (req, res) => {
    void (async () => {
      try {
        const path = (req.url ?? "/").split("?")[0]!;
        const r = routes.get(path);
        if (!r) {
          req.resume();
          return send(res, 404, { detail: "Not Found" });
        }
        if (!r.methods.includes(req.method ?? "")) {
          req.resume();
          return send(res, 405, { detail: "Method Not Allowed" });
        }
        const text = req.method === "GET" ? (req.resume(), "") : await readBody(req, maxBody);
        const body = parseJsonBody(text, r.emptyBodyOk);
        const out = await r.handler(req, res, body);
        if (out) send(res, out[0], out[1]);
      } catch (e) {
        if (e instanceof HttpError) {
          m.errors.inc({ model_name: modelName, code: String(e.status) });
          return send(res, e.status, e.body);
        }
        m.errors.inc({ model_name: modelName, code: "500" });
        const message = e instanceof Error ? e.message : String(e);
        if (res.headersSent) res.destroy();
        else send(res, 500, { error: { message } });
      }
    })();
  });
  // Idle keep-alive connections stay 30 s (Node's default is 5): clients retire theirs after 4 s
  // (src/engine/http.ts), and a client whose event loop runs late must not send on a connection the
  // server is closing at that moment.
  server.keepAliveTimeout = opts.keepAliveMs ?? 30_000;
  server.requestTimeout = readTimeoutMs;
  server.headersTimeout = readTimeoutMs;
  // A request the HTTP parser could not read, or one that ran past Node's headersTimeout or
  // requestTimeout: answered as Node answers it (400, 431 or 408, and only on a connection that has
  // carried no response yet), but with a body that says which, so that the client's error names the
  // cause. On a kept-alive connection the answer could be read as that of a later request, and a 400
  // fails the request for good where a lost connection is retried: such a connection is closed. (It
  // answered a bare 400 on any writable connection until Dec 1, when 2,052 episodes of a 1,024-engine
  // run failed with "rejected the request with 400" and no reason.)
  server.on("clientError", (err: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || (socket as Socket).bytesWritten > 0) {
      socket.destroy();
      return;
    }
    const [status, reason] = err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? [408, "Request Timeout"] : err.code === "HPE_HEADER_OVERFLOW" ? [431, "Request Header Fields Too Large"] : [400, "Bad Request"];
    m.errors.inc({ model_name: modelName, code: String(status) });
    const body = JSON.stringify({ error: { message: `the server could not read the request (${err.code ?? "no code"}): ${err.message}` } });
    socket.end(`HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  port = (server.address() as AddressInfo).port;
  status = "ready";
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}`,
    port,
    async close() {
      if (status === "stopping") return;
      status = "stopping";
      sched.abortAll("the server is stopping");
      await sched.waitIdle();
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}
