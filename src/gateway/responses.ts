// OpenAI's Responses API (`POST /v1/responses`) as a translation layer onto the chat path: a request's
// conversation — the session's earlier response named by `previous_response_id` (its input and
// output items), then this request's `input` items — becomes chat-completions messages (an assistant
// turn is its reasoning item, message and function_call items together; function_call_output items
// become tool messages; `instructions` a system message first), parsed by `parseOpenAIRequest` into
// the gateway's ChatRequest and run by the session like any chat request: the same rendering, the
// same extend-or-split, the same recorded ids. Sending a response's output items back as input and
// naming it in `previous_response_id` give the same messages, hence the same tokens. The answer is a
// `response` object (reasoning, message and function_call items, usage) or its event stream
// (response.created … response.completed / response.incomplete, each event with `sequence_number`).
// Fields this gateway cannot honour (built-in tools, background, conversations, JSON output,
// logprobs, non-text input) are refused with 400 naming the field; unknown fields too, as OpenAI does.
import type { ServerResponse } from "node:http";
import { GatewayError, invalid } from "./errors.ts";
import { parseOpenAIRequest, type ChatRequest } from "./messages.ts";
import type { ReplyFormat } from "./reply-format.ts";
import type { Session, TurnChoice, TurnResult } from "./session.ts";
import { TextStreamer, type ReplyDelta } from "./stream-text.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const given = (v: unknown): boolean => v !== undefined && v !== null;

/** A conversation item, normalised: what input items and a response's output items both become. */
type Item =
  | { type: "message"; role: "user" | "system" | "developer" | "assistant"; text: string }
  | { type: "function_call"; callId: string; name: string; arguments: string }
  | { type: "function_call_output"; callId: string; output: string }
  | { type: "reasoning"; text: string };

/** What a request asked for, kept for its answer (echoed fields) and for remembering the response. */
interface RequestContext {
  session: Session;
  /** The conversation before the answer: the previous response's items, then this input's. */
  items: Item[];
  store: boolean;
  /** include: ["reasoning.encrypted_content"]: reasoning items carry their text as an opaque string. */
  encryptedReasoning: boolean;
  /** Fields the response object echoes. */
  echo: Obj;
}

/** A 400 with OpenAI's `code` for it (previous_response_not_found, unknown_parameter). */
class ResponsesRequestError extends GatewayError {
  constructor(
    message: string,
    param: string,
    private readonly apiCode: string,
  ) {
    super("invalid_request", message, param);
  }

  override openai(): ReturnType<GatewayError["openai"]> {
    const b = super.openai();
    return { error: { ...b.error, code: this.apiCode } };
  }
}

/** Request fields of the Responses API this gateway reads (some only to refuse them by name). */
const KNOWN = new Set([
  "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "max_output_tokens", "stream",
  "stream_options", "previous_response_id", "store", "metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
  "prompt_cache_options", "service_tier", "truncation", "reasoning", "text", "include", "top_logprobs", "max_tool_calls", "background",
  "conversation", "prompt", "context_management", "moderation",
]);

const EFFORTS = new Set(["none", "minimal", "low", "medium", "high", "xhigh"]);
const SUMMARIES = new Set(["auto", "concise", "detailed"]);
const ENCRYPTED_PREFIX = "ooze-reasoning:";

function refuse(param: string, message: string): GatewayError {
  return new GatewayError("invalid_request", message, param);
}

/**
 * The Responses endpoint of one gateway: parses requests into ChatRequests (continuing the session's
 * stored responses), shapes answers and streams, and keeps each session's responses (store ≠ false)
 * until the session is gone.
 */
export class ResponsesApi {
  private readonly stored = new WeakMap<Session, Map<string, Item[]>>();
  private readonly contexts = new WeakMap<ChatRequest, RequestContext>();

  constructor(
    private readonly tok: ChatTokenizer,
    private readonly format: ReplyFormat,
  ) {}

