// Chat templates for the gateway: a model's Jinja chat template (HF `chat_template`, rendered with
// @huggingface/jinja) or the built-in one of the embedded byte-level model (written in code). The
// gateway renders each request whole (`render`), as a server deploying the model would, and so does
// SFT (actors/trainer/sft.ts), which trains each assistant turn as the template renders it. The built-in template teaches the Hermes/Qwen tool-call format, `<tool_call>{"name": …,
// "arguments": {…}}</tool_call>`; replies are parsed in reply-format.ts.
import { Template } from "@huggingface/jinja";
import { GatewayError } from "./errors.ts";
import type { ChatMessage, ToolSpec } from "./messages.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

/** A model's chat format: a conversation (and tools) rendered, with the generation prompt. */
export interface ChatTemplate {
  /**
   * Renders the conversation to text, with the generation prompt: what the model is given. `vars`
   * are template variables of this request (`enable_thinking`, `chat_template_kwargs`).
   */
  render(messages: readonly ChatMessage[], tools: readonly ToolSpec[], vars?: Readonly<Record<string, unknown>>): string;
}

/**
 * The built-in template of the byte-level default, written out in code (no template engine: it is
 * on every request's path). Compact, as the embedded models have short contexts and learn from
 * every byte they read:
 *
 *     <bos><|system|>{system}\n
 *     Tools: calc(expression) arithmetic; …\n            (with tools; parameter names, not schemas)
 *     Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>\n
 *     <|user|>{content}\n
 *     <|assistant|>{content}<tool_call>{"name": "calc", "arguments": {…}}</tool_call><eos>\n
 *     <|tool|>{content}\n
 *     <|assistant|>                                       (the generation prompt)
 *
 * The system turn appears when messages[0] is a system message with content or there are tools;
 * later system messages are left out. Tool calls are written as JSON with `, ` and `: ` separators.
 */
export class BuiltinChatTemplate implements ChatTemplate {
  constructor(private readonly tokenizer: ChatTokenizer) {}

  /** Template variables change nothing here: this template has none. */
  render(messages: readonly ChatMessage[], tools: readonly ToolSpec[], _vars?: Readonly<Record<string, unknown>>): string {
    let text = this.tokenizer.bosToken;
    const sys = messages[0]?.role === "system" ? messages[0].content : "";
    if (sys !== "" || tools.length > 0) {
      text += `<|system|>${sys}`;
      if (tools.length > 0) {
        text += sys !== "" ? "\nTools:" : "Tools:";
        for (const t of tools) {
          const props = (t.parameters as { properties?: unknown } | undefined)?.properties;
          const names = props && typeof props === "object" ? Object.keys(props) : [];
          text += ` ${t.name}(${names.join(", ")})${t.description ? ` ${t.description}` : ""};`;
        }
        text += '\nCall a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>';
      }
      text += "\n";
    }
    messages.forEach((m) => {
      if (m.role === "system") return;
      text += `<|${m.role}|>${m.content}`;
      for (const c of m.toolCalls) text += `<tool_call>${pyJson({ name: c.name, arguments: parseArgs(c.arguments) })}</tool_call>`;
      if (m.role === "assistant") text += this.tokenizer.eosToken;
      text += "\n";
    });
    return `${text}<|assistant|>`;
  }
}

/** JSON as Jinja's `tojson` (and Python's json.dumps) writes it: `, ` between items, `: ` after keys. */
function pyJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (v !== null && typeof v === "object") {
    return `{${Object.entries(v)
      .map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`)
      .join(", ")}}`;
  }
  return v === undefined ? "null" : JSON.stringify(v);
}

/**
 * A model's own Jinja chat template (HF `chat_template`), rendered with @huggingface/jinja, its
 * special tokens from the tokenizer. An assistant message goes in with its `content` and, when the
 * agent sent one, its `reasoning_content` (templates such as Qwen3's also read `<think>…</think>`
 * inline in the content); tool-call arguments as parsed JSON, as OpenAI-compatible servers pass
 * them. `variables` are extra template variables for every rendering (Qwen3's `enable_thinking:
 * false`).
 */
export class JinjaChatTemplate implements ChatTemplate {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly tokenizer: ChatTokenizer,
    readonly variables: Readonly<Record<string, unknown>> = {},
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new GatewayError("internal", `the chat template does not parse: ${(e as Error).message}`, null, { cause: e });
    }
  }

  render(messages: readonly ChatMessage[], tools: readonly ToolSpec[], vars: Readonly<Record<string, unknown>> = {}): string {
    const hfMessages = messages.map((m) => {
      const out: Record<string, unknown> = { role: m.role, content: m.content };
      if (m.toolCalls.length > 0) {
        out.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: parseArgs(c.arguments) } }));
      }
      if (m.toolCallId !== null) out.tool_call_id = m.toolCallId;
      if (m.reasoningContent !== undefined) out.reasoning_content = m.reasoningContent;
      return out;
    });
    const hfTools = tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.parameters } }));
    try {
      return this.template.render({
        ...this.variables,
        ...vars,
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
