// Chat requests of both APIs turned into one normalised form (HF-style messages: system, user,
// assistant with tool calls, tool results), with every field checked at the edge: a wrong type or an
// out-of-range value is a GatewayError naming the field path (`messages[2].content`). What a request
// asks of the reply (tool_choice, parallel tool calls, thinking) is kept as intents; the gateway's
// ReplyFormat turns them into its plan (reply-format.ts). Fields this gateway cannot honour
// (response_format, Anthropic output_format) are refused, never ignored.
import { GatewayError, invalid } from "./errors.ts";

/** A tool call: arguments are JSON text, as the OpenAI API carries them. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** One normalised message. */
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string;
  toolCalls: ToolCall[];
  /** For role "tool": the call it answers. */
  toolCallId: string | null;
  /** For role "assistant": the reasoning the agent sent back with it (OpenAI `reasoning_content`, Anthropic thinking blocks). */
  reasoningContent?: string;
}

/** A tool the agent offers the model. */
export interface ToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

/** Whether and which tool the model must call (OpenAI's tool_choice; Anthropic's any = required, tool = function). */
export type ToolChoice = { type: "auto" } | { type: "none" } | { type: "required" } | { type: "function"; name: string };

/** A chat request in normalised form. */
export interface ChatRequest {
  /** The model asked for (null: none given). */
  model: string | null;
  messages: ChatMessage[];
  tools: ToolSpec[];
  toolChoice: ToolChoice;
  /** false: at most one call per reply (OpenAI parallel_tool_calls, Anthropic disable_parallel_tool_use). */
  parallelToolCalls: boolean;
  /** Anthropic's thinking: enabled (or adaptive) true, disabled false, not given null. */
  thinking: boolean | null;
  /** Chat template variables the request sets (OpenAI-compatible servers' chat_template_kwargs). */
  templateVars: Record<string, unknown>;
  /** What the gateway does around the generation: set from the request by the gateway's ReplyFormat. */
  output: ReplyPlan;
  /** null = the gateway's default. */
  maxTokens: number | null;
  temperature: number | null;
  topP: number | null;
  topK: number | null;
  stop: string[];
  n: number;
  logprobs: boolean;
  stream: boolean;
  includeUsage: boolean;
  seed: number | null;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

function num(o: Obj, key: string, path: string, lo: number, hi: number, integer = false): number | null {
  const v = o[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !Number.isFinite(v) || (integer && !Number.isInteger(v)) || v < lo || v > hi) {
    throw invalid(`${path}${key}`, `${integer ? "an integer" : "a number"} in [${lo}, ${hi}]`, v);
  }
  return v;
}

function bool(o: Obj, key: string, path = ""): boolean {
  const v = o[key];
  if (v === undefined || v === null) return false;
  if (typeof v !== "boolean") throw invalid(`${path}${key}`, "a boolean", v);
  return v;
}

function stopList(v: unknown, param: string, max: number): string[] {
  if (v === undefined || v === null) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.some((s) => typeof s !== "string" || s.length === 0) || list.length > max) {
    throw invalid(param, `a non-empty string or a list of at most ${max} non-empty strings`, v);
  }
  return list as string[];
}

/** Text of OpenAI content: a string, null, or a list of `{type:"text", text}` parts. */
function openaiText(v: unknown, path: string, allowNull: boolean): string {
  if (typeof v === "string") return v;
  if ((v === null || v === undefined) && allowNull) return "";
  if (!Array.isArray(v)) throw invalid(path, allowNull ? "a string, null or a list of text parts" : "a string or a list of text parts", v);
  return v
    .map((p, j) => {
      if (!isObj(p)) throw invalid(`${path}[${j}]`, "a content part object", p);
      if (p.type !== "text") throw invalid(`${path}[${j}].type`, `"text" (this gateway serves text models only)`, p.type);
      if (typeof p.text !== "string") throw invalid(`${path}[${j}].text`, "a string", p.text);
      return p.text;
    })
    .join("");
}

function objectArgs(v: unknown, path: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (!isObj(v)) throw invalid(path, "a JSON Schema object", v);
  return v;
}