  /** A Responses request body → the gateway's ChatRequest (refusing what cannot be honoured). */
  parse(session: Session, body: unknown): ChatRequest {
    if (!isObj(body)) throw invalid("body", "a JSON object", body);
    for (const k of Object.keys(body)) {
      if (!KNOWN.has(k)) throw new ResponsesRequestError(`Unknown parameter: '${k}'.`, k, "unknown_parameter");
    }
    refuseUnserved(body);
    const encryptedReasoning = includes(body.include);
    let previous: Item[] = [];
    const prevId = body.previous_response_id;
    if (given(prevId)) {
      if (typeof prevId !== "string") throw invalid("previous_response_id", "a string", prevId);
      const items = this.stored.get(session)?.get(prevId);
      if (!items) {
        throw new ResponsesRequestError(
          `Previous response with id '${prevId}' not found. Responses are kept per session while it is open, unless made with store: false; send the conversation's items instead.`,
          "previous_response_id",
          "previous_response_not_found",
        );
      }
      previous = items;
    }
    const input = inputItems(body.input);
    const instructions = body.instructions;
    if (given(instructions) && typeof instructions !== "string") throw invalid("instructions", "a string", instructions);
    const items = [...previous, ...input];
    const tools = functionTools(body.tools);
    if (given(body.max_output_tokens) && !(Number.isInteger(body.max_output_tokens) && (body.max_output_tokens as number) >= 1)) {
      throw invalid("max_output_tokens", "a positive integer", body.max_output_tokens);
    }
    if (given(body.store) && typeof body.store !== "boolean") throw invalid("store", "a boolean", body.store);
    if (given(body.metadata) && !(isObj(body.metadata) && Object.values(body.metadata).every((v) => typeof v === "string"))) {
      throw invalid("metadata", "an object of string values", body.metadata);
    }
    if (given(body.stream_options) && !isObj(body.stream_options)) throw invalid("stream_options", "an object", body.stream_options);
    const chatBody: Obj = {
      messages: chatMessages(typeof instructions === "string" ? instructions : "", items),
      tools: tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description ?? "", parameters: t.parameters } })),
      tool_choice: chatToolChoice(body.tool_choice),
    };
    if (given(body.model)) chatBody.model = body.model;
    for (const [from, to] of [["parallel_tool_calls", "parallel_tool_calls"], ["temperature", "temperature"], ["top_p", "top_p"], ["max_output_tokens", "max_completion_tokens"], ["stream", "stream"]] as const) {
      if (given(body[from])) chatBody[to] = body[from];
    }
    const req = parseOpenAIRequest(chatBody);
    req.thinking = this.thinking(body.reasoning);
    const temperature = session.settings.temperature ?? req.temperature ?? 1;
    this.contexts.set(req, {
      session,
      items,
      store: body.store !== false,
      encryptedReasoning,
      echo: {
        instructions: typeof instructions === "string" ? instructions : null,
        max_output_tokens: req.maxTokens,
        parallel_tool_calls: req.parallelToolCalls,
        previous_response_id: typeof prevId === "string" ? prevId : null,
        reasoning: isObj(body.reasoning) ? { effort: body.reasoning.effort ?? null, summary: body.reasoning.summary ?? null } : { effort: null, summary: null },
        store: body.store !== false,
        temperature,
        text: { format: { type: "text" }, verbosity: "medium" },
        tool_choice: given(body.tool_choice) ? body.tool_choice : "auto",
        tools: tools.map((t) => ({ type: "function", name: t.name, description: t.description, parameters: t.parameters, strict: t.strict })),
        top_p: req.topP ?? 1,
        truncation: "disabled",
        metadata: isObj(body.metadata) ? body.metadata : {},
      },
    });
    return req;
  }

  /** A non-streamed `response` object for a finished request (kept for previous_response_id unless store was false). */
  body(id: string, model: string, req: ChatRequest, r: TurnResult): Obj {
    const ctx = this.context(req);
    const c = r.choices[0]!;
    const output = outputItems(id, c, ctx.encryptedReasoning);
    this.remember(ctx, id, c);
    return responseObject(ctx, id, model, Math.floor(Date.now() / 1000), statusOf(c), output, usage(r, c, this.tok));
  }

  /** The event stream of a request. */
  stream(res: ServerResponse, id: string, model: string, req: ChatRequest): ResponsesStream {
    return new ResponsesStream(res, id, model, req, this.tok, this.context(req), (c) => this.remember(this.context(req), id, c));
  }

  private context(req: ChatRequest): RequestContext {
    const ctx = this.contexts.get(req);
    if (!ctx) throw new GatewayError("internal", "responses: a request reached the Responses API without being parsed by it");
    return ctx;
  }

  private remember(ctx: RequestContext, id: string, c: TurnChoice): void {
    if (!ctx.store) return;
    let m = this.stored.get(ctx.session);
    if (!m) this.stored.set(ctx.session, (m = new Map()));
    m.set(id, [...ctx.items, ...outputAsItems(c)]);
  }

  /**
   * `reasoning.effort` → the request's thinking switch: "none" turns thinking off, any other effort
   * on (for a template with an enable_thinking switch); the level itself is not honoured (no
   * reasoning budget). A model that cannot do what is asked is refused by name.
   */
  private thinking(v: unknown): boolean | null {
    if (!given(v)) return null;
    if (!isObj(v)) throw invalid("reasoning", `an object {effort, summary}`, v);
    for (const k of ["summary", "generate_summary"]) {
      if (given(v[k]) && !SUMMARIES.has(v[k] as string)) throw invalid(`reasoning.${k}`, `"auto", "concise" or "detailed"`, v[k]);
    }
    const effort = v.effort;
    if (!given(effort)) return null;
    if (typeof effort !== "string" || !EFFORTS.has(effort)) throw invalid("reasoning.effort", `one of ${[...EFFORTS].map((e) => `"${e}"`).join(", ")}`, effort);
    const off = effort === "none";
    if (!this.format.spec.reasoning) {
      if (off) return null;
      throw refuse("reasoning.effort", `'reasoning.effort' "${effort}" is not supported by this model: its chat template has no reasoning (<think>) block; leave 'reasoning' out or use effort "none"`);
    }
    if (this.format.thinkingSwitch) return !off;
    if (off) throw refuse("reasoning.effort", `'reasoning.effort' "none" is not supported by this model: it always reasons (its chat template has no enable_thinking switch); leave 'reasoning' out`);
    return null;
  }
}

