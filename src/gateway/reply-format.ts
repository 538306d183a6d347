// How a model family writes its replies, and the one parser of sampled text into what the APIs
// return: reasoning (the text of a `<think>…</think>` block), content, and tool calls in the syntax
// the family's chat template teaches — Hermes / Qwen `<tool_call>{"name", "arguments"}</tool_call>`
// blocks, or Llama 3.1's reply-wide JSON `{"name", "parameters"}`. The format is chosen once per
// gateway (GatewayOptions.replyFormat, else detected from the template's source); each request's
// tool_choice, parallel_tool_calls and thinking become a ReplyPlan: what to parse, the text written
// at the start of the assistant turn on the prompt side, extra engine stop strings, template
// variables. A reply that does not parse as the format says is returned as text, whole: nothing
// the model wrote is dropped or rewritten (call arguments are the model's own JSON text).
import { GatewayError, invalid } from "./errors.ts";
import { defaultReplyPlan, type ChatMessage, type ChatRequest, type ReplyParse, type ReplyPlan, type ToolCallSyntax } from "./messages.ts";
export { defaultReplyPlan, type ReplyParse, type ReplyPlan, type ToolCallSyntax };
import type { ChatTemplate } from "./template.ts";

/** How a model family writes a reply. */
export interface ReplyFormatSpec {
  /**
   * `hermes`: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks, several per reply,
   * text around them (Qwen 2.5 / 3, Hermes, the built-in template). `llama3_json`: the whole reply
   * is `{"name": …, "parameters": {…}}` (several joined by `;`), after an optional `<|python_tag|>`
   * (Llama 3.1 / 3.2 / 3.3).
   */
  toolCalls: ToolCallSyntax;
  /** The model may reason in `<think>…</think>` before its answer (Qwen3, QwQ, DeepSeek-R1 distills). */
  reasoning: boolean;
}

/** A reply's text as the APIs return it. */
export interface ParsedReply {
  /** The think block's text (trimmed); null when the reply has none. */
  reasoning: string | null;
  content: string;
  /** Arguments are the model's JSON text of an object, as written. */
  toolCalls: { name: string; arguments: string }[];
}

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";
const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";
const PYTHON_TAG = "<|python_tag|>";
/** An empty think block, as Qwen3's template writes one when thinking is off. */
const EMPTY_THINK = "<think>\n\n</think>\n\n";

/** The spec a chat template's Jinja source implies (null: the built-in template). */
export function detectReplyFormat(source: string | null): ReplyFormatSpec {
  if (source === null) return { toolCalls: "hermes", reasoning: false };
  // Llama 3.x templates write calls as bare JSON and name <|python_tag|>; anything else is read in
  // the Hermes syntax the built-in template teaches.
  const toolCalls: ToolCallSyntax = !source.includes(CALL_OPEN) && source.includes(PYTHON_TAG) ? "llama3_json" : "hermes";
  return { toolCalls, reasoning: source.includes(THINK_CLOSE) };
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);

/** Length of the longest suffix of `text` that is a proper prefix of one of `words`. */
export function partialSuffix(text: string, words: readonly string[]): number {
  let best = 0;
  for (const w of words) {
    for (let k = Math.min(w.length - 1, text.length); k > best; k--) {
      if (text.endsWith(w.slice(0, k))) {
        best = k;
        break;
      }
    }
  }
  return best;
}

/** Where a reply stands: still possibly opening a think block, inside it, or past it (or without one). */
export type ReplyPhase = "undecided" | "reasoning" | "content";

/**
 * Splits reasoning from content. `final` false (a stream): the reasoning so far without a possible
 * start of `</think>`, and "undecided" while the reply could still open a think block. Reasoning
 * loses its surrounding newlines, content after `</think>` its leading newlines — as Qwen3's template
 * strips them when it renders the reply back (so a reply sent back as returned renders as sampled);
 * a reply without a think block is content as it is.
 */
export function splitReasoning(text: string, p: ReplyParse, final: boolean): { reasoning: string | null; content: string; phase: ReplyPhase } {
  if (!p.reasoning) return { reasoning: null, content: text, phase: "content" };
  let body: string;
  if (p.thinkingOpen) body = text;
  else {
    const rest = text.trimStart();
    if (rest.startsWith(THINK_OPEN)) body = rest.slice(THINK_OPEN.length);
    else if (!final && THINK_OPEN.startsWith(rest)) return { reasoning: null, content: "", phase: "undecided" };
    else return { reasoning: null, content: text, phase: "content" };
  }
  const k = body.indexOf(THINK_CLOSE);
  if (k < 0) {
    const so = final ? stripNewlines(body, false, true) : body.slice(0, body.length - partialSuffix(body, [THINK_CLOSE]));
    return { reasoning: stripNewlines(so, true, false), content: "", phase: "reasoning" };
  }
  return { reasoning: stripNewlines(body.slice(0, k), true, true), content: stripNewlines(body.slice(k + THINK_CLOSE.length), true, false), phase: "content" };
}