/** Parses an OpenAI `POST /v1/chat/completions` body. */
export function parseOpenAIRequest(body: unknown): ChatRequest {
  if (!isObj(body)) throw invalid("body", "a JSON object", body);
  if (body.model !== undefined && body.model !== null && typeof body.model !== "string") throw invalid("model", "a string", body.model);
  const rawMessages = body.messages;
  if (!Array.isArray(rawMessages) || rawMessages.length === 0) throw invalid("messages", "a non-empty list of messages", rawMessages);
  const messages = rawMessages.map((m, i): ChatMessage => {
    const p = `messages[${i}]`;
    if (!isObj(m)) throw invalid(p, "a message object", m);
    const role = m.role === "developer" ? "system" : m.role;
    if (role !== "system" && role !== "user" && role !== "assistant" && role !== "tool") {
      throw invalid(`${p}.role`, `one of "system", "developer", "user", "assistant", "tool"`, m.role);
    }
    const content = openaiText(m.content, `${p}.content`, role === "assistant");
    const toolCalls: ToolCall[] = [];
    if (role === "assistant" && m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) throw invalid(`${p}.tool_calls`, "a list", m.tool_calls);
      m.tool_calls.forEach((c, j) => {
        const q = `${p}.tool_calls[${j}]`;
        if (!isObj(c) || !isObj(c.function)) throw invalid(`${q}.function`, "an object {name, arguments}", isObj(c) ? c.function : c);
        if (typeof c.function.name !== "string") throw invalid(`${q}.function.name`, "a string", c.function.name);
        const args = c.function.arguments;
        if (typeof args !== "string") throw invalid(`${q}.function.arguments`, "a string (JSON text)", args);
        toolCalls.push({ id: typeof c.id === "string" ? c.id : "", name: c.function.name, arguments: args });
      });
    }
    let toolCallId: string | null = null;
    if (role === "tool") {
      if (typeof m.tool_call_id !== "string") throw invalid(`${p}.tool_call_id`, "a string", m.tool_call_id);
      toolCallId = m.tool_call_id;
    }
    const rc = m.reasoning_content;
    if (role === "assistant" && rc !== undefined && rc !== null) {
      if (typeof rc !== "string") throw invalid(`${p}.reasoning_content`, "a string", rc);
      return { role, content, toolCalls, toolCallId, reasoningContent: rc };
    }
    return { role, content, toolCalls, toolCallId };
  });
  const tools: ToolSpec[] = [];
  if (body.tools !== undefined && body.tools !== null) {
    if (!Array.isArray(body.tools)) throw invalid("tools", "a list of tools", body.tools);
    body.tools.forEach((t, i) => {
      if (!isObj(t) || !isObj(t.function)) throw invalid(`tools[${i}].function`, "an object {name, description, parameters}", isObj(t) ? t.function : t);
      const f = t.function;
      if (typeof f.name !== "string" || f.name === "") throw invalid(`tools[${i}].function.name`, "a non-empty string", f.name);
      if (f.description !== undefined && typeof f.description !== "string") throw invalid(`tools[${i}].function.description`, "a string", f.description);
      tools.push({ name: f.name, description: (f.description as string | undefined) ?? "", parameters: objectArgs(f.parameters, `tools[${i}].function.parameters`) });
    });
  }
  const maxTokens = num(body, "max_completion_tokens", "", 1, 2 ** 31, true) ?? num(body, "max_tokens", "", 1, 2 ** 31, true);
  const so = body.stream_options;
  if (so !== undefined && so !== null && !isObj(so)) throw invalid("stream_options", "an object", so);
  num(body, "top_logprobs", "", 0, 20, true);
  refuseResponseFormat(body.response_format);
  if (body.parallel_tool_calls !== undefined && body.parallel_tool_calls !== null && typeof body.parallel_tool_calls !== "boolean") {
    throw invalid("parallel_tool_calls", "a boolean", body.parallel_tool_calls);
  }
  return {
    model: typeof body.model === "string" ? body.model : null,
    messages,
    tools,
    toolChoice: openaiToolChoice(body.tool_choice),
    parallelToolCalls: body.parallel_tool_calls !== false,
    thinking: null,
    templateVars: templateKwargs(body.chat_template_kwargs),
    output: defaultReplyPlan(tools.length > 0),
    maxTokens,
    temperature: num(body, "temperature", "", 0, 2),
    topP: num(body, "top_p", "", Number.MIN_VALUE, 1),
    topK: null,
    stop: stopList(body.stop, "stop", 4),
    n: num(body, "n", "", 1, 16, true) ?? 1,
    logprobs: bool(body, "logprobs"),
    stream: bool(body, "stream"),
    includeUsage: isObj(so) ? bool(so, "include_usage", "stream_options.") : false,
    seed: num(body, "seed", "", -(2 ** 53), 2 ** 53, true),
  };
}

