// The gateway's Responses API driven by the official `openai` SDK (`client.responses.create`, plain
// and streamed, and the SDK's `responses.stream` helper, whose accumulator rejects events that do not
// fit its snapshot) over a real socket, in front of a real Fleet whose engine is the recording fake
// SGLang server answering scripted ids: a function call round trip with function_call_output is
// token-exact and gives the engine the same ids as the same conversation over chat completions;
// previous_response_id continues exactly as sending the output items back does (store: false keeps
// nothing); reasoning items come back as they went out; max_output_tokens gives status incomplete;
// fields the gateway cannot honour are refused with 400 before anything reaches the engine; with no
// engine, 503 before a stream and an error event then response.failed after it began.
import OpenAI from "openai";
import { readFileSync } from "node:fs";
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
/** The built-in format as Jinja, with an assistant's reasoning_content written back as a <think> block. */
let thinking: Gateway;

const ids = (text: string, eos = true) => [...encodeBytes(text), ...(eos ? [EOS_ID] : [])];
const generateBodies = () => fake.seen.filter((s) => s.path === "/generate").map((s) => s.body as { input_ids: number[]; sampling_params: Record<string, unknown> });
const lastInput = () => generateBodies().at(-1)!.input_ids;
const text = (input: number[]) => Buffer.from(input.filter((t) => t < 256)).toString();

const tools: OpenAI.Responses.Tool[] = [
  { type: "function", name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }, strict: true },
];
const CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>';

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
  gw = await Gateway.start({ fleet, contextLength: 4096, model: "ooze-test" });
  const jinja = readFileSync(new URL("../fixtures/builtin-template.jinja", import.meta.url), "utf8").replace(
    "<|{{ m.role }}|>{{ m.content }}",
    "<|{{ m.role }}|>{%- if m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>{%- endif -%}{{ m.content }}",
  );
  if (!jinja.includes("</think>")) throw new Error("the fixture template changed: the reasoning variant was not made");
  thinking = await Gateway.start({ fleet, contextLength: 4096, model: "ooze-test", chatTemplate: jinja });
});

afterAll(async () => {
  await gw?.close();
  await thinking?.close();
  await fleet?.close();
  await fake?.close();
});

function client(s: { openaiBaseUrl: string; apiKey: string }) {
  return new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
}

async function apiError(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  const e = await p.then(
    () => null,
    (x: unknown) => x,
  );
  if (!(e instanceof OpenAI.APIError)) throw new Error(`expected an OpenAI APIError, got ${String(e)}`);
  return e;
}