/** `s` without the newlines at its start and/or end (Python's lstrip/rstrip("\n")). */
function stripNewlines(s: string, start: boolean, end: boolean): string {
  let a = 0, b = s.length;
  if (start) while (a < b && s[a] === "\n") a++;
  if (end) while (b > a && s[b - 1] === "\n") b--;
  return s.slice(a, b);
}

/** Reasoning, content and tool calls of a reply's whole text (the prefill, then what was sampled, cut at a stop string). */
export function parseReply(text: string, p: ReplyParse): ParsedReply {
  const { reasoning, content } = splitReasoning(text, p, true);
  if (p.toolCalls === null) return { reasoning, content, toolCalls: [] };
  const calls = p.toolCalls === "hermes" ? hermesCalls(content) : llamaCalls(content);
  if (calls === null || calls.toolCalls.length > p.maxCalls) return { reasoning, content, toolCalls: [] };
  return { reasoning, ...calls };
}

/**
 * How much of the content of a reply in progress can be shown before its calls are parsed at the
 * end: Hermes, up to the first `<tool_call>` (or a possible start of one); Llama JSON, nothing when
 * the reply starts as a call could (`{`, `<|python_tag|>`), all of it otherwise.
 */
export function contentBeforeCalls(content: string, syntax: ToolCallSyntax | null): { text: string; held: boolean } {
  if (syntax === null) return { text: content, held: false };
  if (syntax === "hermes") {
    const k = content.indexOf(CALL_OPEN);
    if (k >= 0) return { text: content.slice(0, k), held: true };
    return { text: content.slice(0, content.length - partialSuffix(content, [CALL_OPEN])), held: false };
  }
  const s = content.trimStart();
  if (s.startsWith("{") || s.startsWith(PYTHON_TAG)) return { text: "", held: true };
  if (s === "" || PYTHON_TAG.startsWith(s)) return { text: "", held: false };
  return { text: content, held: false };
}

/** Hermes blocks: every one a well-formed call, none left open; else null (the text stays as it is). */
function hermesCalls(text: string): { content: string; toolCalls: ParsedReply["toolCalls"] } | null {
  if (!text.includes(CALL_OPEN)) return null;
  const toolCalls: ParsedReply["toolCalls"] = [];
  let ok = true;
  const content = text.replace(/<tool_call>([\s\S]*?)<\/tool_call>/g, (_, inner: string) => {
    const c = callOf(inner, "arguments");
    if (c === null) ok = false;
    else toolCalls.push(c);
    return "";
  });
  if (!ok || content.includes(CALL_OPEN)) return null;
  // Trailing whitespace (before a call) goes; leading whitespace stays, so that a streamed answer's
  // text, sent before the calls are parsed, is a prefix of this content.
  return { content: content.trimEnd(), toolCalls };
}

/** Llama 3.1 JSON: the whole reply (after an optional <|python_tag|>) is one call or several joined by `;`. */
function llamaCalls(text: string): { content: string; toolCalls: ParsedReply["toolCalls"] } | null {
  let s = text.trim();
  if (s.startsWith(PYTHON_TAG)) s = s.slice(PYTHON_TAG.length).trim();
  if (!s.startsWith("{")) return null;
  const parts = splitTopLevel(s, ";");
  const toolCalls: ParsedReply["toolCalls"] = [];
  for (const part of parts) {
    const c = callOf(part, "parameters");
    if (c === null) return null;
    toolCalls.push(c);
  }
  return { content: "", toolCalls };
}

/** `{"name": non-empty string, <argsKey>: object}` and nothing else; arguments as the model wrote them. */
function callOf(json: string, argsKey: "arguments" | "parameters"): ParsedReply["toolCalls"][number] | null {
  let v: unknown;
  try {
    v = JSON.parse(json);
  } catch {
    return null;
  }
  if (!isObj(v) || typeof v.name !== "string" || v.name === "" || !isObj(v[argsKey])) return null;
  const members = topLevelMembers(json.trim());
  if (members.length !== 2) return null;
  const args = members.find(([k]) => k === argsKey);
  return args ? { name: v.name, arguments: args[1] } : null;
}

function skipWs(t: string, i: number): number {
  while (i < t.length && /\s/.test(t[i]!)) i++;
  return i;
}