/** Fields whose behaviour this gateway does not have: refused by name, never ignored. */
function refuseUnserved(b: Obj): void {
  if (given(b.background) && b.background !== false) throw refuse("background", "'background' responses are not supported by this gateway: it answers in the request; leave 'background' out or false");
  if (given(b.conversation)) throw refuse("conversation", "'conversation' is not supported by this gateway (no Conversations API); continue with 'previous_response_id' or send the items in 'input'");
  if (given(b.prompt)) throw refuse("prompt", "'prompt' (stored prompt templates) is not supported by this gateway; send 'instructions' and 'input'");
  if (given(b.context_management) && !(Array.isArray(b.context_management) && b.context_management.length === 0)) {
    throw refuse("context_management", "'context_management' (server-side compaction) is not supported by this gateway: it never rewrites the conversation; leave it out");
  }
  if (given(b.moderation)) throw refuse("moderation", "'moderation' is not supported by this gateway; leave it out");
  if (given(b.truncation) && b.truncation !== "disabled") throw refuse("truncation", `'truncation' "${String(b.truncation)}" is not supported by this gateway: it never drops items (a conversation over the context is refused); use "disabled" or leave it out`);
  if (given(b.top_logprobs) && b.top_logprobs !== 0) throw refuse("top_logprobs", "'top_logprobs' is not supported on /v1/responses by this gateway; use /v1/chat/completions with logprobs");
  if (given(b.max_tool_calls) && !(Number.isInteger(b.max_tool_calls) && (b.max_tool_calls as number) >= 1)) throw invalid("max_tool_calls", "a positive integer", b.max_tool_calls);
  for (const k of ["user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier"]) {
    if (given(b[k]) && typeof b[k] !== "string") throw invalid(k, "a string", b[k]);
  }
  if (given(b.text)) {
    if (!isObj(b.text)) throw invalid("text", "an object {format, verbosity}", b.text);
    const f = b.text.format;
    if (given(f) && !(isObj(f) && f.type === "text")) {
      throw refuse("text.format", `'text.format' of type '${isObj(f) ? String(f.type) : typeof f}' is not supported by this gateway: it has no constrained decoding; leave it out (or {"type": "text"}) and ask for JSON in the prompt`);
    }
    const vb = b.text.verbosity;
    if (given(vb) && vb !== "medium") throw refuse("text.verbosity", `'text.verbosity' "${String(vb)}" is not supported by this gateway (the model has no verbosity control); leave it out or "medium"`);
  }
}

