// The agent gateway: an HTTP server (127.0.0.1 by default) speaking OpenAI's chat completions and
// Responses APIs and Anthropic's messages API, one session per episode under its own base path
// `/s/<session>/v1` and its own generated API key. Requests become token-in/token-out generations
// on the fleet with the session as routing key (see session.ts); closing a session hands back its
// samples.
import { randomBytes, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from "node:net";
import { OozeError } from "../errors.ts";
import { counter, gauge, histogram, newRegistry, sendMetrics, type Counter, type Histogram, type Registry } from "../metrics.ts";
import { anthropicModelsBody, AnthropicStream, messageBody } from "./anthropic.ts";
import { GatewayError } from "./errors.ts";
import { parseAnthropicRequest, parseOpenAIRequest } from "./messages.ts";
import { completionBody, modelsBody, OpenAIStream } from "./openai.ts";
import { ReplyFormat, type ReplyFormatSpec } from "./reply-format.ts";
import { ResponsesApi } from "./responses.ts";
import { Session, type Generator, type SessionReport, type SessionSettings } from "./session.ts";
import { BuiltinChatTemplate, JinjaChatTemplate, type ChatTemplate } from "./template.ts";
import { byteChatTokenizer, type ChatTokenizer } from "./tokenizer.ts";

/** Options of `Gateway.start`. */
export interface GatewayOptions {
  /** Where generations go: a Fleet (or anything with its `generate`). */
  fleet: Generator;
  /** Default: the embedded model's byte tokenizer. */
  tokenizer?: ChatTokenizer;
  /** Jinja source (HF `chat_template`) or a ChatTemplate; default: the byte-level model's built-in template. */
  chatTemplate?: string | ChatTemplate;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port). */
  port?: number;
  /** The model's context length: prompts that leave no room are refused. */
  contextLength: number;
  /** max_tokens when a request gives none (default 1024; clamped to the context). */
  defaultMaxTokens?: number;
  /**
   * The model name(s) served (default "ooze"): a request naming another is answered 404
   * (model_not_found); one naming none gets the first. Every name is the same policy, unless
   * `policies` says otherwise.
   */
  model?: string | readonly string[];
  /**
   * Several policies (a job training one per agent role): model name → the policy's LoRA adapter on
   * the engines (null: the base). A request's `model` picks the policy that samples and learns its
   * turn (the session still scopes the trajectory; a segment never mixes policies). The names
   * served are these; one naming none gets the first.
   */
  policies?: Readonly<Record<string, { lora: string | null }>> | null;
  /**
   * How the model writes tool calls and reasoning (reply-format.ts); default: detected from the chat
   * template (`<tool_call>` → hermes, `<|python_tag|>` → llama3_json, else hermes; `</think>` →
   * reasoning). Give it for a template that detection reads wrong.
   */
  replyFormat?: Partial<ReplyFormatSpec>;
  /** Largest request body, bytes (default 32 MiB). */
  maxBodyBytes?: number;
}

/** What `openSession` hands to the agent runner. */
export interface OpenedSession {
  id: string;
  /** For OPENAI_BASE_URL (ends in /v1). */
  openaiBaseUrl: string;
  /** For ANTHROPIC_BASE_URL (the SDK appends /v1/messages). */
  anthropicBaseUrl: string;
  apiKey: string;
}

/** Sent by SDKs on every request; accepted in either header. */
function presentedKey(req: IncomingMessage): string | null {
  const auth = req.headers.authorization;
  if (typeof auth === "string" && /^Bearer\s+/i.test(auth)) return auth.replace(/^Bearer\s+/i, "").trim();
  const x = req.headers["x-api-key"];
  return typeof x === "string" ? x : null;
}