describe("gateway: OpenAI Responses API", () => {
  it("answers a string input with instructions: a response object, usage, the weight version", async () => {
    const s = gw.openSession({ episodeId: "ep-r1", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: ids("Hello there.") });
    const { data: r, response } = await client(s).responses.create({ model: "ooze-test", instructions: "Be brief.", input: "Hi", temperature: 0.5, max_output_tokens: 64 }).withResponse();
    const input = lastInput();
    expect(text(input)).toBe("<|system|>Be brief.\n<|user|>Hi\n<|assistant|>");
    expect(generateBodies().at(-1)!.sampling_params).toMatchObject({ temperature: 0.5, max_new_tokens: 64 });
    expect(r).toMatchObject({ object: "response", status: "completed", model: "ooze-test", instructions: "Be brief.", incomplete_details: null, error: null, temperature: 0.5, max_output_tokens: 64 });
    expect(r.id).toMatch(/^resp_/);
    expect(r.output).toHaveLength(1);
    expect(r.output[0]).toMatchObject({ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Hello there.", annotations: [] }] });
    expect(r.output_text).toBe("Hello there.");
    expect(r.usage).toMatchObject({ input_tokens: input.length, output_tokens: 13, total_tokens: input.length + 13, output_tokens_details: { reasoning_tokens: 0 } });
    expect(r.usage!.input_tokens_details.cached_tokens).toBeGreaterThanOrEqual(0);
    expect(response.headers.get("x-ooze-weight-version")).toBe("v0");
    const smp = gw.closeSession(s.id).samples[0]!;
    expect(Array.from(smp.tokens)).toEqual([...input, ...ids("Hello there.")]);
  });

  it("round-trips a function call with function_call_output token-exactly, as chat completions would", async () => {
    const out1 = ids(`Let me look.${CALL}`);
    const out2 = ids("It is sunny in Paris.");
    const s = gw.openSession({ episodeId: "ep-r2", groupIndex: 2 });
    const ai = client(s);
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const input: OpenAI.Responses.ResponseInputItem[] = [{ role: "user", content: [{ type: "input_text", text: "Weather in Paris?" }] }];
    const r1 = await ai.responses.create({ model: "ooze-test", instructions: "You are helpful.", input, tools });
    const input1 = lastInput();
    expect(r1.output.map((o) => o.type)).toEqual(["message", "function_call"]);
    expect(r1.output_text).toBe("Let me look.");
    const call = r1.output[1]!;
    if (call.type !== "function_call") throw new Error("not a function call");
    expect(call).toMatchObject({ name: "get_weather", status: "completed" });
    expect(call.call_id).toMatch(/^call_/);
    expect(JSON.parse(call.arguments)).toEqual({ city: "Paris" });
    expect(r1.tools).toEqual(tools);
    expect(text(input1)).toContain("Tools: get_weather(city) Weather of a city;");

    // The agent sends everything back (as the Agents SDK does without previous_response_id).
    fake.script("/generate", { kind: "tokens", ids: out2 });
    const r2 = await ai.responses.create({
      model: "ooze-test",
      instructions: "You are helpful.",
      input: [...input, ...(r1.output as OpenAI.Responses.ResponseInputItem[]), { type: "function_call_output", call_id: call.call_id, output: "sunny, 21 C" }],
      tools,
    });
    expect(r2.output_text).toBe("It is sunny in Paris.");
    const input2 = lastInput();
    expect(input2.slice(0, input1.length + out1.length)).toEqual([...input1, ...out1]);
    const toolTurn = input2.slice(input1.length + out1.length);
    expect(Buffer.from(toolTurn).toString()).toBe("\n<|tool|>sunny, 21 C\n<|assistant|>");
    const rep = gw.closeSession(s.id);
    expect(rep.samples).toHaveLength(1);
    const smp = rep.samples[0]!;
    expect(sampleProblem(smp)).toBeNull();
    expect(smp).toMatchObject({ groupIndex: 2, rolloutId: "ep-r2", status: "completed" });
    expect(Array.from(smp.tokens)).toEqual([...input2, ...out2]);
    expect(Array.from(smp.lossMask)).toEqual([...out1.map(() => 1), ...toolTurn.map(() => 0), ...out2.map(() => 1)]);

    // The same conversation over chat completions: the engine is sent the same ids.
    const c = gw.openSession({ episodeId: "ep-r2-chat", groupIndex: 2 });
    const chat = client(c);
    const chatTools: OpenAI.Chat.Completions.ChatCompletionTool[] = [{ type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: tools[0]!.type === "function" ? tools[0]!.parameters! : {} } }];
    const messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [
      { role: "system", content: "You are helpful." },
      { role: "user", content: "Weather in Paris?" },
    ];
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const m1 = (await chat.chat.completions.create({ model: "ooze-test", messages, tools: chatTools })).choices[0]!.message;
    expect(lastInput()).toEqual(input1);
    fake.script("/generate", { kind: "tokens", ids: out2 });
    messages.push(m1 as OpenAI.Chat.Completions.ChatCompletionMessageParam, { role: "tool", tool_call_id: m1.tool_calls![0]!.id, content: "sunny, 21 C" });
    await chat.chat.completions.create({ model: "ooze-test", messages, tools: chatTools });
    expect(lastInput()).toEqual(input2);
    gw.closeSession(c.id);
  });

  it("continues from previous_response_id exactly as from the items sent back; store: false keeps nothing", async () => {
    const out1 = ids(`Let me look.${CALL}`);
    const out2 = ids("Sunny.");
    const s = gw.openSession({ episodeId: "ep-r3", groupIndex: 0 });
    const ai = client(s);
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const r1 = await ai.responses.create({ model: "ooze-test", instructions: "You are helpful.", input: "Weather in Paris?", tools });
    const input1 = lastInput();
    const call = r1.output.find((o) => o.type === "function_call");
    if (call?.type !== "function_call") throw new Error("no function call");
    fake.script("/generate", { kind: "tokens", ids: out2 });
    const r2 = await ai.responses.create({
      model: "ooze-test",
      instructions: "You are helpful.",
      previous_response_id: r1.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: "sunny, 21 C" }],
      tools,
    });
    expect(r2.previous_response_id).toBe(r1.id);
    expect(lastInput()).toEqual([...input1, ...out1, ...encodeBytes("\n<|tool|>sunny, 21 C\n<|assistant|>")]);
    // A third turn from r2: the whole chain (r1's input and output, the tool output, r2's output).
    fake.script("/generate", { kind: "tokens", ids: ids("Bye.") });
    await ai.responses.create({ model: "ooze-test", instructions: "You are helpful.", previous_response_id: r2.id, input: "Thanks!", tools });
    const input3 = lastInput();
    const tail3 = [...out2, ...encodeBytes("\n<|user|>Thanks!\n<|assistant|>")];
    expect(input3.slice(-tail3.length)).toEqual(tail3);
    expect(input3.slice(0, input1.length + out1.length)).toEqual([...input1, ...out1]);
    const smp = gw.closeSession(s.id).samples;
    expect(smp).toHaveLength(1);

    // Unknown ids, ids of another session and responses made with store: false are not found.
    const other = gw.openSession({ episodeId: "ep-r3b", groupIndex: 0 });
    const ai2 = client(other);
    fake.script("/generate", { kind: "tokens", ids: ids("Ok.") });
    const unstored = await ai2.responses.create({ model: "ooze-test", input: "Hi", store: false });
    expect((unstored as unknown as { store: boolean }).store).toBe(false);
    const before = fake.count("/generate");
    for (const id of [unstored.id, r1.id, "resp_nope"]) {
      const e = await apiError(ai2.responses.create({ model: "ooze-test", previous_response_id: id, input: "again" }));
      expect(e.status, id).toBe(400);
      expect(e.error, id).toMatchObject({ type: "invalid_request_error", param: "previous_response_id", code: "previous_response_not_found" });
    }
    expect(fake.count("/generate")).toBe(before);
    gw.closeSession(other.id);
  });

  it("streams text as the engine samples it: the SDK's accumulator takes the events, deltas concatenate to the text", async () => {
    const answer = "Streaming h\u00e9llo w\u00f6rld \u2014 done.";
    const out = ids(answer);
    const holdAfter = out.indexOf(0xe2) + 1; // inside "—"
    const s = gw.openSession({ episodeId: "ep-r4", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter });
    const stream = client(s).responses.stream({ model: "ooze-test", input: "Say it." });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    const reading = (async () => {
      for await (const e of stream) events.push(e);
    })();
    const deltas = () => events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : [])).join("");
    const before = "Streaming h\u00e9llo w\u00f6rld"; // the space before the held character waits for the next token
    await waitUntil(() => deltas() === before, { what: "the text sampled before the hold", timeoutMs: 10_000, diagnostics: () => JSON.stringify(events.map((e) => e.type)) });
    expect(events.some((e) => e.type === "response.completed")).toBe(false);
    expect(fake.release()).toBe(1);
    await reading;
    const final = await stream.finalResponse();
    expect(deltas()).toBe(answer);
    expect(final.output_text).toBe(answer);
    expect(final.status).toBe("completed");
    expect(final.usage?.output_tokens).toBe(out.length);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const types = events.map((e) => e.type).filter((t) => t !== "response.output_text.delta");
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    // The trajectory is the engine's ids, as for any request.
    const smp = gw.closeSession(s.id).samples[0]!;
    expect(Array.from(smp.tokens.subarray(-out.length))).toEqual(out);
  });

  it("streams a function call (arguments delta and done) with `stream: true`, and ends an over-long answer incomplete", async () => {
    const s = gw.openSession({ episodeId: "ep-r5", groupIndex: 0 });
    const ai = client(s);
    fake.script("/generate", { kind: "tokens", ids: ids(`Checking. ${CALL}`) });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const e of await ai.responses.create({ model: "ooze-test", input: "Paris?", tools, tool_choice: "auto", stream: true })) events.push(e);
    const done = events.find((e) => e.type === "response.function_call_arguments.done");
    if (done?.type !== "response.function_call_arguments.done") throw new Error(`no arguments done event: ${events.map((e) => e.type).join(", ")}`);
    expect(done).toMatchObject({ name: "get_weather", output_index: 1 });
    expect(JSON.parse(done.arguments)).toEqual({ city: "Paris" });
    const argDeltas = events.flatMap((e) => (e.type === "response.function_call_arguments.delta" ? [e.delta] : [])).join("");
    expect(argDeltas).toBe(done.arguments);
    const completed = events.at(-1)!;
    if (completed.type !== "response.completed") throw new Error(`last event ${completed.type}`);
    expect(completed.response.output.map((o) => o.type)).toEqual(["message", "function_call"]);
    expect(completed.response.output[0]).toMatchObject({ content: [{ text: "Checking." }] });

    // Cut by max_output_tokens: status incomplete, streamed (response.incomplete) and not.
    fake.script("/generate", { kind: "tokens", ids: ids("A long story that goes on", false), finish: "length" });
    const cut = await ai.responses.create({ model: "ooze-test", input: "Tell a story.", max_output_tokens: 8 });
    expect(cut).toMatchObject({ status: "incomplete", incomplete_details: { reason: "max_output_tokens" } });
    expect(cut.output[0]).toMatchObject({ type: "message", status: "incomplete" });
    expect(generateBodies().at(-1)!.sampling_params.max_new_tokens).toBe(8);
    fake.script("/generate", { kind: "tokens", ids: ids("A long story that goes on", false), finish: "length" });
    const last: string[] = [];
    for await (const e of await ai.responses.create({ model: "ooze-test", input: "Tell a story.", max_output_tokens: 8, stream: true })) last.push(e.type);
    expect(last.at(-1)).toBe("response.incomplete");
    gw.closeSession(s.id);
  });

  it("returns reasoning items and takes them back (content or encrypted_content) token-exactly", async () => {
    const out1 = ids("<think>The user greets.</think>Hello!");
    const out2 = ids("Fine.");
    // Three ways to continue: previous_response_id; the items sent back; the reasoning only as
    // encrypted_content (as Codex sends it with store: false). Each extends the one segment.
    const ways = ["previous_response_id", "items", "encrypted_content"] as const;
    for (const way of ways) {
      const s = thinking.openSession({ episodeId: `ep-r6-${way}`, groupIndex: 0 });
      const ai = client(s);
      fake.script("/generate", { kind: "tokens", ids: out1 });
      const r1 = await ai.responses.create({ model: "ooze-test", input: "Hi", include: ["reasoning.encrypted_content"] });
      const input1 = lastInput();
      expect(r1.output.map((o) => o.type)).toEqual(["reasoning", "message"]);
      const rs = r1.output[0]!;
      if (rs.type !== "reasoning") throw new Error("no reasoning item");
      expect(rs.content).toEqual([{ type: "reasoning_text", text: "The user greets." }]);
      expect(rs.summary).toEqual([]);
      expect(typeof rs.encrypted_content).toBe("string");
      expect(r1.output_text).toBe("Hello!");
      expect(r1.usage!.output_tokens_details.reasoning_tokens).toBe(ids("<think>The user greets.</think>", false).length);
      const hi: OpenAI.Responses.ResponseInputItem = { role: "user", content: "Hi" };
      const next: OpenAI.Responses.ResponseInputItem = { role: "user", content: "How are you?" };
      const params: Omit<OpenAI.Responses.ResponseCreateParamsNonStreaming, "model"> =
        way === "previous_response_id"
          ? { previous_response_id: r1.id, input: "How are you?" }
          : way === "items"
            ? { input: [hi, ...(r1.output as OpenAI.Responses.ResponseInputItem[]), next] }
            : { input: [hi, { type: "reasoning", id: rs.id, summary: [], encrypted_content: rs.encrypted_content! }, r1.output[1] as OpenAI.Responses.ResponseInputItem, next] };
      fake.script("/generate", { kind: "tokens", ids: out2 });
      await ai.responses.create({ model: "ooze-test", ...params });
      const env = encodeBytes("\n<|user|>How are you?\n<|assistant|>");
      expect(lastInput(), way).toEqual([...input1, ...out1, ...env]);
      const rep = thinking.closeSession(s.id);
      expect(rep.samples, way).toHaveLength(1);
      expect(Array.from(rep.samples[0]!.lossMask), way).toEqual([...out1.map(() => 1), ...env.map(() => 0), ...out2.map(() => 1)]);
    }

    // Streamed: reasoning_text deltas in a reasoning item, then the message.
    const s = thinking.openSession({ episodeId: "ep-r6-stream", groupIndex: 0 });
    fake.script("/generate", { kind: "tokens", ids: out1 });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    const stream = client(s).responses.stream({ model: "ooze-test", input: "Hi" });
    for await (const e of stream) events.push(e);
    const final = await stream.finalResponse();
    expect(events.flatMap((e) => (e.type === "response.reasoning_text.delta" ? [e.delta] : [])).join("")).toBe("The user greets.");
    expect(final.output.map((o) => o.type)).toEqual(["reasoning", "message"]);
    expect(final.output[0]).toMatchObject({ content: [{ type: "reasoning_text", text: "The user greets." }] });
    expect(final.output_text).toBe("Hello!");
    thinking.closeSession(s.id);
  });

  it("answers 503 when no engine serves: an error before the stream, an error event and response.failed after it began", async () => {
    const empty = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 200 });
    const none = await Gateway.start({ fleet: empty, contextLength: 4096, model: "ooze-test" });
    try {
      const s = none.openSession({ episodeId: "ep-r8", groupIndex: 0 });
      const ai = client(s);
      const e = await apiError(ai.responses.create({ model: "ooze-test", input: "hi" }));
      expect(e.status).toBe(503);
      expect(e.error).toMatchObject({ type: "server_error", code: "engine_unavailable" });
      const events: OpenAI.Responses.ResponseStreamEvent[] = [];
      for await (const ev of await ai.responses.create({ model: "ooze-test", input: "hi", stream: true })) events.push(ev);
      expect(events.map((ev) => ev.type)).toEqual(["response.created", "response.in_progress", "error", "response.failed"]);
      expect(events.map((ev) => ev.sequence_number)).toEqual([0, 1, 2, 3]);
      expect(events[2]).toMatchObject({ code: "engine_unavailable" });
      const failed = events[3]!;
      if (failed.type !== "response.failed") throw new Error(failed.type);
      expect(failed.response).toMatchObject({ status: "failed", error: { code: "server_error" } });
      expect(failed.response.error!.message).toMatch(/no engine could serve/);
      expect(none.closeSession(s.id).samples).toEqual([]);
    } finally {
      await none.close();
      await empty.close();
    }
  });

  it("refuses what it cannot honour with 400 naming the field, before anything reaches the engine", async () => {
    const s = gw.openSession({ episodeId: "ep-r7", groupIndex: 0 });
    const ai = client(s);
    const before = fake.count("/generate");
    const cases: [Record<string, unknown>, string][] = [
      [{ input: "x", tools: [{ type: "web_search" }] }, "tools[0].type"],
      [{ input: "x", tools: [{ type: "file_search", vector_store_ids: ["vs"] }] }, "tools[0].type"],
      [{ input: [{ role: "user", content: [{ type: "input_image", image_url: "data:image/png;base64,", detail: "auto" }] }] }, "input[0].content[0].type"],
      [{ input: [{ type: "web_search_call", id: "ws", status: "completed", action: { type: "search", query: "q" } }] }, "input[0].type"],
      [{ input: "x", background: true }, "background"],
      [{ input: "x", include: ["message.output_text.logprobs"] }, "include[0]"],
      [{ input: "x", text: { format: { type: "json_object" } } }, "text.format"],
      [{ input: "x", truncation: "auto" }, "truncation"],
      [{ input: "x", conversation: "conv_1" }, "conversation"],
      [{ input: "x", tool_choice: { type: "web_search_preview" } }, "tool_choice"],
      [{ input: "x", reasoning: { effort: "high" } }, "reasoning.effort"],
      [{ input: "x", seed: 3 }, "seed"],
      [{ input: [] }, "input"],
      [{ input: "x", temperature: 3 }, "temperature"],
    ];
    for (const [body, param] of cases) {
      const e = await apiError(ai.responses.create({ model: "ooze-test", ...body } as never));
      expect(e.status, param).toBe(400);
      expect(e.error, param).toMatchObject({ type: "invalid_request_error", param });
    }
    const unknown = await apiError(ai.responses.create({ model: "ooze-test", input: "x", seed: 3 } as never));
    expect(unknown.error).toMatchObject({ code: "unknown_parameter", message: "Unknown parameter: 'seed'." });
    const model = await apiError(ai.responses.create({ model: "gpt-4o", input: "x" }));
    expect(model.status).toBe(404);
    expect(fake.count("/generate")).toBe(before);
    const rep = gw.closeSession(s.id);
    expect(rep.error).toBeNull();
    expect(rep.samples).toEqual([]);
  });
});