/** `include`: only "reasoning.encrypted_content" can be honoured. */
function includes(v: unknown): boolean {
  if (!given(v)) return false;
  if (!Array.isArray(v)) throw invalid("include", "a list", v);
  v.forEach((x, i) => {
    if (x !== "reasoning.encrypted_content") {
      throw refuse(`include[${i}]`, `'include' "${String(x)}" is not supported by this gateway (it has no built-in tools, images or logprobs on /v1/responses); only "reasoning.encrypted_content"`);
    }
  });
  return v.length > 0;
}

/** Text of content parts: input_text / output_text (any role); anything else is refused. */
function partsText(v: unknown, path: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw invalid(path, "a string or a list of content parts", v);
  return v
    .map((p, j) => {
      if (!isObj(p)) throw invalid(`${path}[${j}]`, "a content part object", p);
      if (p.type !== "input_text" && p.type !== "output_text") throw invalid(`${path}[${j}].type`, `"input_text" or "output_text" (this gateway serves text models only)`, p.type);
      if (typeof p.text !== "string") throw invalid(`${path}[${j}].text`, "a string", p.text);
      return p.text;
    })
    .join("");
}

/** `input`: a string (one user message) or a non-empty list of items. */
function inputItems(v: unknown): Item[] {
  if (typeof v === "string") return [{ type: "message", role: "user", text: v }];
  if (!Array.isArray(v) || v.length === 0) throw invalid("input", "a string or a non-empty list of input items", v);
  return v.map((it, i): Item => {
    const p = `input[${i}]`;
    if (!isObj(it)) throw invalid(p, "an input item object", it);
    const type = it.type ?? (it.role !== undefined ? "message" : undefined);
    switch (type) {
      case "message": {
        const role = it.role;
        if (role !== "user" && role !== "system" && role !== "developer" && role !== "assistant") throw invalid(`${p}.role`, `one of "user", "system", "developer", "assistant"`, role);
        return { type: "message", role, text: partsText(it.content, `${p}.content`) };
      }
      case "function_call":
        if (typeof it.call_id !== "string" || it.call_id === "") throw invalid(`${p}.call_id`, "a non-empty string", it.call_id);
        if (typeof it.name !== "string" || it.name === "") throw invalid(`${p}.name`, "a non-empty string", it.name);
        if (typeof it.arguments !== "string") throw invalid(`${p}.arguments`, "a string (JSON text)", it.arguments);
        return { type: "function_call", callId: it.call_id, name: it.name, arguments: it.arguments };
      case "function_call_output":
        if (typeof it.call_id !== "string" || it.call_id === "") throw invalid(`${p}.call_id`, "a non-empty string", it.call_id);
        return { type: "function_call_output", callId: it.call_id, output: partsText(it.output, `${p}.output`) };
      case "reasoning":
        return { type: "reasoning", text: reasoningText(it, p) };
      case "item_reference":
        throw refuse(`${p}.type`, `'item_reference' input items are not supported by this gateway; send the item itself, or continue with 'previous_response_id'`);
      default:
        throw invalid(`${p}.type`, `"message", "function_call", "function_call_output" or "reasoning" (this gateway has no built-in tools)`, type);
    }
  });
}

