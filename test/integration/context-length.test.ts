// Requests against the context length, as a real SGLang fleet treats them (src/engine/limits.ts):
// `ooze serve` (here over simulated engines with a 40-token context, the same HTTP server) refuses
// what SGLang refuses — 400 {"error":{"message"}} naming the lengths, an error event or a 400 abort
// finish reason when streamed — and caps what it admits; the fleet, the rollout's episodes,
// partial-rollout resumes and the gateway size every request so that none is refused; a refusal
// that still comes (an engine restarted with a shorter context) fails its episode with the
// engine's message, once, and the rollout goes on.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Task } from "../../actors/environment/task.ts";
import { runEpisode } from "../../actors/rollout/episode.ts";
import type { Sample } from "../../src/sample.ts";
import { FleetGenerator, type GenRequest } from "../../actors/rollout/generator.ts";
import { rolloutRange } from "../../actors/rollout/rollout.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { H100_LLAMA_8B, type PerfTable } from "../../src/engine/sim/perf-model.ts";
import { startSimEngines, type SimEngines } from "../../src/engine/sim/sim-engines.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { waitUntil } from "../harness/index.ts";
import { postJson } from "../harness/http.ts";

/** A 40-token context (max_req_len 39, max_req_input_len 34), decoding one sequence at ~100 tokens/s. */
const table = (maxContext: number): PerfTable => ({
  ...H100_LLAMA_8B,
  name: `sim:context-${maxContext}`,
  decodeBatch: [1, 64],
  decodeContext: [512, 32768],
  decodeTokensPerSecond: [
    [100, 100],
    [6400, 6400],
  ],
  updateWeightsMs: 20,
  maxContext,
});
const C = 40;
const MAX_INPUT = 34;
const ids = (n: number) => [256, ...Array.from({ length: n - 1 }, (_, i) => 65 + (i % 26))];

let engines: SimEngines;
let url: string;
const closers: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  engines = await startSimEngines({ table: table(C), weightVersion: "1" });
  url = engines.urls[0]!;
});
afterAll(async () => {
  for (const c of closers.reverse()) await c();
  await engines?.close();
});

const post = (body: unknown) => postJson(`${url}/generate`, body);
const prompts = () => engines.stats()[0]!.promptTokens;
const fleetOver = async (u: string) => {
  const f = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  closers.push(() => f.close());
  await f.attach(u);
  return f;
};

