// The gateway driven by the official `@anthropic-ai/sdk` over a real socket, in front of a real Fleet
// whose engine is the recording fake SGLang server answering scripted token ids: system prompts,
// tool_use blocks parsed from the sampled text, tool_result blocks rendered as tool turns with the
// sampled ids kept, the event stream (message_start … message_stop with text_delta and
// input_json_delta), stop_sequences, and usage; token-by-token streaming (text_delta events while
// the engine is held mid-answer, then the tool_use block), recorded as a non-streamed request.
import Anthropic from "@anthropic-ai/sdk";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { EOS_ID, encodeBytes } from "../../src/engine/tokenizer.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { sampleProblem } from "../../src/sample.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";
import { waitUntil } from "../harness/index.ts";

let fake: HostileSglang;
let fleet: Fleet;
let gw: Gateway;

const ids = (text: string) => [...encodeBytes(text), EOS_ID];
const lastInput = () => (fake.seen.filter((s) => s.path === "/generate").at(-1)!.body as { input_ids: number[] }).input_ids;
const tools: Anthropic.Tool[] = [{ name: "read_file", description: "Reads a file", input_schema: { type: "object", properties: { path: { type: "string" } } } }];

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
  gw = await Gateway.start({ fleet, contextLength: 4096, model: "ooze-test" });
});

afterAll(async () => {
  await gw?.close();
  await fleet?.close();
  await fake?.close();
});