/** A reasoning item's text: its reasoning_text content, else its encrypted_content (this gateway's), else its summary. */
function reasoningText(it: Obj, p: string): string {
  if (given(it.content)) {
    if (!Array.isArray(it.content)) throw invalid(`${p}.content`, "a list of reasoning_text parts", it.content);
    return it.content
      .map((c, j) => {
        if (!isObj(c) || c.type !== "reasoning_text" || typeof c.text !== "string") throw invalid(`${p}.content[${j}]`, `a part {type: "reasoning_text", text}`, c);
        return c.text;
      })
      .join("");
  }
  const enc = it.encrypted_content;
  if (given(enc)) {
    if (typeof enc === "string" && enc.startsWith(ENCRYPTED_PREFIX)) return Buffer.from(enc.slice(ENCRYPTED_PREFIX.length), "base64url").toString("utf8");
    if (!(Array.isArray(it.summary) && it.summary.length > 0)) {
      throw invalid(`${p}.encrypted_content`, "reasoning this gateway returned (it cannot read another server's encrypted reasoning); send the reasoning as content, or leave the item out", enc);
    }
  }
  if (!Array.isArray(it.summary)) throw invalid(`${p}.summary`, "a list of summary_text parts", it.summary);
  return it.summary
    .map((s, j) => {
      if (!isObj(s) || s.type !== "summary_text" || typeof s.text !== "string") throw invalid(`${p}.summary[${j}]`, `a part {type: "summary_text", text}`, s);
      return s.text;
    })
    .join("\n\n");
}

interface FunctionTool {
  name: string;
  description: string | null;
  parameters: Obj | null;
  strict: boolean | null;
}

/** `tools`: function tools only (the agent runs them); built-in tools are refused by name. */
function functionTools(v: unknown): FunctionTool[] {
  if (!given(v)) return [];
  if (!Array.isArray(v)) throw invalid("tools", "a list of tools", v);
  return v.map((t, i) => {
    const p = `tools[${i}]`;
    if (!isObj(t)) throw invalid(p, "a tool object", t);
    if (t.type !== "function") {
      throw refuse(`${p}.type`, `tools of type '${String(t.type)}' are not supported by this gateway: it has no built-in tools; offer {"type": "function", "name", "parameters"} tools that the agent runs`);
    }
    if (typeof t.name !== "string" || t.name === "") throw invalid(`${p}.name`, "a non-empty string", t.name);
    if (given(t.description) && typeof t.description !== "string") throw invalid(`${p}.description`, "a string", t.description);
    if (given(t.parameters) && !isObj(t.parameters)) throw invalid(`${p}.parameters`, "a JSON Schema object", t.parameters);
    if (given(t.strict) && typeof t.strict !== "boolean") throw invalid(`${p}.strict`, "a boolean", t.strict);
    return { name: t.name, description: (t.description as string | undefined) ?? null, parameters: (t.parameters as Obj | undefined) ?? null, strict: (t.strict as boolean | undefined) ?? null };
  });
}

/** Responses' tool_choice → chat completions': "none" | "auto" | "required" | {type: "function", name}. */
function chatToolChoice(v: unknown): unknown {
  if (!given(v)) return "auto";
  if (v === "none" || v === "auto" || v === "required") return v;
  if (isObj(v) && v.type === "function") {
    if (typeof v.name !== "string" || v.name === "") throw invalid("tool_choice.name", "a non-empty string", v.name);
    return { type: "function", function: { name: v.name } };
  }
  if (isObj(v) && typeof v.type === "string") {
    throw refuse("tool_choice", `'tool_choice' of type "${v.type}" is not supported by this gateway; use "none", "auto", "required" or {"type": "function", "name": …}`);
  }
  throw invalid("tool_choice", `"none", "auto", "required" or {"type": "function", "name": …}`, v);
}

/**
 * The conversation as chat-completions messages: instructions first (a system message); an
 * assistant turn gathers a reasoning item, an assistant message and the function calls after it
 * (as one response's output lists them); function outputs become tool messages.
 */