/** End (exclusive) of the JSON value starting at `i` of valid JSON text `t`. */
function endOfValue(t: string, i: number): number {
  const c = t[i];
  if (c === '"') {
    let j = i + 1;
    while (t[j] !== '"') j += t[j] === "\\" ? 2 : 1;
    return j + 1;
  }
  if (c === "{" || c === "[") {
    let depth = 0;
    for (let j = i; j < t.length; j++) {
      const ch = t[j];
      if (ch === '"') j = endOfValue(t, j) - 1;
      else if (ch === "{" || ch === "[") depth++;
      else if (ch === "}" || ch === "]") {
        depth--;
        if (depth === 0) return j + 1;
      }
    }
    return t.length;
  }
  let j = i;
  while (j < t.length && !/[\s,\]}]/.test(t[j]!)) j++;
  return j;
}

/** The top-level members of valid JSON object text, keys decoded, values as their raw text. */
function topLevelMembers(t: string): [string, string][] {
  const out: [string, string][] = [];
  let i = skipWs(t, t.indexOf("{") + 1);
  while (i < t.length && t[i] !== "}") {
    const keyEnd = endOfValue(t, i);
    const key = JSON.parse(t.slice(i, keyEnd)) as string;
    i = skipWs(t, skipWs(t, keyEnd) + 1);
    const end = endOfValue(t, i);
    out.push([key, t.slice(i, end)]);
    i = skipWs(t, end);
    if (t[i] === ",") i = skipWs(t, i + 1);
  }
  return out;
}