describe("ooze serve: lengths as SGLang judges them", () => {
  it("reports its limits, refuses with SGLang's messages, admits the boundary and caps max_new_tokens (null included)", async () => {
    const info = await new EngineClient(url).serverInfo();
    expect(info).toMatchObject({ context_length: C, max_req_input_len: MAX_INPUT });

    const before = prompts();
    const long = await post({ input_ids: ids(C), sampling_params: { max_new_tokens: 1 } });
    expect(long).toMatchObject({ status: 400, json: { error: { message: `The input (${C} tokens) is longer than the model's context length (${C} tokens).` } } });
    const over = await post({ input_ids: ids(6), sampling_params: { max_new_tokens: 35 } });
    expect(over.status).toBe(400);
    expect(over.json.error.message).toBe(
      `Requested token count exceeds the model's maximum context length of ${C} tokens. You requested a total of 41 tokens: 6 tokens from the input ` +
        "messages and 35 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
    );
    const sched = await post({ input_ids: ids(MAX_INPUT), sampling_params: { max_new_tokens: 1 } });
    expect(sched).toMatchObject({
      status: 400,
      json: { error: { message: `Input length (${MAX_INPUT} tokens) exceeds the maximum allowed length (${MAX_INPUT} tokens). Use a shorter input or enable --allow-auto-truncate.` } },
    });
    // A batch is refused whole, before anything runs.
    const batch = await post({ input_ids: [ids(4), ids(C + 3)], sampling_params: { max_new_tokens: 2 } });
    expect(batch.status).toBe(400);
    expect(batch.json.error.message).toContain(`The input (${C + 3} tokens)`);
    expect(prompts()).toBe(before);

    // input + max_new_tokens = context is admitted (SGLang ≥ PR 22546); the scheduler caps it, as null, to 39 − 6 − 1.
    const edge = await post({ input_ids: ids(6), sampling_params: { max_new_tokens: 34 } });
    expect(edge.status).toBe(200);
    expect(edge.json.meta_info.finish_reason).toEqual({ type: "length", length: 32 });
    const unbounded = await post({ input_ids: ids(6), sampling_params: { max_new_tokens: null } });
    expect(unbounded.json.output_ids).toHaveLength(32);
    // An absent max_new_tokens is not checked (SGLang reads the request's, not its default of 128), only capped.
    const defaulted = await post({ input_ids: ids(6) });
    expect(defaulted.json.output_ids).toHaveLength(32);
    const last = await post({ input_ids: ids(MAX_INPUT - 1), sampling_params: { max_new_tokens: 1 } });
    expect(last.json.output_ids).toHaveLength(1);
  });

  it("streamed: a validation refusal is an error event, a scheduler refusal an abort with status_code 400; the client rejects both", async () => {
    const v = await post({ input_ids: ids(C), stream: true });
    expect(v.status).toBe(200);
    expect(v.text).toBe(`data: {"error":{"message":"The input (${C} tokens) is longer than the model's context length (${C} tokens)."}}\n\ndata: [DONE]\n\n`);
    const s = await post({ input_ids: ids(MAX_INPUT + 1), sampling_params: { max_new_tokens: 2 }, stream: true });
    const events = s.text.split("\n\n").filter(Boolean);
    expect(events).toHaveLength(2);
    expect(JSON.parse(events[0]!.slice(6)).meta_info.finish_reason).toEqual({
      type: "abort",
      message: `Input length (${MAX_INPUT + 1} tokens) exceeds the maximum allowed length (${MAX_INPUT} tokens). Use a shorter input or enable --allow-auto-truncate.`,
      status_code: 400,
      err_type: "BadRequestError",
    });
    const client = new EngineClient(url, { retries: 0 });
    for (const inputIds of [ids(C), ids(MAX_INPUT + 1)]) {
      const drain = async () => {
        for await (const _ of client.generateStream({ inputIds, sampling: { max_new_tokens: 2 } }));
      };
      await expect(drain()).rejects.toMatchObject({ code: "ENGINE_REJECTED", retryable: false });
      await expect(client.generate({ inputIds, sampling: { max_new_tokens: 2 } })).rejects.toMatchObject({ code: "ENGINE_REJECTED", retryable: false });
    }
  });
});