/** Parses an Anthropic `POST /v1/messages` body; tool_result blocks become "tool" messages. */
export function parseAnthropicRequest(body: unknown): ChatRequest {
  if (!isObj(body)) throw invalid("body", "a JSON object", body);
  if (typeof body.model !== "string") throw invalid("model", "a string", body.model);
  const maxTokens = num(body, "max_tokens", "", 1, 2 ** 31, true);
  if (maxTokens === null) throw invalid("max_tokens", "a positive integer (it is required)", body.max_tokens);
  const messages: ChatMessage[] = [];
  if (body.system !== undefined && body.system !== null) {
    const sys = typeof body.system === "string" ? body.system : textBlocks(body.system, "system");
    if (sys !== "") messages.push({ role: "system", content: sys, toolCalls: [], toolCallId: null });
  }
  const raw = body.messages;
  if (!Array.isArray(raw) || raw.length === 0) throw invalid("messages", "a non-empty list of messages", raw);
  raw.forEach((m, i) => {
    const p = `messages[${i}]`;
    if (!isObj(m)) throw invalid(p, "a message object", m);
    if (m.role !== "user" && m.role !== "assistant") throw invalid(`${p}.role`, `"user" or "assistant"`, m.role);
    const role = m.role;
    if (typeof m.content === "string") {
      messages.push({ role, content: m.content, toolCalls: [], toolCallId: null });
      return;
    }
    if (!Array.isArray(m.content)) throw invalid(`${p}.content`, "a string or a list of content blocks", m.content);
    let text = "";
    let thought: string | null = null;
    const toolCalls: ToolCall[] = [];
    const results: ChatMessage[] = [];
    m.content.forEach((b, j) => {
      const q = `${p}.content[${j}]`;
      if (!isObj(b)) throw invalid(q, "a content block object", b);
      if (b.type === "text") {
        if (typeof b.text !== "string") throw invalid(`${q}.text`, "a string", b.text);
        text += b.text;
      } else if (b.type === "tool_use" && role === "assistant") {
        if (typeof b.name !== "string") throw invalid(`${q}.name`, "a string", b.name);
        if (!isObj(b.input)) throw invalid(`${q}.input`, "an object", b.input);
        toolCalls.push({ id: typeof b.id === "string" ? b.id : "", name: b.name, arguments: JSON.stringify(b.input) });
      } else if (b.type === "tool_result" && role === "user") {
        if (typeof b.tool_use_id !== "string") throw invalid(`${q}.tool_use_id`, "a string", b.tool_use_id);
        const c = b.content === undefined || b.content === null ? "" : typeof b.content === "string" ? b.content : textBlocks(b.content, `${q}.content`);
        results.push({ role: "tool", content: b.is_error === true ? `Error: ${c}` : c, toolCalls: [], toolCallId: b.tool_use_id });
      } else if (b.type === "thinking" && role === "assistant") {
        // The reasoning the gateway returned, for the template to render back (reasoning_content).
        if (typeof b.thinking !== "string") throw invalid(`${q}.thinking`, "a string", b.thinking);
        thought = (thought ?? "") + b.thinking;
      } else if (b.type === "redacted_thinking" && role === "assistant") {
        // never produced by this gateway: nothing to render
      } else {
        throw invalid(`${q}.type`, role === "assistant" ? `"text" or "tool_use"` : `"text" or "tool_result" (this gateway serves text models only)`, b.type);
      }
    });
    messages.push(...results);
    if (text !== "" || toolCalls.length > 0 || thought !== null || results.length === 0) {
      messages.push(thought === null ? { role, content: text, toolCalls, toolCallId: null } : { role, content: text, toolCalls, toolCallId: null, reasoningContent: thought });
    }
  });
  const tools: ToolSpec[] = [];
  if (body.tools !== undefined && body.tools !== null) {
    if (!Array.isArray(body.tools)) throw invalid("tools", "a list of tools", body.tools);
    body.tools.forEach((t, i) => {
      if (!isObj(t)) throw invalid(`tools[${i}]`, "a tool object", t);
      if (typeof t.name !== "string" || t.name === "") throw invalid(`tools[${i}].name`, "a non-empty string", t.name);
      if (t.description !== undefined && typeof t.description !== "string") throw invalid(`tools[${i}].description`, "a string", t.description);
      tools.push({ name: t.name, description: (t.description as string | undefined) ?? "", parameters: objectArgs(t.input_schema, `tools[${i}].input_schema`) });
    });
  }
  if (body.output_format !== undefined && body.output_format !== null) {
    throw new GatewayError("invalid_request", "'output_format' (structured outputs) is not supported by this gateway: it has no constrained decoding; ask for JSON in the prompt instead", "output_format");
  }
  if (isObj(body.output_config) && body.output_config.format !== undefined && body.output_config.format !== null) {
    throw new GatewayError("invalid_request", "'output_config.format' (structured outputs) is not supported by this gateway: it has no constrained decoding; ask for JSON in the prompt instead", "output_config.format");
  }
  const choice = anthropicToolChoice(body.tool_choice);
  const thinking = anthropicThinking(body.thinking, maxTokens);
  if (thinking === true && (choice.toolChoice.type === "required" || choice.toolChoice.type === "function")) {
    throw new GatewayError("invalid_request", `'thinking' may not be enabled when 'tool_choice' forces tool use (type "${choice.toolChoice.type === "required" ? "any" : "tool"}"); use "auto" or "none", or disable thinking`, "tool_choice");
  }
  return {
    model: body.model,
    messages,
    tools,
    toolChoice: choice.toolChoice,
    parallelToolCalls: choice.parallel,
    thinking,
    templateVars: {},
    output: defaultReplyPlan(tools.length > 0),
    maxTokens,
    temperature: num(body, "temperature", "", 0, 1),
    topP: num(body, "top_p", "", Number.MIN_VALUE, 1),
    topK: num(body, "top_k", "", 1, 2 ** 31, true),
    stop: stopList(body.stop_sequences, "stop_sequences", 16),
    n: 1,
    logprobs: false,
    stream: bool(body, "stream"),
    includeUsage: true,
    seed: null,
  };
}