describe("gateway: Anthropic messages", () => {
  it("returns tool_use blocks, takes tool_result blocks back with the sampled ids kept, and records one segment", async () => {
    const s = gw.openSession({ episodeId: "ep-a", groupIndex: 2 });
    const ai = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const out1 = ids('I will read it.<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>');
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: "What is in a.txt?" }];
    const { data: r1, response } = await ai.messages.create({ model: "ooze-test", max_tokens: 200, system: "You read files.", messages, tools }).withResponse();
    expect(response.headers.get("x-ooze-weight-version")).toBe("v0");
    expect(r1.type).toBe("message");
    expect(r1.role).toBe("assistant");
    expect(r1.stop_reason).toBe("tool_use");
    expect(r1.content[0]).toEqual({ type: "text", text: "I will read it." });
    const use = r1.content[1] as Anthropic.ToolUseBlock;
    expect(use).toMatchObject({ type: "tool_use", name: "read_file", input: { path: "a.txt" } });
    expect(r1.usage.output_tokens).toBe(out1.length);
    const in1 = lastInput();
    expect(Buffer.from(in1.filter((t) => t < 256)).toString()).toContain("<|system|>You read files.");

    const out2 = ids("It says hello.");
    fake.script("/generate", { kind: "tokens", ids: out2 });
    messages.push({ role: "assistant", content: r1.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "hello" }] });
    const r2 = await ai.messages.create({ model: "ooze-test", max_tokens: 200, system: "You read files.", messages, tools });
    expect(r2.content).toEqual([{ type: "text", text: "It says hello." }]);
    expect(r2.stop_reason).toBe("end_turn");
    const in2 = lastInput();
    expect(in2.slice(0, in1.length + out1.length)).toEqual([...in1, ...out1]);
    expect(Buffer.from(in2.slice(in1.length + out1.length)).toString()).toBe("\n<|tool|>hello\n<|assistant|>");

    const rep = gw.closeSession(s.id);
    expect(rep.samples).toHaveLength(1);
    const smp = rep.samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(smp).toMatchObject({ rolloutId: "ep-a", groupIndex: 2, status: "completed" });
    expect(Array.from(smp.tokens)).toEqual([...in2, ...out2]);
    expect(Array.from(smp.lossMask).reduce((a, b) => a + b, 0)).toBe(out1.length + out2.length);
  });

  it("streams the documented events: text_delta, input_json_delta, message_delta with stop_reason and usage", async () => {
    const s = gw.openSession({ episodeId: "ep-b", groupIndex: 0 });
    const ai = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    fake.script("/generate", { kind: "tokens", ids: ids('Reading.<tool_call>{"name": "read_file", "arguments": {"path": "b.txt"}}</tool_call>') });
    const stream = ai.messages.stream({ model: "ooze-test", max_tokens: 100, messages: [{ role: "user", content: "b.txt?" }], tools });
    const types: string[] = [];
    const deltas: string[] = [];
    stream.on("streamEvent", (e) => {
      types.push(e.type);
      if (e.type === "content_block_delta") deltas.push(e.delta.type);
    });
    const final = await stream.finalMessage();
    expect(types[0]).toBe("message_start");
    expect(types.slice(-2)).toEqual(["message_delta", "message_stop"]);
    // Text deltas as the tokens come (one per token from this fake), then the call's input.
    expect(deltas.at(-1)).toBe("input_json_delta");
    expect(new Set(deltas.slice(0, -1))).toEqual(new Set(["text_delta"]));
    expect(final.stop_reason).toBe("tool_use");
    expect(final.content[0]).toEqual({ type: "text", text: "Reading." });
    expect(final.content[1]).toMatchObject({ type: "tool_use", name: "read_file", input: { path: "b.txt" } });
    expect(final.usage.output_tokens).toBeGreaterThan(0);

    // stop_sequences: the text is cut and the sequence reported.
    fake.script("/generate", { kind: "tokens", ids: ids("alpha END beta") });
    const r = await ai.messages.create({ model: "ooze-test", max_tokens: 100, messages: [{ role: "user", content: "go" }], stop_sequences: ["END"] });
    expect(r.content).toEqual([{ type: "text", text: "alpha " }]);
    expect(r.stop_reason).toBe("stop_sequence");
    expect(r.stop_sequence).toBe("END");
    // max_tokens: truncated.
    fake.script("/generate", { kind: "tokens", ids: ids("a long answer") });
    const t = await ai.messages.create({ model: "ooze-test", max_tokens: 3, messages: [{ role: "user", content: "go" }] });
    expect(t.stop_reason).toBe("max_tokens");
    expect(t.content).toEqual([{ type: "text", text: "a l" }]);
    const rep = gw.closeSession(s.id);
    expect(rep.samples.map((x) => x.status)).toEqual(["completed", "completed", "truncated"]);
  });

  it("streams text_delta events as the engine samples, then tool_use with input_json_delta, recorded as when not streamed", async () => {
    const text = "Je vais lire le fichier r\u00e9sum\u00e9.txt pour v\u00e9rifier. ";
    const call = '<tool_call>{"name": "read_file", "arguments": {"path": "r\u00e9sum\u00e9.txt"}}</tool_call>';
    const out = ids(text + call);
    // Held inside the second "é" (two bytes): its first byte sent.
    const holdAfter = out.indexOf(0xc3, out.indexOf(0xc3) + 2) + 1;
    const before = Buffer.from(out.slice(0, holdAfter - 1)).toString();
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: "What is in résumé.txt?" }];

    const plain = gw.openSession({ episodeId: "ep-plain", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: out });
    const r = await new Anthropic({ baseURL: plain.anthropicBaseUrl, apiKey: plain.apiKey, maxRetries: 0 }).messages.create({ model: "ooze-test", max_tokens: 300, messages, tools });
    const plainSample = gw.closeSession(plain.id).samples[0]!;

    const s = gw.openSession({ episodeId: "ep-stream", groupIndex: 0 });
    const ai = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter });
    const stream = ai.messages.stream({ model: "ooze-test", max_tokens: 300, messages, tools });
    const events: Anthropic.RawMessageStreamEvent[] = [];
    stream.on("streamEvent", (e) => events.push(e));
    const textSoFar = () => events.map((e) => (e.type === "content_block_delta" && e.delta.type === "text_delta" ? e.delta.text : "")).join("");
    await waitUntil(() => textSoFar() === before, { what: "the text sampled before the hold", timeoutMs: 10_000, diagnostics: () => JSON.stringify(textSoFar()) });
    expect(events.filter((e) => e.type === "content_block_delta").length).toBeGreaterThanOrEqual(2);
    expect(events.map((e) => e.type)).not.toContain("message_delta");
    expect(fake.release()).toBe(1);
    const final = await stream.finalMessage();
    expect(final.content).toEqual(r.content.map((b) => (b.type === "tool_use" ? { ...b, id: expect.any(String) } : b)));
    expect(final.content[0]).toEqual({ type: "text", text: text.trimEnd() });
    expect(final.content[1]).toMatchObject({ type: "tool_use", name: "read_file", input: { path: "résumé.txt" } });
    expect(final.stop_reason).toBe("tool_use");
    expect(final.usage.output_tokens).toBe(out.length);
    const types = events.map((e) => (e.type === "content_block_delta" ? `${e.type}:${e.delta.type}` : e.type));
    expect(types.slice(-6)).toEqual(["content_block_stop", "content_block_start", "content_block_delta:input_json_delta", "content_block_stop", "message_delta", "message_stop"]);
    const smp = gw.closeSession(s.id).samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(Array.from(smp.tokens)).toEqual(Array.from(plainSample.tokens));
    expect(Array.from(smp.lossMask)).toEqual(Array.from(plainSample.lossMask));
    expect(Array.from(smp.rolloutLogprobs)).toEqual(Array.from(plainSample.rolloutLogprobs));
  });

  it("sends the raw event sequence on the wire, ping included (the SDK hides pings)", async () => {
    const s = gw.openSession({ episodeId: "ep-c", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: ids("hi") });
    const res = await fetch(`${s.anthropicBaseUrl}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": s.apiKey, "anthropic-version": "2023-06-01", "content-type": "application/json" },
      body: JSON.stringify({ model: "ooze-test", max_tokens: 10, stream: true, messages: [{ role: "user", content: "hello" }] }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const text = await res.text();
    const events = [...text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    // One text_delta per token here: the fake sends a chunk per token.
    expect(events).toEqual(["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]);
    gw.closeSession(s.id);
  });
});
