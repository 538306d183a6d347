// `ooze sim-engine` as a user runs it: a real process hosting several simulated engines on their own
// ports, reached through ooze's EngineClient over real HTTP, stopped with SIGTERM. The engine's
// simulated GPU time (/server_info) is exactly what the serving model gives for the steps it ran —
// prefill, then one decode step per token, shared by a batch (continuous batching), serialised by
// --max-running 1; prefix-cache hits skip prefill; token ids and logprobs follow the seed.
import { spawn, type ChildProcess } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngineClient } from "../../src/engine/client.ts";
import { decodeStepMs, H100_LLAMA_8B as T, prefillMs } from "../../src/engine/sim/perf-model.ts";
import type { SimStats } from "../../src/engine/sim/sim-backend.ts";
import { waitUntil } from "../harness/index.ts";

const procs: ChildProcess[] = [];
function simEngine(args: string[]) {
  const child = spawn(process.execPath, ["bin/ooze.mjs", "sim-engine", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  procs.push(child);
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
  return { child, out: () => out, exited };
}
async function urlsOf(p: ReturnType<typeof simEngine>, n: number): Promise<string[]> {
  await waitUntil(() => p.out().includes("ready"), { timeoutMs: 30_000, what: "sim-engine ready", diagnostics: p.out });
  const urls = [...p.out().matchAll(/^(http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => m[1]!);
  expect(urls).toHaveLength(n);
  return urls;
}
async function stats(c: EngineClient): Promise<SimStats> {
  const info = (await c.serverInfo()) as { internal_states: { cache: SimStats }[] };
  return info.internal_states[0]!.cache;
}
/** Simulated ms of decoding `tokens` tokens after a prefill of `prompt` (batch `b`, every sequence alike). */
const decodeMs = (b: number, prompt: number, tokens: number) => {
  let ms = 0;
  for (let k = 1; k < tokens; k++) ms += decodeStepMs(T, b, prompt + k);
  return ms;
};

let main: ReturnType<typeof simEngine>;
let urls: string[];
beforeAll(async () => {
  main = simEngine(["--count", "3", "--seed", "5"]);
  urls = await urlsOf(main, 3);
}, 60_000);
afterAll(() => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
});

describe("ooze sim-engine", () => {
  it("serves the SGLang API on every port: logprobs, deterministic ids for a sampling seed, the model's timing", async () => {
    const [a, b] = urls.map((u) => new EngineClient(u));
    const prompt = [256, 10, 20, 30];
    const before = await stats(a!);
    const out = await a!.generate({ inputIds: prompt, sampling: { max_new_tokens: 40, sampling_seed: 7 }, returnLogprob: true });
    expect(out.outputIds.length).toBe(40);
    expect(out.status).toBe("truncated");
    expect(out.logprobs.length).toBe(40);
    expect(Array.from(out.logprobs).every((l) => l <= 0 && l > -4.01)).toBe(true);
    expect(Array.from(out.outputIds).every((id) => id >= 32 && id < 127)).toBe(true);
    const again = await b!.generate({ inputIds: prompt, sampling: { max_new_tokens: 40, sampling_seed: 7 } });
    expect(Array.from(again.outputIds)).toEqual(Array.from(out.outputIds));
    const after = await stats(a!);
    expect(after.prefillSteps - before.prefillSteps).toBe(1);
    expect(after.decodeSteps - before.decodeSteps).toBe(39);
    expect((after.busySeconds - before.busySeconds) * 1000).toBeCloseTo(prefillMs(T, 4) + decodeMs(1, 4, 40), 6);
    const info = await a!.modelInfo();
    expect(info.model_path).toBe(T.name);
    expect((await a!.serverInfo()).max_total_num_tokens).toBe(T.kvTokens);
  });

  it("continuous batching: a batch of 4 shares its decode steps; a multi-turn prompt's cached prefix skips prefill; requests and aborts are counted", async () => {
    const c = new EngineClient(urls[2]!);
    const s0 = await stats(c);
    const res = await fetch(`${urls[2]}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [[256, 1], [256, 2], [256, 3], [256, 4]], sampling_params: { max_new_tokens: 20 } }) });
    const batch = (await res.json()) as { output_ids: number[] }[];
    expect(batch.map((x) => x.output_ids.length)).toEqual([20, 20, 20, 20]);
    const s1 = await stats(c);
    expect(s1.decodeSteps - s0.decodeSteps).toBe(19);
    expect([s1.requests - s0.requests, s1.aborted - s0.aborted]).toEqual([4, 0]);
    expect((s1.busySeconds - s0.busySeconds) * 1000).toBeCloseTo(prefillMs(T, 8) + decodeMs(4, 2, 20), 6);

    // Turn 2 of an episode: turn 1's prompt and output, then 16 new tokens. Whole 16-token blocks of
    // the turn-1 sequence are cached; only the rest is prefilled.
    const turn1 = [256, ...Array.from({ length: 47 }, (_, i) => 40 + i)];
    const r1 = await c.generate({ inputIds: turn1, sampling: { max_new_tokens: 33 } });
    const turn2 = [...turn1, ...r1.outputIds, ...Array.from({ length: 16 }, () => 10)];
    const s2 = await stats(c);
    const r2 = await c.generate({ inputIds: turn2, sampling: { max_new_tokens: 4 } });
    const s3 = await stats(c);
    expect(r2.meta.cachedTokens).toBe(80); // 48 + 33 = 81 tokens held: 5 whole blocks
    expect(s3.prefilledTokens - s2.prefilledTokens).toBe(turn2.length - 80);
    expect(s3.hitTokens - s2.hitTokens).toBe(80);

    // A pause in abort mode ends a running request as aborted: counted as admitted and as aborted.
    const s4 = await stats(c);
    const long = c.generate({ inputIds: [256, 9, 9], sampling: { max_new_tokens: 100_000 } });
    while ((await stats(c)).decodeSteps === s4.decodeSteps) await new Promise((r) => setTimeout(r, 5));
    await c.pauseGeneration("abort");
    expect((await long).finishReason?.type).toBe("abort");
    await c.continueGeneration();
    const s5 = await stats(c);
    expect([s5.requests - s4.requests, s5.aborted - s4.aborted]).toEqual([1, 1]);
  });

  it("--max-running 1 serialises a batch; --kv-tokens is the reported capacity; --keep-alive-ms is announced; update_weights_from_disk takes the table's time; SIGTERM stops it", async () => {
    const p = simEngine(["--max-running", "1", "--kv-tokens", "5000", "--keep-alive-ms", "120000"]);
    const [url] = await urlsOf(p, 1);
    const c = new EngineClient(url!);
    expect((await c.serverInfo()).max_total_num_tokens).toBe(5000);
    expect((await fetch(`${url}/health`)).headers.get("keep-alive")).toBe("timeout=120");
    const s0 = await stats(c);
    const res = await fetch(`${url}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [[256, 1], [256, 2]], sampling_params: { max_new_tokens: 10 } }) });
    expect(res.status).toBe(200);
    const s1 = await stats(c);
    expect(s1.prefillSteps - s0.prefillSteps).toBe(2);
    expect(s1.decodeSteps - s0.decodeSteps).toBe(18);
    const up = await c.updateWeightsFromDisk({ modelPath: "/nowhere", weightVersion: "3" });
    expect(up.success).toBe(true);
    expect(await c.weightVersion()).toBe("3");
    expect(((await stats(c)).busySeconds - s1.busySeconds) * 1000).toBeCloseTo(T.updateWeightsMs, 6);
    p.child.kill("SIGTERM");
    expect(await p.exited).toBe(0);
  });

  it("bad options are refused with the option named", async () => {
    const p = simEngine(["--stop-probability", "2"]);
    expect(await p.exited).not.toBe(0);
    expect(p.out()).toMatch(/--stop-probability must be in \[0, 1\)/);
    const q = simEngine(["--keep-alive-ms", "10ms"]);
    expect(await q.exited).not.toBe(0);
    expect(q.out()).toMatch(/--keep-alive-ms must be an integer ≥ 1000 \(got '10ms'\)/);
  });
});