/** OpenAI's tool_choice: "none" | "auto" | "required" | {type: "function", function: {name}}. */
function openaiToolChoice(v: unknown): ToolChoice {
  if (v === undefined || v === null || v === "auto") return { type: "auto" };
  if (v === "none" || v === "required") return { type: v };
  if (isObj(v) && v.type === "function") {
    const f = v.function;
    if (!isObj(f) || typeof f.name !== "string" || f.name === "") throw invalid("tool_choice.function.name", "a non-empty string", isObj(f) ? f.name : f);
    return { type: "function", name: f.name };
  }
  if (isObj(v) && typeof v.type === "string") {
    throw new GatewayError("invalid_request", `'tool_choice' of type "${v.type}" is not supported by this gateway; use "none", "auto", "required" or {"type": "function", "function": {"name": …}}`, "tool_choice");
  }
  throw invalid("tool_choice", `"none", "auto", "required" or {"type": "function", "function": {"name": …}}`, v);
}

/** Anthropic's tool_choice: {type: auto | any | tool (name) | none, disable_parallel_tool_use}. */
function anthropicToolChoice(v: unknown): { toolChoice: ToolChoice; parallel: boolean } {
  if (v === undefined || v === null) return { toolChoice: { type: "auto" }, parallel: true };
  if (!isObj(v)) throw invalid("tool_choice", `an object {type: "auto" | "any" | "tool" | "none"}`, v);
  const dp = v.disable_parallel_tool_use;
  if (dp !== undefined && dp !== null && typeof dp !== "boolean") throw invalid("tool_choice.disable_parallel_tool_use", "a boolean", dp);
  const parallel = dp !== true;
  switch (v.type) {
    case "auto":
      return { toolChoice: { type: "auto" }, parallel };
    case "any":
      return { toolChoice: { type: "required" }, parallel };
    case "none":
      return { toolChoice: { type: "none" }, parallel };
    case "tool":
      if (typeof v.name !== "string" || v.name === "") throw invalid("tool_choice.name", "a non-empty string", v.name);
      return { toolChoice: { type: "function", name: v.name }, parallel };
    default:
      throw invalid("tool_choice.type", `"auto", "any", "tool" or "none"`, v.type);
  }
}