describe("clients size their requests to the engines' context", () => {
  it("the fleet asks for what the context leaves, resumes with what it still leaves, and does not send an input with no room", async () => {
    const fleet = await fleetOver(url);
    expect(fleet.lengthLimits()).toEqual({ contextLength: C, maxReqInputLen: MAX_INPUT });
    const r = await fleet.generate({ inputIds: Int32Array.from(ids(6)), sampling: { max_new_tokens: 1000 } });
    expect(r).toMatchObject({ status: "truncated", finishReason: { type: "length", length: 32 } });

    // A weight update (pause abort) cuts the generation: the resume, from 6 + k tokens, asks for 32 − k.
    let seen = 0;
    const running = fleet.generate({ inputIds: Int32Array.from(ids(6)), sampling: { max_new_tokens: 1000 }, stream: true, onTokens: (o) => (seen = o.length) });
    await waitUntil(() => seen >= 3, { what: "the first tokens of the generation", intervalMs: 2 });
    await fleet.updateWeights("unused", "2");
    const resumed = await running;
    expect(resumed.outputIds).toHaveLength(32);
    expect(resumed.status).toBe("truncated");
    expect(resumed.weightVersions.map((s) => s.version)).toEqual(["1", "2"]);

    const before = prompts();
    const e = await fleet.generate({ inputIds: Int32Array.from(ids(MAX_INPUT)), sampling: { max_new_tokens: 4 } }).catch((x: unknown) => x);
    expect(e).toMatchObject({ code: "ENGINE_REJECTED" });
    expect((e as Error).message).toMatch(/was not sent: its input of 34 tokens leaves no room .* \(40 tokens; inputs below 34 tokens are served\)/);
    expect(prompts()).toBe(before);
  });

  it("a multi-turn episode ends truncated when the context fills, its last turn sized to what is left", async () => {
    const gen = await FleetGenerator.create([url]);
    closers.push(() => gen.close());
    const chatty: Task<null> = {
      name: "chatty",
      maxTurns: 10,
      maxTurnTokens: 12,
      reset: () => ({ prompt: "go:", promptIds: Int32Array.from(ids(4)), state: null }),
      step: () => ({ state: null, observation: Int32Array.from([10, 10]), done: false }),
      reward: () => 1,
    };
    // 4 + 12 + 2 + 12 + 2 = 32 tokens; the third turn gets 39 − 32 − 1 = 6, then no room is left.
    const [s] = (await runEpisode(chatty, gen, { index: 0, groupIndex: 0, seed: 0, temperature: 1, samplingSeed: 1 })) as [Sample];
    expect(s.status).toBe("truncated");
    expect(s.tokens).toHaveLength(38);
    expect(s.metadata.turns).toBe(3);
    expect(Array.from(s.lossMask).filter((m) => m === 1)).toHaveLength(30);
  });

  it("the gateway refuses a conversation with no room itself and caps a reply to what is left", async () => {
    const fleet = await fleetOver(url);
    const gw = await Gateway.start({ fleet, contextLength: C, defaultMaxTokens: 100, model: "m" });
    closers.push(() => gw.close());
    const s = gw.openSession({ episodeId: "e", groupIndex: 0 });
    const chat = async (content: string) => {
      const res = await fetch(`${s.openaiBaseUrl}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${s.apiKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content }] }),
      });
      return { status: res.status, body: (await res.json()) as any };
    };
    const first = await chat("hi");
    expect(first.status).toBe(200);
    const overhead = first.body.usage.prompt_tokens - 2;
    expect(first.body.choices[0].finish_reason).toBe("length");
    expect(first.body.usage.completion_tokens).toBe(C - 2 - first.body.usage.prompt_tokens);
    // Below the context, but at the scheduler's input limit: the gateway answers, not the engine.
    const full = await chat("y".repeat(MAX_INPUT - overhead));
    expect(full.status).toBe(400);
    expect(full.body.error).toMatchObject({ code: "context_length_exceeded" });
  });
});

describe("a refusal that still comes", () => {
  it("fails its episode once with the engine's message; the rollout goes on", async () => {
    const first = await startSimEngines({ table: table(C), weightVersion: "1" });
    const port = Number(new URL(first.urls[0]!).port);
    const gen = await FleetGenerator.create(first.urls);
    closers.push(() => gen.close());
    // The engine restarts on the same port with a 20-token context; the fleet still knows 40.
    await first.close();
    const short = await startSimEngines({ table: table(20), weightVersion: "1", port });
    closers.push(() => short.close());
    const task: Task<null> = {
      name: "one-turn",
      maxTurns: 1,
      maxTurnTokens: 12,
      reset: (g) => ({ prompt: "p", promptIds: Int32Array.from(ids(g === 0 ? 16 : 4)), state: null }),
      step: () => ({ state: null, observation: new Int32Array(0), done: true }),
      reward: () => 1,
    };
    let asked = 0;
    // The rollout's generator, counting the requests it is given.
    const counted = { generate: (req: GenRequest) => (asked++, gen.generate(req)), takeCacheStats: () => gen.takeCacheStats(), lengthLimits: () => gen.lengthLimits() };
    const lines: string[] = [];
    const r = await rolloutRange(task, counted, { firstPrompt: 0, prompts: 2, samplesPerPrompt: 1, firstSample: 0 }, { seed: 0, temperature: 1, log: (l) => lines.push(l) });
    const [refused, ok] = r.samples;
    expect(refused).toMatchObject({ status: "failed", metadata: { errorCode: "ENGINE_REJECTED" } });
    expect(String(refused!.metadata.error)).toContain("Requested token count exceeds the model's maximum context length of 20 tokens");
    expect(ok!.status).toBe("truncated");
    expect(r.failures).toBe(1);
    expect(lines).toEqual([expect.stringMatching(/^rollout: episode 0 \(prompt 0\) failed: .*400: Requested token count/)]);
    // Asked once (a refused episode is not tried again), and the engine stays in routing.
    expect(asked).toBe(2);
    expect(short.stats()[0]!.promptTokens).toBe(4);
    expect(gen.fleet.list()[0]!.healthy).toBe(true);
  });
});