function chatMessages(instructions: string, items: readonly Item[]): Obj[] {
  const out: Obj[] = [];
  if (instructions !== "") out.push({ role: "system", content: instructions });
  let turn: { content: string | null; calls: Obj[]; reasoning: string | null } | null = null;
  const flush = () => {
    if (!turn) return;
    const m: Obj = { role: "assistant", content: turn.content ?? "" };
    if (turn.calls.length > 0) m.tool_calls = turn.calls;
    if (turn.reasoning !== null) m.reasoning_content = turn.reasoning;
    out.push(m);
    turn = null;
  };
  for (const it of items) {
    if (it.type === "reasoning") {
      flush();
      turn = { content: null, calls: [], reasoning: it.text };
    } else if (it.type === "function_call") {
      turn ??= { content: null, calls: [], reasoning: null };
      turn.calls.push({ id: it.callId, type: "function", function: { name: it.name, arguments: it.arguments } });
    } else if (it.type === "message" && it.role === "assistant") {
      if (turn && (turn.content !== null || turn.calls.length > 0)) flush();
      turn ??= { content: null, calls: [], reasoning: null };
      turn.content = it.text;
    } else {
      flush();
      out.push(it.type === "message" ? { role: it.role, content: it.text } : { role: "tool", tool_call_id: it.callId, content: it.output });
    }
  }
  flush();
  return out;
}

function statusOf(c: TurnChoice): "completed" | "incomplete" {
  return c.finish === "length" ? "incomplete" : "completed";
}

/** Ids of a response's items: its id's suffix under each item type's prefix. */
function itemId(responseId: string, prefix: "msg" | "rs" | "fc", k = -1): string {
  const suffix = responseId.replace(/^resp_/, "");
  return k < 0 ? `${prefix}_${suffix}` : `${prefix}_${suffix}_${k}`;
}

function reasoningItem(id: string, text: string, status: string, encrypted: boolean): Obj {
  const item: Obj = { type: "reasoning", id, summary: [], content: [{ type: "reasoning_text", text }], status };
  if (encrypted) item.encrypted_content = ENCRYPTED_PREFIX + Buffer.from(text, "utf8").toString("base64url");
  return item;
}

function messageItem(id: string, text: string, status: string): Obj {
  return { type: "message", id, status, role: "assistant", content: [{ type: "output_text", text, annotations: [] }] };
}

function callItem(id: string, t: TurnChoice["toolCalls"][number], status: string): Obj {
  return { type: "function_call", id, call_id: t.id, name: t.name, arguments: t.arguments, status };
}

/** Output items of a choice: reasoning (when it reasoned), the message (unless only calls), function calls. */
function outputItems(id: string, c: TurnChoice, encrypted: boolean): Obj[] {
  const status = statusOf(c);
  const out: Obj[] = [];
  const answered = c.content !== "" || c.toolCalls.length > 0;
  if (c.reasoning !== null && c.reasoning !== "") out.push(reasoningItem(itemId(id, "rs"), c.reasoning, answered ? "completed" : status, encrypted));
  if (c.content !== "" || c.toolCalls.length === 0) out.push(messageItem(itemId(id, "msg"), c.content, status));
  c.toolCalls.forEach((t, k) => out.push(callItem(itemId(id, "fc", k), t, "completed")));
  return out;
}

/** The output as conversation items, exactly as an agent sending the output items back gives them. */
function outputAsItems(c: TurnChoice): Item[] {
  const out: Item[] = [];
  if (c.reasoning !== null && c.reasoning !== "") out.push({ type: "reasoning", text: c.reasoning });
  if (c.content !== "" || c.toolCalls.length === 0) out.push({ type: "message", role: "assistant", text: c.content });
  for (const t of c.toolCalls) out.push({ type: "function_call", callId: t.id, name: t.name, arguments: t.arguments });
  return out;
}