function sameKey(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** The gateway server. */
export class Gateway {
  private readonly sessions = new Map<string, Session>();
  private readonly created = Math.floor(Date.now() / 1000);
  /** Answer ids: this gateway's random prefix and a count (unique without a random draw per answer). */
  private readonly idPrefix = randomBytes(6).toString("hex");
  private answers = 0;
  private readonly tokenizer: ChatTokenizer;
  private readonly template: ChatTemplate;
  private readonly models: readonly string[];
  private readonly format: ReplyFormat;
  /** POST /v1/responses: a translation onto the chat path, with the sessions' stored responses. */
  private readonly responses: ResponsesApi;
  private readonly maxBody: number;
  /** Prometheus metrics, served at GET /metrics on the main listener. */
  private readonly metrics: {
    registry: Registry; requests: Counter<string>; seconds: Histogram<string>;
    promptTokens: Counter<string>; cachedTokens: Counter<string>; completionTokens: Counter<string>;
  };
  private readonly ctx: ConstructorParameters<typeof Session>[3];
  private base = "";
  /** Sessions served on a Unix socket of their own (listenSession), and the connections that came through each. */
  private readonly own = new Map<string, { server: NetServer; conns: Set<Socket> }>();
  /** A connection that came through a session's own socket → that session: it may address no other. */
  private readonly boundTo = new WeakMap<Socket, string>();

  private constructor(
    private readonly server: Server,
    opts: GatewayOptions,
  ) {
    this.tokenizer = opts.tokenizer ?? byteChatTokenizer();
    const t = opts.chatTemplate ?? new BuiltinChatTemplate(this.tokenizer);
    this.template = typeof t === "string" ? new JinjaChatTemplate(t, this.tokenizer) : t;
    const policies = opts.policies ?? null;
    this.models = policies ? Object.keys(policies) : typeof opts.model === "string" ? [opts.model] : opts.model ? [...opts.model] : ["ooze"];
    if (this.models.length === 0 || this.models.some((m) => typeof m !== "string" || m === "")) {
      throw new OozeError("CONFIG_INVALID", `gateway: model must be a non-empty name or a non-empty list of them (got ${JSON.stringify(opts.model)})`);
    }
    this.format = ReplyFormat.of(this.template, this.template instanceof JinjaChatTemplate ? this.template.source : null, opts.replyFormat);
    this.responses = new ResponsesApi(this.tokenizer, this.format);
    this.maxBody = opts.maxBodyBytes ?? 32 * 1024 * 1024;
    const reg = newRegistry();
    gauge(reg, "ooze_gateway_sessions_open", "Agent sessions open.", [], (g) => g.set(this.sessions.size));
    this.metrics = {
      registry: reg,
      requests: counter(reg, "ooze_gateway_requests_total", "Requests answered, by API and HTTP status code.", ["api", "code"]),
      seconds: histogram(reg, "ooze_gateway_request_duration_seconds", "Time to the whole answer (a stream's end), by API.", ["api"]),
      promptTokens: counter(reg, "ooze_gateway_prompt_tokens_total", "Prompt tokens of the turns sent to the engines."),
      cachedTokens: counter(reg, "ooze_gateway_cached_tokens_total", "Prompt tokens the engines served from their prefix cache."),
      completionTokens: counter(reg, "ooze_gateway_completion_tokens_total", "Tokens the engines sampled for the turns."),
    };
    if (!Number.isInteger(opts.contextLength) || opts.contextLength < 2) {
      throw new OozeError("CONFIG_INVALID", `gateway: contextLength must be an integer ≥ 2 (got ${String(opts.contextLength)})`);
    }
    this.ctx = {
      generator: opts.fleet,
      tokenizer: this.tokenizer,
      template: this.template,
      contextLength: opts.contextLength,
      defaultMaxTokens: opts.defaultMaxTokens ?? 1024,
      ...(policies
        ? {
            policyOf: (model: string | null) => {
              const name = model ?? this.models[0]!;
              const p = policies[name];
              return p ? { name, lora: p.lora } : null;
            },
          }
        : {}),
    };
  }

  /** Base URL of the server, e.g. http://127.0.0.1:PORT. */
  get url(): string {
    return this.base;
  }

  /** Starts the server (127.0.0.1 and a free port unless given). */
  static async start(opts: GatewayOptions): Promise<Gateway> {
    const server = createServer();
    const g = new Gateway(server, opts);
    server.on("request", (req, res) => void g.handle(req, res));
    const host = opts.host ?? "127.0.0.1";
    await new Promise<void>((resolve, reject) => {
      server.once("error", (e) => reject(new OozeError("CONFIG_INVALID", `gateway: cannot listen on ${host}:${opts.port ?? 0}: ${e.message}`, { cause: e })));
      server.listen(opts.port ?? 0, host, () => resolve());
    });
    const a = server.address() as AddressInfo;
    g.base = `http://${a.family === "IPv6" ? `[${a.address}]` : a.address}:${a.port}`;
    return g;
  }

  /** Opens an episode's session: its base URLs and API key. */
  openSession(s: SessionSettings): OpenedSession {
    for (const [k, v] of [["maxTurns", s.maxTurns], ["maxTokens", s.maxTokens]] as const) {
      if (v !== undefined && (!Number.isInteger(v) || v < 1)) throw new OozeError("CONFIG_INVALID", `gateway.openSession: ${k} must be a positive integer (got ${String(v)})`);
    }
    const id = randomBytes(9).toString("hex");
    const apiKey = `ooze-${randomBytes(24).toString("base64url")}`;
    this.sessions.set(id, new Session(id, apiKey, { ...s }, this.ctx));
    return { id, openaiBaseUrl: `${this.url}/s/${id}/v1`, anthropicBaseUrl: `${this.url}/s/${id}`, apiKey };
  }

  /** A session's counters (requests, generations in flight, segments, sampled tokens), or null when not open. */
  sessionStats(id: string): Session["stats"] | null {
    return this.sessions.get(id)?.stats ?? null;
  }

  /**
   * Serves session `id` on a Unix socket at `path` as well (an agent sandbox's one endpoint, forwarded
   * to its loopback): a request arriving through it may address this session only (another session's
   * URL answers 404 as an unknown one, whatever key it carries). The socket goes with the session.
   */
  async listenSession(id: string, path: string): Promise<void> {
    if (!this.sessions.has(id)) throw new OozeError("CONFIG_INVALID", `gateway.listenSession: no open session '${id}'`);
    const conns = new Set<Socket>();
    const server = createNetServer((sock) => {
      this.boundTo.set(sock, id);
      conns.add(sock);
      sock.once("close", () => conns.delete(sock));
      this.server.emit("connection", sock);
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", (e) => reject(new OozeError("CONFIG_INVALID", `gateway: cannot listen on the Unix socket ${path} for session ${id}: ${e.message}`, { cause: e })));
      server.listen(path, () => resolve());
    });
    this.own.set(id, { server, conns });
  }

  /** Closes a session: later requests get 404; returns one sample per trajectory segment. */
  closeSession(id: string): SessionReport {
    const s = this.sessions.get(id);
    if (!s) throw new OozeError("CONFIG_INVALID", `gateway.closeSession: no open session '${id}'`);
    this.sessions.delete(id);
    const own = this.own.get(id);
    if (own) {
      this.own.delete(id);
      own.server.close();
      for (const c of own.conns) c.destroy();
    }
    this.ctx.generator.endSession?.(id);
    return s.close();
  }

  /** Closes every session and the server. */
  async close(): Promise<void> {
    for (const id of [...this.sessions.keys()]) this.closeSession(id);
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  // ---------------------------------------------------------------------------------------------

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0]!;
    // Prometheus scrapes the main listener; a session's own socket (an agent's sandbox) serves its session only.
    if (path === "/metrics" && req.method === "GET" && !this.boundTo.has(req.socket)) return sendMetrics(res, this.metrics.registry);
    const t0 = performance.now();
    const api = /\/v1\/(chat\/completions|messages|responses|models)\/?$/.exec(path)?.[1] ?? "other";
    res.once("finish", () => {
      this.metrics.requests.inc({ api, code: String(res.statusCode) });
      this.metrics.seconds.observe({ api }, (performance.now() - t0) / 1000);
    });
    const m = /^\/s\/([^/]+)\/v1\/(chat\/completions|messages|responses|models)\/?$/.exec(path);
    // Which dialect to answer errors in: by path, else by the key header the SDK sent.
    const anthropic = m ? m[2] === "messages" || (m[2] === "models" && req.headers["x-api-key"] !== undefined) : req.headers["x-api-key"] !== undefined;
    const fail = (e: GatewayError) => send(res, e.status, anthropic ? e.anthropic() : e.openai());
    try {
      if (!m) throw new GatewayError("not_found", `no such endpoint: ${req.method ?? "GET"} ${path}; sessions are served under /s/<session>/v1 (chat/completions, messages, responses, models)`);
      const only = this.boundTo.get(req.socket);
      const session = only === undefined || only === m[1] ? this.sessions.get(m[1]!) : undefined;
      if (!session) throw new GatewayError("not_found", `unknown or closed session '${m[1]}'`);
      const key = presentedKey(req);
      if (key === null) throw new GatewayError("authentication", "no API key: send the session's key as 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
      if (!sameKey(key, session.apiKey)) throw new GatewayError("authentication", `the API key is not the one of session '${session.id}'`);
      const endpoint = m[2]!;
      if (endpoint === "models") {
        if (req.method !== "GET") throw new GatewayError("method", `${req.method} ${path}: use GET`);
        return send(res, 200, anthropic ? anthropicModelsBody(this.models, this.created) : modelsBody(this.models, this.created));
      }
      if (req.method !== "POST") throw new GatewayError("method", `${req.method} ${path}: use POST`);
      session.requests++;
      const body = await this.readJson(req);
      await this.chat(session, endpoint, body, req, res);
    } catch (e) {
      const ge = e instanceof GatewayError ? e : new GatewayError("internal", `gateway: ${(e as Error).message}`, null, { cause: e });
      if (!res.headersSent) fail(ge);
      else if (!res.writableEnded) res.end();
    }
  }

  private async chat(session: Session, endpoint: string, body: unknown, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const anthropic = endpoint === "messages";
    const responses = endpoint === "responses";
    const chatReq = responses ? this.responses.parse(session, body) : anthropic ? parseAnthropicRequest(body) : parseOpenAIRequest(body);
    if (chatReq.model !== null && !this.models.includes(chatReq.model)) {
      throw new GatewayError(
        "model_not_found",
        anthropic ? `model: ${chatReq.model} (this gateway serves ${this.models.join(", ")})` : `The model \`${chatReq.model}\` does not exist or you do not have access to it (this gateway serves ${this.models.join(", ")})`,
        "model",
      );
    }
    const model = chatReq.model ?? this.models[0]!;
    // What the reply is parsed as, a forced call's opening, engine stops, template variables.
    chatReq.output = this.format.plan(chatReq);
    const ctl = new AbortController();
    // The agent went away before the answer: abort the generation (its partial turn is recorded once).
    const onClose = () => {
      if (!res.writableEnded) ctl.abort();
    };
    res.on("close", onClose);
    const id = `${responses ? "resp_" : anthropic ? "msg_" : "chatcmpl-"}${this.idPrefix}${(++this.answers).toString(36)}`;
    const stream = chatReq.stream
      ? responses
        ? this.responses.stream(res, id, model, chatReq)
        : anthropic
        ? new AnthropicStream(res, id, model, chatReq, this.tokenizer)
        : new OpenAIStream(res, id, model, chatReq, this.tokenizer)
      : null;
    // Each streamed chunk of the engine's: the text it completes goes out. A failure to write it
    // ends the agent's stream (its generation is then aborted and recorded once), never the fleet's request.
    const onTokens =
      stream === null
        ? undefined
        : (k: number, ids: Int32Array, lps: Float32Array) => {
            try {
              if (stream instanceof AnthropicStream) stream.progress(ids);
              else stream.progress(k, ids, lps);
            } catch (e) {
              res.destroy(e as Error);
            }
          };
    try {
      const pending = session.turn(chatReq, ctl.signal, onTokens);
      if (stream) {
        // Refusals that need no generation (limits, context) come before the stream's headers.
        const first = await Promise.race([pending.then(() => null, (e: unknown) => e), new Promise((r) => setImmediate(() => r("running")))]);
        if (first !== "running" && first !== null) throw first;
        stream.start();
      }
      let result;
      try {
        result = await pending;
      } catch (e) {
        const ge = e instanceof GatewayError ? e : new GatewayError("internal", (e as Error).message, null, { cause: e });
        if (stream && !res.writableEnded) return stream.fail(ge);
        throw ge;
      }
      this.metrics.promptTokens.inc(result.promptTokens);
      this.metrics.cachedTokens.inc(result.cachedTokens);
      this.metrics.completionTokens.inc(result.choices.reduce((n, c) => n + c.ids.length, 0));
      if (res.destroyed) return;
      if (stream) stream.finish(result);
      else {
        const body = responses ? this.responses.body(id, model, chatReq, result) : anthropic ? messageBody(id, model, result) : completionBody(id, model, chatReq, result, this.tokenizer);
        send(res, 200, body, result.weightVersion === null ? {} : { [WEIGHT_VERSION_HEADER]: result.weightVersion });
      }
    } finally {
      res.off("close", onClose);
    }
  }

  private readJson(req: IncomingMessage): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      req.on("data", (c: Buffer) => {
        size += c.length;
        if (size > this.maxBody) {
          // Refused at once; the rest of the body is drained so the answer reaches the client.
          reject(new GatewayError("too_large", `the request body is over ${this.maxBody} bytes`));
          req.removeAllListeners("data");
          req.resume();
          return;
        }
        chunks.push(c);
      });
      req.on("error", (e) => reject(new GatewayError("invalid_request", `reading the request failed: ${e.message}`)));
      req.on("close", () => {
        if (!req.complete) reject(new GatewayError("invalid_request", "the client closed the connection before the whole body arrived"));
      });
      req.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        try {
          resolve(JSON.parse(text));
        } catch (e) {
          reject(new GatewayError("invalid_request", `the request body is not valid JSON: ${(e as Error).message}`, "body"));
        }
      });
    });
  }
}

/** Response header naming the weight version that sampled a non-streamed answer. */
export const WEIGHT_VERSION_HEADER = "x-ooze-weight-version";

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text), ...headers });
  res.end(text);
}
