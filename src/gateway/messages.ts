// Chat requests of both APIs turned into one normalised form (HF-style messages: system, user,
// assistant with tool calls, tool results), with every field checked at the edge: a wrong type or an
// out-of-range value is a GatewayError naming the field path (`messages[2].content`).
import { invalid } from "./errors.ts";

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
}

/** A tool the agent offers the model. */
export interface ToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

/** A chat request in normalised form. */
export interface ChatRequest {
  messages: ChatMessage[];
  tools: ToolSpec[];
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
  if (body.model !== undefined && typeof body.model !== "string") throw invalid("model", "a string", body.model);
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
  return {
    messages,
    tools,
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
      } else if (b.type === "thinking" || b.type === "redacted_thinking") {
        // not produced by this gateway; dropped from the rendering
      } else {
        throw invalid(`${q}.type`, role === "assistant" ? `"text" or "tool_use"` : `"text" or "tool_result" (this gateway serves text models only)`, b.type);
      }
    });
    messages.push(...results);
    if (text !== "" || toolCalls.length > 0 || results.length === 0) messages.push({ role, content: text, toolCalls, toolCallId: null });
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
  return {
    messages,
    tools,
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
