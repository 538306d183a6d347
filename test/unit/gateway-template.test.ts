// Unit tests of the gateway's pieces: loading an HF model directory's tokenizer and chat template
// (and the errors naming file and field), the built-in template's rendering into pieces around
// sampled-turn slots, the built-in template's calls parsed back, and the request parsers' shapes
// (reply parsing itself: gateway-reply.test.ts).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { BOS_ID, EOS_ID } from "../../src/engine/tokenizer.ts";
import {
  BuiltinChatTemplate,
  byteChatTokenizer,
  JinjaChatTemplate,
  loadHfChatModel,
  parseAnthropicRequest,
  parseOpenAIRequest,
  parseToolCalls,
  type ChatMessage,
} from "../../src/gateway/index.ts";
import { BPE_EOS, bpeTokenizerJson, CHATML } from "../fixtures/bpe-tokenizer.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-gateway-unit-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const msg = (role: ChatMessage["role"], content: string): ChatMessage => ({ role, content, toolCalls: [], toolCallId: null });

describe("gateway: HF model directory", () => {
  it("loads tokenizer.json, tokenizer_config.json's chat_template and the eos ids of config.json and generation_config.json", () => {
    const dir = join(root, "ok");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(bpeTokenizerJson()));
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<s>", eos_token: { content: "</s>" }, chat_template: CHATML }));
    writeFileSync(join(dir, "config.json"), JSON.stringify({ eos_token_id: [BPE_EOS, 7] }));
    writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ eos_token_id: 9 }));
    const m = loadHfChatModel(dir);
    expect(m.chatTemplate).toBe(CHATML);
    expect([...m.tokenizer.stopIds].sort((a, b) => a - b)).toEqual([7, 9, BPE_EOS]);
    expect(m.tokenizer.encode("<s>abc</s>")).toEqual([BPE_EOS - 1, 257, BPE_EOS]);
    expect(m.tokenizer.specialText.get(BPE_EOS)).toBe("</s>");
    const t = new JinjaChatTemplate(m.chatTemplate, m.tokenizer);
    expect(t.render([msg("user", "hi")], [])).toBe("<s>user\nhi</s>\n<s>assistant\n");
  });

  it("serves a directory loaded again from memory until one of its files changes", () => {
    const dir = join(root, "cached");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(bpeTokenizerJson()));
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "</s>", chat_template: CHATML }));
    const a = loadHfChatModel(dir);
    expect(loadHfChatModel(dir).tokenizer).toBe(a.tokenizer);
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "</s>", chat_template: `${CHATML} ` }));
    const b = loadHfChatModel(dir);
    expect(b.tokenizer).not.toBe(a.tokenizer);
    expect(b.chatTemplate).toBe(`${CHATML} `);
  });

  it("names the file and the field when something is missing", () => {
    const dir = join(root, "bad");
    mkdirSync(dir, { recursive: true });
    expect(() => loadHfChatModel(dir)).toThrow(/bad\/tokenizer_config\.json: cannot read it/);
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ eos_token: "</s>" }));
    expect(() => loadHfChatModel(dir)).toThrow(/tokenizer_config\.json: field 'chat_template' is missing/);
    writeFileSync(join(dir, "tokenizer_config.json"), "{oops");
    expect(() => loadHfChatModel(dir)).toThrow(/tokenizer_config\.json: not valid JSON/);
  });
});

describe("gateway: built-in template", () => {
  const tok = byteChatTokenizer();
  const t = new BuiltinChatTemplate(tok);

  it("encodes its special tokens and renders turns with the generation prompt", () => {
    expect(tok.encode("<bos>a<eos>")).toEqual([BOS_ID, 97, EOS_ID]);
    const msgs = [msg("system", "S"), msg("user", "u1"), msg("assistant", "a1"), msg("user", "u2")];
    expect(t.render(msgs, [])).toBe("<bos><|system|>S\n<|user|>u1\n<|assistant|>a1<eos>\n<|user|>u2\n<|assistant|>");
  });

  it("renders tools into the system turn and tool calls in the format it parses back", () => {
    const a: ChatMessage = { role: "assistant", content: "", toolCalls: [{ id: "c1", name: "f", arguments: '{"x": 1}' }], toolCallId: null };
    const g = { name: "g", description: "", parameters: { type: "object", properties: { a: { type: "string" }, b: { type: "number" } } } };
    const text = t.render([msg("user", "q"), a, { ...msg("tool", "42"), toolCallId: "c1" }], [{ name: "f", description: "d", parameters: { type: "object" } }, g]);
    expect(text).toContain("<|system|>Tools: f() d; g(a, b);\nCall a tool as <tool_call>");
    expect(t.render([msg("system", "S"), msg("user", "q")], [g])).toContain("<|system|>S\nTools: g(a, b);\n");
    const call = /<\|assistant\|>(.*)<eos>/.exec(text)![1]!;
    expect(parseToolCalls(call)).toEqual({ content: "", toolCalls: [{ name: "f", arguments: '{"x": 1}' }] });
    expect(text.endsWith("<|tool|>42\n<|assistant|>")).toBe(true);
  });
});

