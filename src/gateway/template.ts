// Chat templates for the gateway: a Jinja chat template (HF `chat_template`, rendered with
// @huggingface/jinja) or the built-in one for the embedded byte-level model, rendered into pieces —
// template text between assistant turns, and slots where a turn the engine sampled goes back as its
// exact ids (a sentinel stands in its content while rendering). Also the tool-call format the
// built-in template teaches: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes/Qwen
// style), parsed back out of sampled text.
import { randomBytes } from "node:crypto";
import { Template } from "@huggingface/jinja";
import { GatewayError } from "./errors.ts";
import type { ChatMessage, ToolSpec } from "./messages.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

/**
 * The built-in template for the byte-level default: compact (the embedded models have short
 * contexts and learn from every byte they read), tools in the system turn as one signature each
 * (`calc(expression) arithmetic;` — names of the parameters, not their JSON schema), assistant turns
 * closed by EOS.
 */
export const BUILTIN_CHAT_TEMPLATE = [
  "{{- bos_token -}}",
  "{%- set sys = '' -%}",
  "{%- if messages and messages[0].role == 'system' -%}{%- set sys = messages[0].content -%}{%- endif -%}",
  "{%- if sys or tools -%}<|system|>{{ sys }}",
  "{%- if tools -%}{{ '\\n' if sys }}Tools:",
  "{%- for t in tools %} {{ t.function.name }}({% for k, v in (t.function.parameters.properties or {}).items() %}{{ k }}{{ ', ' if not loop.last }}{% endfor %}){{ (' ' + t.function.description) if t.function.description }};{% endfor %}",
  "{{ '\\n' }}Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>",
  "{%- endif -%}{{ '\\n' }}",
  "{%- endif -%}",
  "{%- for m in messages -%}",
  "{%- if m.role != 'system' -%}",
  "<|{{ m.role }}|>{{ m.content }}",
  "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{%- endfor -%}{%- endif -%}",
  "{%- if m.role == 'assistant' -%}{{ eos_token }}{%- endif -%}{{ '\\n' }}",
  "{%- endif -%}",
  "{%- endfor -%}",
  "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}",
].join("\n");

/** A piece of a rendered conversation: template text, or the slot of an assistant message matched to sampled turns. */
export type RenderedPiece = { text: string } | { message: number };

/** A chat template bound to its tokenizer's special tokens. */
export class ChatTemplate {
  private readonly template: Template;
  private readonly nonce = randomBytes(6).toString("hex");

  constructor(
    readonly source: string,
    private readonly tokenizer: ChatTokenizer,
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new GatewayError("internal", `the chat template does not parse: ${(e as Error).message}`, null, { cause: e });
    }
  }

  /** Renders the conversation to text (with the generation prompt). */
  render(messages: readonly ChatMessage[], tools: readonly ToolSpec[]): string {
    return this.renderWith(messages, tools, new Set());
  }

  /**
   * Renders into pieces: the assistant messages in `slots` are rendered as sentinels and split out,
   * so the caller puts their sampled ids there. When the template does not keep a sentinel intact
   * exactly once and in order (it rewrites or drops assistant content), the whole conversation is
   * rendered as text (no slots): the request then cannot extend a trajectory.
   */
  renderPieces(messages: readonly ChatMessage[], tools: readonly ToolSpec[], slots: ReadonlySet<number>): RenderedPiece[] {
    const text = this.renderWith(messages, tools, slots);
    const order = [...slots].sort((a, b) => a - b);
    const pieces: RenderedPiece[] = [];
    let at = 0;
    for (const i of order) {
      const s = this.sentinel(i);
      const k = text.indexOf(s, at);
      if (k < 0 || text.indexOf(s, k + s.length) >= 0) return [{ text: this.render(messages, tools) }];
      pieces.push({ text: text.slice(at, k) }, { message: i });
      at = k + s.length;
    }
    pieces.push({ text: text.slice(at) });
    return pieces;
  }

  private sentinel(i: number): string {
    return `@@ooze-${this.nonce}-turn-${i}@@`;
  }

  private renderWith(messages: readonly ChatMessage[], tools: readonly ToolSpec[], slots: ReadonlySet<number>): string {
    const hfMessages = messages.map((m, i) => {
      if (slots.has(i)) return { role: "assistant", content: this.sentinel(i) };
      const out: Record<string, unknown> = { role: m.role, content: m.content };
      if (m.toolCalls.length > 0) {
        out.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: parseArgs(c.arguments) } }));
      }
      if (m.toolCallId !== null) out.tool_call_id = m.toolCallId;
      return out;
    });
    const hfTools = tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.parameters } }));
    try {
      return this.template.render({
        messages: hfMessages,
        tools: hfTools.length > 0 ? hfTools : undefined,
        add_generation_prompt: true,
        bos_token: this.tokenizer.bosToken,
        eos_token: this.tokenizer.eosToken,
      });
    } catch (e) {
      throw new GatewayError("invalid_request", `the model's chat template refused the conversation: ${(e as Error).message}`, "messages", { cause: e });
    }
  }
}

function parseArgs(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Text and tool calls parsed from a sampled turn. */
export interface ParsedTurn {
  content: string;
  toolCalls: { name: string; arguments: string }[];
}

/**
 * Parses `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks out of sampled text. A block
 * that is not such JSON stays in the text (never dropped); so does an unclosed one.
 */
export function parseToolCalls(text: string): ParsedTurn {
  const toolCalls: ParsedTurn["toolCalls"] = [];
  const content = text.replace(/<tool_call>([\s\S]*?)<\/tool_call>/g, (whole, inner: string) => {
    let v: unknown;
    try {
      v = JSON.parse(inner.trim());
    } catch {
      return whole;
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) return whole;
    const o = v as Record<string, unknown>;
    const args = o.arguments ?? o.parameters ?? {};
    if (typeof o.name !== "string" || o.name === "") return whole;
    let argText: string;
    if (typeof args === "string") {
      try {
        const parsed: unknown = JSON.parse(args);
        if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return whole;
        argText = args;
      } catch {
        return whole;
      }
    } else if (typeof args === "object" && args !== null && !Array.isArray(args)) argText = JSON.stringify(args);
    else return whole;
    toolCalls.push({ name: o.name, arguments: argText });
    return "";
  });
  // Trailing whitespace (before a call) goes; leading whitespace stays, so that a streamed answer's
  // text, sent before the calls are parsed, is a prefix of this content.
  return { content: toolCalls.length > 0 ? content.trimEnd() : content, toolCalls };
}
