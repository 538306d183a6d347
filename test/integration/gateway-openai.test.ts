// The gateway driven by the official `openai` SDK over a real socket, in front of a real Fleet whose
// engine is the recording fake SGLang server (test/fixtures/hostile-sglang.ts) answering scripted
// token ids: tool calls parsed into the SDK's shapes (streamed and not), unparseable calls kept as
// text, token-in/token-out across turns (the engine's sampled ids sent back, never re-encoded),
// a rewritten history opening a new segment, n > 1, logprobs, stop strings and usage; and
// token-by-token streaming: deltas sent while the engine is still sampling (held mid-answer), never
// inside a UTF-8 character, concatenating to the non-streamed text, with the same recorded sample.
import OpenAI from "openai";
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

const ids = (text: string, eos = true) => [...encodeBytes(text), ...(eos ? [EOS_ID] : [])];
const generateBodies = () => fake.seen.filter((s) => s.path === "/generate").map((s) => s.body as { input_ids: number[]; sampling_params: Record<string, unknown> });
const lastInput = () => generateBodies().at(-1)!.input_ids;

const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
];

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

function client(s: { openaiBaseUrl: string; apiKey: string }) {
  return new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
}

describe("gateway: OpenAI chat completions", () => {
  it("parses a tool call, sends the sampled ids back on the next turn, and records one token-exact segment", async () => {
    const s = gw.openSession({ episodeId: "ep-1", groupIndex: 3 });
    const ai = client(s);
    expect(s.openaiBaseUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/s\/[0-9a-f]+\/v1$/);
    const out1 = ids('Let me look.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>');
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [
      { role: "system", content: "You are helpful." },
      { role: "user", content: "Weather in Paris?" },
    ];
    const r1 = await ai.chat.completions.create({ model: "ooze-test", messages, tools, temperature: 0.7 });
    const m1 = r1.choices[0]!.message;
    expect(r1.choices[0]!.finish_reason).toBe("tool_calls");
    expect(m1.content).toBe("Let me look.");
    expect(m1.tool_calls).toHaveLength(1);
    const call = m1.tool_calls![0]!;
    expect(call.type).toBe("function");
    if (call.type !== "function") throw new Error("not a function call");
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ city: "Paris" });
    const input1 = lastInput();
    expect(generateBodies().at(-1)!.sampling_params.temperature).toBe(0.7);
    expect(r1.usage).toMatchObject({ prompt_tokens: input1.length, completion_tokens: out1.length });
    // The answer carries the policy version that sampled it.
    expect(r1.system_fingerprint).toBe("v0");
    // The rendered prompt carries the tools in the system turn.
    expect(Buffer.from(input1.filter((t) => t < 256)).toString()).toContain("Tools: get_weather(city) Weather of a city;");

    const out2 = ids("It is sunny in Paris.");
    fake.script("/generate", { kind: "tokens", ids: out2 });
    messages.push(m1 as OpenAI.Chat.Completions.ChatCompletionMessageParam, { role: "tool", tool_call_id: call.id, content: "sunny, 21 C" });
    const r2 = await ai.chat.completions.create({ model: "ooze-test", messages, tools });
    expect(r2.choices[0]!.message.content).toBe("It is sunny in Paris.");
    expect(r2.choices[0]!.finish_reason).toBe("stop");
    const input2 = lastInput();
    // Token-in/token-out: the second prompt is the first prompt + the engine's own ids + the tool turn.
    expect(input2.slice(0, input1.length + out1.length)).toEqual([...input1, ...out1]);
    const toolTurn = input2.slice(input1.length + out1.length);
    expect(Buffer.from(toolTurn).toString()).toBe("\n<|tool|>sunny, 21 C\n<|assistant|>");

    const rep = gw.closeSession(s.id);
    expect(rep.requests).toBe(2);
    expect(rep.error).toBeNull();
    expect(rep.samples).toHaveLength(1);
    const smp = rep.samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(smp).toMatchObject({ index: 0, groupIndex: 3, rolloutId: "ep-1", status: "completed" });
    expect(Array.from(smp.tokens)).toEqual([...input2, ...out2]);
    const mask = Array.from(smp.lossMask);
    expect(mask).toEqual([...out1.map(() => 1), ...toolTurn.map(() => 0), ...out2.map(() => 1)]);
    expect(smp.weightVersions).toEqual([
      { start: 0, end: out1.length, version: "v0" },
      { start: out1.length + toolTurn.length, end: smp.responseLength, version: "v0" },
    ]);
    expect(Array.from(smp.rolloutLogprobs).filter((_, i) => mask[i] === 0).every((x) => x === 0)).toBe(true);
    expect((smp.metadata.transcript as unknown[]).length).toBe(5);
    expect(smp.metadata.segment).toBe(0);
    // Session affinity: every /generate of the session carried its routing key.
    const seen = fake.seen.filter((x) => x.path === "/generate").slice(-2);
    expect(seen.every((x) => x.headers["x-smg-routing-key"] === s.id)).toBe(true);
  });

  it("streams a tool call in chat.completion.chunk deltas with usage, and returns an unparseable call as text", async () => {
    const s = gw.openSession({ episodeId: "ep-2", groupIndex: 0 });
    const ai = client(s);
    fake.script("/generate", { kind: "tokens", ids: ids('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>') });
    const stream = await ai.chat.completions.create({
      model: "ooze-test",
      messages: [{ role: "user", content: "Oslo?" }],
      tools,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(chunks.every((c) => c.object === "chat.completion.chunk")).toBe(true);
    const calls = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.delta.tool_calls ?? []));
    expect(calls).toHaveLength(1);
    expect(calls[0]!.function!.name).toBe("get_weather");
    expect(JSON.parse(calls[0]!.function!.arguments!)).toEqual({ city: "Oslo" });
    expect(chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean)).toEqual(["tool_calls"]);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.system_fingerprint).toBe("v0");
    expect(last.usage?.completion_tokens).toBeGreaterThan(0);

    // The model writes a broken call: it comes back as text, not dropped.
    const broken = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>';
    fake.script("/generate", { kind: "tokens", ids: ids(broken) });
    const r = await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "user", content: "Oslo again?" }], tools });
    expect(r.choices[0]!.message.content).toBe(broken);
    expect(r.choices[0]!.message.tool_calls ?? []).toEqual([]);
    expect(r.choices[0]!.finish_reason).toBe("stop");
    gw.closeSession(s.id);
  });

  it("streams a long answer as the engine samples it: deltas before the end, whole characters, the non-streamed text and sample", async () => {
    const text = "Streaming h\u00e9llo w\u00f6rld \u2014 \u2713 ".repeat(3) + "done.";
    const out = ids(text);
    // Hold the engine inside the second "✓": two of its three bytes sent.
    const lead = out.indexOf(0xe2, out.indexOf(0xe2, out.indexOf(0xe2) + 3) + 3);
    const holdAfter = lead + 2;
    const before = Buffer.from(out.slice(0, lead)).toString().trimEnd(); // its trailing space waits for the next token
    const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: "user", content: "Say it." }];

    // The non-streamed answer of the same sampled ids, for comparison.
    const plain = gw.openSession({ episodeId: "ep-plain", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: out });
    const r = await client(plain).chat.completions.create({ model: "ooze-test", messages, logprobs: true });
    const plainSample = gw.closeSession(plain.id).samples[0]!;

    const s = gw.openSession({ episodeId: "ep-stream", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter });
    const stream = await client(s).chat.completions.create({ model: "ooze-test", messages, logprobs: true, stream: true, stream_options: { include_usage: true } });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    const reading = (async () => {
      for await (const c of stream) chunks.push(c);
    })();
    const content = () => chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? "")).join("");
    await waitUntil(() => content() === before, { what: "the text sampled before the hold to arrive", timeoutMs: 10_000, diagnostics: () => JSON.stringify(content()) });
    // Several deltas arrived while the engine was held, and nothing of the held character.
    const early = chunks.filter((c) => c.choices.some((ch) => (ch.delta.content ?? "") !== "")).length;
    expect(early).toBeGreaterThanOrEqual(2);
    expect(content()).not.toContain("\ufffd");
    expect(chunks.some((c) => c.choices.some((ch) => ch.finish_reason !== null))).toBe(false);
    expect(fake.release()).toBe(1);
    await reading;
    expect(content()).toBe(r.choices[0]!.message.content);
    expect(content()).toBe(text);
    expect(chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean)).toEqual(["stop"]);
    // Logprobs: one per sampled token (the EOS left out), as in the non-streamed answer.
    const lps = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.logprobs?.content ?? []));
    expect(lps).toEqual(r.choices[0]!.logprobs!.content);
    expect(chunks.at(-1)!.usage).toMatchObject({ completion_tokens: out.length });
    expect(chunks.at(-1)!.system_fingerprint).toBe("v0");
    // The trajectory is recorded exactly as for the non-streamed request.
    const smp = gw.closeSession(s.id).samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(Array.from(smp.tokens)).toEqual(Array.from(plainSample.tokens));
    expect(Array.from(smp.lossMask)).toEqual(Array.from(plainSample.lossMask));
    expect(Array.from(smp.rolloutLogprobs)).toEqual(Array.from(plainSample.rolloutLogprobs));
    expect(smp.weightVersions).toEqual(plainSample.weightVersions);
    expect(Array.from(smp.tokens.subarray(-out.length))).toEqual(out);
    expect(Array.from(smp.lossMask.subarray(-out.length)).every((m) => m === 1)).toBe(true);
    // The engine was asked to stream.
    expect((generateBodies().at(-1) as unknown as { stream?: boolean }).stream).toBe(true);
  });

  it("streams text before a tool call, then the call in tool_calls deltas; stop strings never leak", async () => {
    const s = gw.openSession({ episodeId: "ep-tool-stream", groupIndex: 0 });
    const ai = client(s);
    const text = 'Checking the weather now. <tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>';
    const out = ids(text);
    const holdAfter = text.indexOf("<tool_call>") + 5;
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter });
    const stream = await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "user", content: "Rome?" }], tools, stream: true });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    const reading = (async () => {
      for await (const c of stream) chunks.push(c);
    })();
    const content = () => chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? "")).join("");
    // The text before the call arrives; the space before it and the start of the block are held.
    await waitUntil(() => content() === "Checking the weather now.", { what: "the text before the tool call", timeoutMs: 10_000, diagnostics: () => JSON.stringify(content()) });
    expect(fake.release()).toBe(1);
    await reading;
    expect(content()).toBe("Checking the weather now.");
    const calls = chunks.flatMap((c) => c.choices.flatMap((ch) => ch.delta.tool_calls ?? []));
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather" } });
    expect(JSON.parse(calls[0]!.function!.arguments!)).toEqual({ city: "Rome" });
    expect(chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean)).toEqual(["tool_calls"]);

    // A stop string split over tokens: nothing of it is ever sent.
    fake.script("/generate", { kind: "tokens", ids: ids("one two STOP three"), holdAfter: "one two ST".length });
    const st = await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "user", content: "Count" }], stop: ["STOP"], stream: true });
    const parts: string[] = [];
    const reading2 = (async () => {
      for await (const c of st) for (const ch of c.choices) if (ch.delta.content) parts.push(ch.delta.content);
    })();
    // (the space before it waits for the next token: a decoder may drop a space given what follows)
    await waitUntil(() => parts.join("") === "one two", { what: "the text before the stop string", timeoutMs: 10_000, diagnostics: () => JSON.stringify(parts) });
    expect(fake.release()).toBe(1);
    await reading2;
    expect(parts.join("")).toBe("one two ");

    // n = 2: each choice streams under its own index.
    fake.script("/generate", { kind: "tokens", ids: ids("first choice") }, { kind: "tokens", ids: ids("second choice") });
    const two = await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "user", content: "Two" }], n: 2, stream: true });
    const byIndex = ["", ""];
    const finishes: (string | null)[] = [];
    for await (const c of two) {
      for (const ch of c.choices) {
        byIndex[ch.index] += ch.delta.content ?? "";
        if (ch.finish_reason) finishes.push(ch.finish_reason);
      }
    }
    expect([...byIndex].sort()).toEqual(["first choice", "second choice"]);
    expect(finishes).toEqual(["stop", "stop"]);
    gw.closeSession(s.id);
  });

  it("splits when the agent rewrites its history, keeps sampled ids for echoed turns, and forks n > 1 choices", async () => {
    const s = gw.openSession({ episodeId: "ep-3", groupIndex: 1 });
    const ai = client(s);
    // The sampled ids decode to text that would encode differently (a lone UTF-8 lead byte).
    const odd = [...encodeBytes("caf"), 0xc3, EOS_ID];
    fake.script("/generate", { kind: "tokens", ids: odd });
    const h: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: "user", content: "Say cafe" }];
    const r1 = await ai.chat.completions.create({ model: "ooze-test", messages: h });
    const a1 = r1.choices[0]!.message.content!;
    const in1 = lastInput();
    // Extend: the echoed text maps back to the exact sampled ids.
    fake.script("/generate", { kind: "tokens", ids: ids("ok") });
    h.push({ role: "assistant", content: a1 }, { role: "user", content: "Again" });
    await ai.chat.completions.create({ model: "ooze-test", messages: h });
    expect(lastInput().slice(0, in1.length + odd.length)).toEqual([...in1, ...odd]);
    // Compaction: the agent summarises the history: a new segment.
    fake.script("/generate", { kind: "tokens", ids: ids("sure") });
    await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "system", content: "Summary: said cafe twice." }, { role: "user", content: "Go on" }] });
    // n = 2 with logprobs and a stop string: two choices, the second a forked segment.
    fake.script("/generate", { kind: "tokens", ids: ids("one STOP two") }, { kind: "tokens", ids: ids("three") });
    const rn = await ai.chat.completions.create({ model: "ooze-test", messages: [{ role: "user", content: "Count" }], n: 2, logprobs: true, stop: ["STOP"] });
    expect(rn.choices.map((c) => c.message.content).sort()).toEqual(["one ", "three"]);
    const stopped = rn.choices.find((c) => c.message.content === "one ")!;
    expect(stopped.finish_reason).toBe("stop");
    expect(stopped.logprobs!.content!.length).toBe("one STOP two".length);
    expect(stopped.logprobs!.content![0]).toMatchObject({ token: "o", top_logprobs: [] });
    expect(generateBodies().at(-1)!.sampling_params.stop).toEqual(["STOP"]);
    const rep = gw.closeSession(s.id);
    // Segments: the extended conversation (2 turns), the compacted one, and the two choices of n = 2.
    expect(rep.samples.map((x) => x.index)).toEqual([0, 1, 2, 3]);
    expect(rep.samples.map((x) => x.metadata.turns)).toEqual([2, 1, 1, 1]);
    for (const x of rep.samples) expect(sampleProblem(x)).toBeNull();
    // The extended segment trains exactly the two sampled turns.
    const first = rep.samples[0]!;
    const trained = Array.from(first.tokens.slice(first.tokens.length - first.responseLength)).filter((_, i) => first.lossMask[i] === 1);
    expect(trained).toEqual([...odd, ...ids("ok")]);
  });

  it("keeps a main agent and a sub-agent running in parallel in their own segments", async () => {
    const s = gw.openSession({ episodeId: "ep-par", groupIndex: 0 });
    const ai = client(s);
    const main: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: "user", content: "main task" }];
    const sub: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: "user", content: "sub task" }];
    const outs = ["m1", "s1", "m2", "s2"].map((t) => ids(`answer ${t}`));
    fake.script("/generate", ...outs.map((x) => ({ kind: "tokens" as const, ids: x })));
    const ask = async (h: OpenAI.Chat.Completions.ChatCompletionMessageParam[]) => {
      const r = await ai.chat.completions.create({ model: "ooze-test", messages: h });
      h.push({ role: "assistant", content: r.choices[0]!.message.content }, { role: "user", content: "continue" });
      return r.choices[0]!.message.content!;
    };
    const first = await Promise.all([ask(main), ask(sub)]);
    const second = await Promise.all([ask(main), ask(sub)]);
    const rep = gw.closeSession(s.id);
    expect(rep.samples).toHaveLength(2);
    for (const [k, smp] of rep.samples.entries()) {
      expect(sampleProblem(smp)).toBeNull();
      expect(smp.metadata.turns).toBe(2);
      // Which conversation opened segment k is up to the race; its two answers are its own, in order.
      const conv = (smp.metadata.transcript as { content: string }[])[0]!.content === "main task" ? 0 : 1;
      const mine = [first[conv]!, second[conv]!].map((t) => [...encodeBytes(t), EOS_ID]);
      const trained = Array.from(smp.tokens.slice(smp.tokens.length - smp.responseLength)).filter((_, i) => smp.lossMask[i] === 1);
      expect(trained, `segment ${k}`).toEqual(mine.flat());
    }
  });

  it("lists the model", async () => {
    const s = gw.openSession({ episodeId: "ep-4", groupIndex: 0 });
    const models = await client(s).models.list();
    expect(models.data.map((m) => m.id)).toEqual(["ooze-test"]);
    gw.closeSession(s.id);
  });
});