/**
 * The built-in format as the Jinja template it was first written as (and as an HF tokenizer_config
 * would carry it): the reference the code version is checked against, byte for byte.
 */
const BUILTIN_AS_JINJA = readFileSync(join(import.meta.dirname, "../fixtures/builtin-template.jinja"), "utf8");

describe("gateway: the built-in template in code", () => {
  const tok = byteChatTokenizer();
  const code = new BuiltinChatTemplate(tok);
  const jinja = new JinjaChatTemplate(BUILTIN_AS_JINJA, tok);
  const text = fc.oneof(fc.string({ maxLength: 12 }), fc.constantFrom("", "Ünï €", "a\nb", "{{ x }}", "<|user|>"));
  const json = fc.oneof(fc.constant("{}"), fc.constant("not json"), fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.stringify(v)));
  const call = fc.record({ id: fc.string({ maxLength: 4 }), name: fc.string({ minLength: 1, maxLength: 6 }), arguments: json });
  const message: fc.Arbitrary<ChatMessage> = fc.oneof(
    fc.record({ role: fc.constantFrom("system", "user", "tool") as fc.Arbitrary<ChatMessage["role"]>, content: text, toolCalls: fc.constant([] as ChatMessage["toolCalls"]), toolCallId: fc.constant(null) }),
    fc.record({ role: fc.constant("assistant") as fc.Arbitrary<ChatMessage["role"]>, content: text, toolCalls: fc.array(call, { maxLength: 2 }), toolCallId: fc.constant(null) }),
  );
  const tool = fc.record({
    name: fc.string({ minLength: 1, maxLength: 6 }),
    description: text,
    parameters: fc.oneof(fc.constant({ type: "object" }), fc.dictionary(fc.string({ minLength: 1, maxLength: 4 }), fc.constant({ type: "string" }), { maxKeys: 3 }).map((properties) => ({ type: "object", properties }))),
  });

  it("renders every conversation exactly as the Jinja reference does", () => {
    fc.assert(
      fc.property(fc.array(message, { maxLength: 6 }), fc.array(tool, { maxLength: 3 }), (msgs, tools) => {
        expect(code.render(msgs, tools)).toBe(jinja.render(msgs, tools));
      }),
      { numRuns: 300 },
    );
  });
});

describe("gateway: request parsers", () => {
  it("normalises OpenAI content parts, developer role, tool calls and options", () => {
    const r = parseOpenAIRequest({
      model: "m",
      messages: [
        { role: "developer", content: [{ type: "text", text: "be " }, { type: "text", text: "kind" }] },
        { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }] },
        { role: "tool", tool_call_id: "c", content: "ok" },
      ],
      max_completion_tokens: 9,
      stop: "END",
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(r.messages.map((m) => [m.role, m.content])).toEqual([
      ["system", "be kind"],
      ["assistant", ""],
      ["tool", "ok"],
    ]);
    expect(r).toMatchObject({ maxTokens: 9, stop: ["END"], stream: true, includeUsage: true, n: 1 });
  });

  it("turns Anthropic tool_result blocks into tool turns and tool_use into calls", () => {
    const r = parseAnthropicRequest({
      model: "m",
      max_tokens: 5,
      system: [{ type: "text", text: "sys" }],
      messages: [
        { role: "user", content: "q" },
        { role: "assistant", content: [{ type: "text", text: "t" }, { type: "tool_use", id: "u", name: "f", input: { a: 1 } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "u", content: [{ type: "text", text: "r" }], is_error: true }, { type: "text", text: "more" }] },
      ],
    });
    expect(r.messages.map((m) => [m.role, m.content, m.toolCalls.map((c) => c.name).join(), m.toolCallId])).toEqual([
      ["system", "sys", "", null],
      ["user", "q", "", null],
      ["assistant", "t", "f", null],
      ["tool", "Error: r", "", "u"],
      ["user", "more", "", null],
    ]);
  });
});