/** Anthropic's thinking: enabled (budget_tokens ≥ 1024 and < max_tokens) / adaptive → true, disabled → false. */
function anthropicThinking(v: unknown, maxTokens: number): boolean | null {
  if (v === undefined || v === null) return null;
  if (!isObj(v)) throw invalid("thinking", `an object {type: "enabled" | "adaptive" | "disabled"}`, v);
  if (v.type === "disabled") return false;
  if (v.type === "adaptive") return true;
  if (v.type === "enabled") {
    const b = num(v, "budget_tokens", "thinking.", 1024, 2 ** 31, true);
    if (b === null) throw invalid("thinking.budget_tokens", "an integer ≥ 1024 (it is required)", v.budget_tokens);
    if (b >= maxTokens) throw invalid("thinking.budget_tokens", `less than max_tokens (${maxTokens})`, b);
    return true;
  }
  throw invalid("thinking.type", `"enabled", "adaptive" or "disabled"`, v.type);
}

/** OpenAI's response_format: "text" is what the gateway does; JSON modes need constrained decoding. */
function refuseResponseFormat(v: unknown): void {
  if (v === undefined || v === null) return;
  if (!isObj(v) || typeof v.type !== "string") throw invalid("response_format", `an object {type: "text" | "json_object" | "json_schema"}`, v);
  if (v.type === "text") return;
  throw new GatewayError(
    "invalid_request",
    `Invalid parameter: 'response_format' of type '${v.type}' is not supported by this gateway: it has no constrained decoding; leave response_format out (or "text") and ask for JSON in the prompt`,
    "response_format",
  );
}

const RESERVED_TEMPLATE_VARS = new Set(["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"]);

/** chat_template_kwargs (as SGLang and vLLM take it): extra variables for the chat template. */
function templateKwargs(v: unknown): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (!isObj(v)) throw invalid("chat_template_kwargs", "an object of template variables", v);
  for (const k of Object.keys(v)) {
    if (RESERVED_TEMPLATE_VARS.has(k)) throw invalid(`chat_template_kwargs.${k}`, "left out (the gateway sets it)", v[k]);
  }
  return { ...v };
}

function textBlocks(v: unknown, path: string): string {
  if (!Array.isArray(v)) throw invalid(path, "a string or a list of text blocks", v);
  return v
    .map((b, j) => {
      if (!isObj(b) || b.type !== "text" || typeof b.text !== "string") throw invalid(`${path}[${j}]`, `a text block {type:"text", text}`, b);
      return b.text;
    })
    .join("");
}

/** JSON text with keys sorted (tool-call arguments compared by value); the text itself when not JSON. */
export function canonicalJson(text: string): string {
  try {
    return JSON.stringify(sortKeys(JSON.parse(text)));
  } catch {
    return text;
  }
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (isObj(v)) return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sortKeys(v[k])]));
  return v;
}

/**
 * The identity of an assistant turn as an agent echoes it back: its text (trimmed) and its tool
 * calls (name and arguments by value; call ids ignored). Sampled turns are matched by it.
 */
export function assistantKey(content: string, toolCalls: readonly { name: string; arguments: string }[]): string {
  return JSON.stringify([content.trim(), toolCalls.map((c) => [c.name, canonicalJson(c.arguments)])]);
}

/** The tool-call syntax a chat template teaches. */
export type ToolCallSyntax = "hermes" | "llama3_json";

/** What to make of one reply's text. */
export interface ReplyParse {
  /** The syntax to parse calls in; null: no calls are parsed (no tools, or tool_choice none). */
  toolCalls: ToolCallSyntax | null;
  /** Split off a `<think>` block as reasoning. */
  reasoning: boolean;
  /** The prompt opened the think block: the reply starts inside it. */
  thinkingOpen: boolean;
  /** At most this many calls (1 with parallel_tool_calls false): a reply with more is text. */
  maxCalls: number;
}

/** What the gateway does around one request's generation. */
export interface ReplyPlan {
  parse: ReplyParse;
  /**
   * Text the gateway writes at the start of the assistant turn (a forced tool call's opening): it
   * goes to the engine as prompt (loss mask 0) and counts as the start of the reply's text.
   */
  prefill: string;
  /** Stop strings for the engine only: the reply keeps them (parallel_tool_calls false: `</tool_call>`). */
  stop: string[];
  /** Variables for the chat template (`enable_thinking`, `chat_template_kwargs`). */
  templateVars: Record<string, unknown>;
}

/** The plan of a request parsed without a gateway (tools offered → Hermes calls parsed). */
export function defaultReplyPlan(tools: boolean): ReplyPlan {
  return { parse: { toolCalls: tools ? "hermes" : null, reasoning: false, thinkingOpen: false, maxCalls: Infinity }, prefill: "", stop: [], templateVars: {} };
}