/** Sampled ids up to the one completing `</think>` (all of them when it never closed); 0 without reasoning. */
function reasoningTokens(c: TurnChoice, tok: ChatTokenizer): number {
  if (c.reasoning === null || c.reasoning === "") return 0;
  const closes = (k: number) => tok.decode(c.ids.subarray(0, k), false).includes("</think>");
  if (!closes(c.ids.length)) return c.ids.length;
  let lo = 1;
  let hi = c.ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (closes(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

function usage(r: TurnResult, c: TurnChoice, tok: ChatTokenizer): Obj {
  return {
    input_tokens: r.promptTokens,
    input_tokens_details: { cached_tokens: r.cachedTokens, cache_write_tokens: 0 },
    output_tokens: c.ids.length,
    output_tokens_details: { reasoning_tokens: reasoningTokens(c, tok) },
    total_tokens: r.promptTokens + c.ids.length,
  };
}

function responseObject(ctx: RequestContext, id: string, model: string, createdAt: number, status: string, output: Obj[], u: Obj | null, error: Obj | null = null): Obj {
  return {
    id,
    object: "response",
    created_at: createdAt,
    status,
    background: false,
    error,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    model,
    output,
    usage: u,
    ...ctx.echo,
  };
}

/** An output item being streamed: its index in `output`, id, and the text sent so far. */
interface OpenItem {
  kind: "reasoning" | "message";
  index: number;
  id: string;
}

/**
 * Writes a Responses event stream: `start` (response.created, response.in_progress) before
 * generation, `progress` as the engine samples (a reasoning item's reasoning_text deltas, then a
 * message item's output_text deltas, at safe points of the detokenisation), then `finish` (the rest
 * of the text, function_call items with their arguments, response.completed or response.incomplete)
 * or `fail` (an `error` event, then response.failed).
 */
export class ResponsesStream {
  private readonly text: TextStreamer;
  private readonly createdAt = Math.floor(Date.now() / 1000);
  private ids: Int32Array = new Int32Array(0);
  private started = false;
  private seq = 0;
  private open: OpenItem | null = null;
  /** Items done, by output index. */
  private readonly output: Obj[] = [];

  constructor(
    private readonly res: ServerResponse,
    private readonly id: string,
    private readonly model: string,
    req: ChatRequest,
    private readonly tok: ChatTokenizer,
    private readonly ctx: RequestContext,
    private readonly remember: (c: TurnChoice) => void,
  ) {
    this.text = new TextStreamer(tok, req.stop, req.output);
  }

  private event(type: string, data: Obj): void {
    this.res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: this.seq++, ...data })}\n\n`);
  }

  private response(status: string, u: Obj | null = null, error: Obj | null = null): Obj {
    return responseObject(this.ctx, this.id, this.model, this.createdAt, status, this.output, u, error);
  }

  /** Headers, response.created and response.in_progress (then whatever was sampled before). */
  start(): void {
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" });
    this.event("response.created", { response: this.response("in_progress") });
    this.event("response.in_progress", { response: this.response("in_progress") });
    this.started = true;
    this.send(this.text.push(this.ids));
  }

  /** Every id sampled so far (one choice: `k` is 0): text deltas when they complete safe text. */
  progress(k: number, ids: Int32Array, _logprobs: Float32Array): void {
    if (k !== 0 || this.res.writableEnded || this.res.destroyed) return;
    this.ids = ids;
    if (this.started) this.send(this.text.push(ids));
  }

  private openItem(kind: OpenItem["kind"]): OpenItem {
    if (this.open?.kind === kind) return this.open;
    this.closeItem(null);
    const index = this.output.length;
    const id = itemId(this.id, kind === "reasoning" ? "rs" : "msg");
    const o: OpenItem = { kind, index, id };
    this.open = o;
    const item = kind === "reasoning" ? { type: "reasoning", id, summary: [], content: [], status: "in_progress" } : { type: "message", id, status: "in_progress", role: "assistant", content: [] };
    this.output.push(item);
    this.event("response.output_item.added", { output_index: index, item });
    const part = kind === "reasoning" ? { type: "reasoning_text", text: "" } : { type: "output_text", text: "", annotations: [] };
    this.event("response.content_part.added", { item_id: id, output_index: index, content_index: 0, part });
    return o;
  }

  /** Closes the open item with its final text (null: the text sent so far) and status. */
  private closeItem(final: { text: string; status: string } | null): void {
    const o = this.open;
    if (!o) return;
    this.open = null;
    const text = final?.text ?? (o.kind === "reasoning" ? this.text.reasoning : this.text.text);
    const status = final?.status ?? "completed";
    const base = { item_id: o.id, output_index: o.index, content_index: 0 };
    let item: Obj;
    if (o.kind === "reasoning") {
      this.event("response.reasoning_text.done", { ...base, text });
      this.event("response.content_part.done", { ...base, part: { type: "reasoning_text", text } });
      item = reasoningItem(o.id, text, status, this.ctx.encryptedReasoning);
    } else {
      this.event("response.output_text.done", { ...base, text, logprobs: [] });
      this.event("response.content_part.done", { ...base, part: { type: "output_text", text, annotations: [] } });
      item = messageItem(o.id, text, status);
    }
    this.output[o.index] = item;
    this.event("response.output_item.done", { output_index: o.index, item });
  }

  private send(d: ReplyDelta): void {
    if (d.reasoning !== "") {
      const o = this.openItem("reasoning");
      this.event("response.reasoning_text.delta", { item_id: o.id, output_index: o.index, content_index: 0, delta: d.reasoning });
    }
    if (d.content !== "") {
      const o = this.openItem("message");
      this.event("response.output_text.delta", { item_id: o.id, output_index: o.index, content_index: 0, delta: d.content, logprobs: [] });
    }
  }

  /** The rest of the text, function_call items, then response.completed (or response.incomplete). */
  finish(r: TurnResult): void {
    const c = r.choices[0]!;
    this.ids = c.ids;
    const rest = this.text.finish(c);
    const status = statusOf(c);
    for (const item of outputItems(this.id, c, this.ctx.encryptedReasoning)) {
      if (item.type === "reasoning") {
        // Streamed while it was the open item (closed already when the message began), else sent whole now.
        const sent = this.output.some((x) => x.type === "reasoning");
        if (this.open?.kind === "reasoning") {
          if (rest.reasoning !== "") this.send({ reasoning: rest.reasoning, content: "" });
        } else if (!sent && this.open === null) this.send({ reasoning: c.reasoning ?? "", content: "" });
        if (this.open?.kind === "reasoning") this.closeItem({ text: c.reasoning ?? "", status: item.status as string });
      } else if (item.type === "message") {
        const o = this.openItem("message");
        if (rest.content !== "") this.event("response.output_text.delta", { item_id: o.id, output_index: o.index, content_index: 0, delta: rest.content, logprobs: [] });
        this.closeItem({ text: c.content, status });
      } else {
        this.closeItem(null);
        const index = this.output.length;
        const id = item.id as string;
        this.output.push({ ...item, arguments: "", status: "in_progress" });
        this.event("response.output_item.added", { output_index: index, item: this.output[index] });
        this.event("response.function_call_arguments.delta", { item_id: id, output_index: index, delta: item.arguments });
        this.event("response.function_call_arguments.done", { item_id: id, output_index: index, name: item.name, arguments: item.arguments });
        this.output[index] = item;
        this.event("response.output_item.done", { output_index: index, item });
      }
    }
    this.closeItem(null);
    this.remember(c);
    this.event(status === "completed" ? "response.completed" : "response.incomplete", { response: this.response(status, usage(r, c, this.tok)) });
    this.res.end();
  }

  /** An error after the stream began: an `error` event, then response.failed. */
  fail(e: GatewayError): void {
    const { error } = e.openai();
    this.closeItem(null);
    this.event("error", { code: error.code, message: error.message, param: error.param });
    this.event("response.failed", { response: this.response("failed", null, { code: "server_error", message: error.message }) });
    this.res.end();
  }
}