/** Splits text at `sep` outside JSON strings and brackets. */
function splitTopLevel(t: string, sep: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  let inString = false;
  for (let i = 0; i < t.length; i++) {
    const c = t[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") depth--;
    else if (c === sep && depth === 0) {
      parts.push(t.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(t.slice(start));
  return parts;
}

/** How the generation prompt leaves a think block: opened (the reply starts inside), closed (thinking off), or neither. */
export type PromptThinking = "open" | "closed" | "none";

/** A tool as the template probes see it. */
const PROBE_NAME = "ooze_probe_tool";
const PROBE_ARG = "ooze_probe_arg";
const PROBE_TEXT = "ooze-probe-message";

/**
 * A gateway's reply format with its template: turns each request's intents into a ReplyPlan. It
 * reads two things off the template by rendering small probe conversations once (cached): how the
 * generation prompt leaves a think block, and how the template writes a call (what a forced call's
 * opening must look like, so the forced turn reads as the model's own turns do).
 */
export class ReplyFormat {
  private readonly thinking = new Map<string, { state: PromptThinking; tail: string }>();
  private readonly callOpenings = new Map<string, { beforeName: string; beforeArgs: string }>();

  constructor(
    readonly spec: ReplyFormatSpec,
    private readonly template: ChatTemplate,
    /** The template reads `enable_thinking` (Qwen3): Anthropic's `thinking` maps to it. */
    readonly thinkingSwitch: boolean,
  ) {}

  /** The format of a template: `spec` when given, else detected from its Jinja source (null: built-in). */
  static of(template: ChatTemplate, source: string | null, spec?: Partial<ReplyFormatSpec>): ReplyFormat {
    return new ReplyFormat({ ...detectReplyFormat(source), ...spec }, template, source?.includes("enable_thinking") ?? false);
  }

  /**
   * The plan of a request: what to parse, a forced call's opening, engine stops, template
   * variables. Throws a 400 GatewayError for what the request asks and this model cannot do.
   */
  plan(req: ChatRequest): ReplyPlan {
    const vars: Record<string, unknown> = { ...req.templateVars };
    if (req.thinking !== null) {
      const param = "thinking";
      if (this.thinkingSwitch) vars.enable_thinking = req.thinking;
      else if (!(req.thinking && this.spec.reasoning)) {
        throw new GatewayError(
          "invalid_request",
          `'thinking' ${req.thinking ? "enabled" : "disabled"} is not supported by this model: its chat template has ${this.spec.reasoning ? "no enable_thinking switch (it always reasons)" : "no reasoning"}; leave 'thinking' out`,
          param,
        );
      }
    }
    const tc = req.toolChoice;
    const offered = req.tools.length > 0;
    if ((tc.type === "required" || tc.type === "function") && !offered) {
      throw invalid("tool_choice", `"auto" or "none" when no tools are given (it asks for a tool call)`, tc.type === "function" ? { type: "function" } : "required");
    }
    if (tc.type === "function" && !req.tools.some((t) => t.name === tc.name)) {
      throw new GatewayError("invalid_request", `'tool_choice' names the function '${tc.name}', which is not among 'tools' (${req.tools.map((t) => t.name).join(", ")})`, "tool_choice");
    }
    const syntax = offered && tc.type !== "none" ? this.spec.toolCalls : null;
    const promptThinking = this.spec.reasoning ? this.promptThinking(vars) : { state: "none" as const, tail: "" };
    const parse: ReplyParse = {
      toolCalls: syntax,
      reasoning: this.spec.reasoning,
      thinkingOpen: promptThinking.state === "open",
      maxCalls: req.parallelToolCalls ? Infinity : 1,
    };
    let prefill = "";
    if (syntax !== null && (tc.type === "required" || tc.type === "function")) {
      // A forced call: the turn opens with the call as the template writes one, after an empty think
      // block when the model reasons (thinking is skipped, as Qwen3's template skips it when off).
      if (this.spec.reasoning) prefill = skipThinking(promptThinking.state, promptThinking.tail);
      const o = this.callOpening(vars);
      prefill += tc.type === "function" ? o.beforeArgs.replace(PROBE_NAME, JSON.stringify(tc.name).slice(1, -1)) : o.beforeName;
    }
    const stop = syntax === "hermes" && !req.parallelToolCalls ? [CALL_CLOSE] : [];
    return { parse, prefill, stop, templateVars: vars };
  }

  /** How the generation prompt leaves a think block, with these template variables (probed once per set). */
  promptThinking(vars: Record<string, unknown>): { state: PromptThinking; tail: string } {
    const key = JSON.stringify(vars);
    let t = this.thinking.get(key);
    if (!t) {
      let tail = "";
      try {
        const text = this.template.render([probeUser()], [], vars);
        tail = text.slice(text.lastIndexOf(PROBE_TEXT) + PROBE_TEXT.length);
      } catch {
        // a template that refuses the probe: nothing known, nothing assumed
      }
      const o = tail.lastIndexOf(THINK_OPEN);
      const c = tail.lastIndexOf(THINK_CLOSE);
      t = { state: o >= 0 && o > c ? "open" : c >= 0 ? "closed" : "none", tail };
      this.thinking.set(key, t);
    }
    return t;
  }

  /** The opening of a call as the template writes one: up to the name, and up to the arguments (name = PROBE_NAME). */
  private callOpening(vars: Record<string, unknown>): { beforeName: string; beforeArgs: string } {
    const key = JSON.stringify(vars);
    let o = this.callOpenings.get(key);
    if (!o) {
      o = this.probeCallOpening(vars) ?? fallbackOpening(this.spec.toolCalls);
      this.callOpenings.set(key, o);
    }
    return o;
  }

  private probeCallOpening(vars: Record<string, unknown>): { beforeName: string; beforeArgs: string } | null {
    const call: ChatMessage = { role: "assistant", content: "", toolCalls: [{ id: "call_probe", name: PROBE_NAME, arguments: `{"${PROBE_ARG}": 1}` }], toolCallId: null };
    let text: string;
    try {
      text = this.template.render([probeUser(), call], [{ name: PROBE_NAME, description: "", parameters: { type: "object" } }], vars);
    } catch {
      return null;
    }
    const n = text.lastIndexOf(PROBE_NAME);
    const a = text.indexOf(`"${PROBE_ARG}"`, n);
    const argsAt = a < 0 ? -1 : text.lastIndexOf("{", a);
    const start = this.spec.toolCalls === "hermes" ? text.lastIndexOf(CALL_OPEN, n) : text.lastIndexOf("{", n);
    if (n < 0 || argsAt <= n || start < 0) return null;
    // Each opening ends before the whitespace and quote that lead the value: the model samples those
    // as it would in its own calls (`: "` and `: {` are single tokens in common vocabularies).
    const beforeName = text.slice(start, n).replace(/\s*"$/, "");
    const beforeArgs = text.slice(start, argsAt).trimEnd();
    if (!beforeName.endsWith(":") || !beforeArgs.endsWith(":")) return null;
    return { beforeName, beforeArgs };
  }
}

function probeUser(): ChatMessage {
  return { role: "user", content: PROBE_TEXT, toolCalls: [], toolCallId: null };
}

function fallbackOpening(syntax: ToolCallSyntax): { beforeName: string; beforeArgs: string } {
  return syntax === "hermes"
    ? { beforeName: `${CALL_OPEN}\n{"name":`, beforeArgs: `${CALL_OPEN}\n{"name": "${PROBE_NAME}", "arguments":` }
    : { beforeName: `{"name":`, beforeArgs: `{"name": "${PROBE_NAME}", "parameters":` };
}

/** The text that completes an empty think block after a generation prompt in this state. */
function skipThinking(state: PromptThinking, tail: string): string {
  if (state === "closed") return "";
  if (state === "none") return EMPTY_THINK;
  const opened = tail.slice(tail.lastIndexOf(THINK_OPEN));
  return EMPTY_THINK.startsWith(opened) ? EMPTY_THINK.slice(opened.length) : `\n${THINK_CLOSE}\n\n`;
}

/** Hermes calls of a reply's text (the built-in template's syntax): all blocks well-formed, or none parsed and the text as it is. */
export function parseToolCalls(text: string): { content: string; toolCalls: ParsedReply["toolCalls"] } {
  const r = parseReply(text, defaultReplyPlan(true).parse);
  return { content: r.content, toolCalls: r.toolCalls };
}
