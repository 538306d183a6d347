// The Fleet over real engine servers (two in-process servers and one child process over a tiny native
// model): attach/detach/list, refusal of an engine serving another model, partial rollout across an
// /abort_request, a caller's abort, one request streamed with its tokens reported as they come, a SIGKILLed engine mid-request and its restart on the same port,
// weight updates (versions bump, a lower one is refused, a late joiner is brought up to date, a
// fleet that follows another's version keeps an engine behind it out of routing, an engine back on
// its initial weights between health checks is updated again), and recovery of the engine set from
// the job's KV bucket.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { initModelDir } from "../../native/model-dir.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet, type FleetGenerateResult } from "../../src/engine/fleet/fleet.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { OozeError } from "../../src/errors.ts";
import { jobNames } from "../../src/transport/names.ts";
import { spawnEngine, type EngineProcess } from "../fixtures/engine-process.ts";
import { GatedBackend } from "../fixtures/gated-backend.ts";
import { useNats, waitUntil, withDeadline } from "../harness/index.ts";

const nats = useNats();
let root: string;
let dirA: string; // the fleet's model
let dirA2: string; // same config, other weights (a "new version")
let dirB: string; // another config
const backends: InferenceBackend[] = [];
const servers: EngineServer[] = [];
let child: EngineProcess;
const fleets: Fleet[] = [];
let reference: Map<string, { ids: number[]; lps: number[] }>;
/** The servers' backends: each can hold its stepping once chosen requests reach their n-th token. */
const gates: GatedBackend[] = [];

const sampling = { max_new_tokens: 160, temperature: 0, ignore_eos: true };
/** Long enough that a non-streamed request is still running when a test acts on it. */
const long = { ...sampling, max_new_tokens: 400 };
const prompts = [0, 1, 2, 3].map((k) => Int32Array.from([256, 72 + k, 101, 108 + k, 108, 111]));
const key = (p: Int32Array) => Array.from(p).join(",");

function fleet(opts: ConstructorParameters<typeof Fleet>[0] = {}): Fleet {
  const f = new Fleet({ routing: "round_robin", healthIntervalMs: 100, healthTimeoutMs: 2_000, requestTimeoutMs: 30_000, ...opts });
  fleets.push(f);
  return f;
}

/** An in-process engine over the fleet's model at version "default", as a restarted one comes back. */
async function initialEngine(): Promise<EngineServer> {
  const backend = createNativeBackend({ modelDir: dirA });
  backends.push(backend);
  const server = await startEngineServer({ backend, weightVersion: "default" });
  servers.push(server);
  return server;
}

function expectIntact(r: FleetGenerateResult, prompt: Int32Array, length = 160): void {
  const full = reference.get(key(prompt))!;
  const ref = { ids: full.ids.slice(0, length), lps: full.lps.slice(0, length) };
  expect(Array.from(r.outputIds)).toEqual(ref.ids);
  expect(r.logprobs.length).toBe(ref.ids.length);
  r.logprobs.forEach((lp, i) => expect(Math.abs(lp - ref.lps[i]!)).toBeLessThan(1e-4));
  const spans = r.weightVersions;
  expect(spans[0]?.start).toBe(0);
  expect(spans[spans.length - 1]?.end).toBe(r.outputIds.length);
  for (let i = 1; i < spans.length; i++) expect(spans[i]!.start).toBe(spans[i - 1]!.end);
}

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "ooze-fleet-test-"));
  dirA = join(root, "a");
  dirA2 = join(root, "a2");
  dirB = join(root, "b");
  await initModelDir("tiny", dirA, 3);
  await initModelDir("tiny", dirA2, 4);
  const config = JSON.parse(readFileSync(join(dirA, "config.json"), "utf8")) as Record<string, unknown>;
  await initModelDir({ ...(config as unknown as LlamaHfConfig), max_position_embeddings: 256 }, dirB, 5);
  for (let i = 0; i < 2; i++) {
    const backend = new GatedBackend(createNativeBackend({ modelDir: dirA }));
    gates.push(backend);
    backends.push(backend);
    servers.push(await startEngineServer({ backend, weightVersion: "1" }));
  }
  // The child stops stepping at k-1's 5th token (until it is killed): see the SIGKILL test.
  child = await spawnEngine(dirA, 0, "1", 30_000, { holdAfter: { rid: "k-1", n: 5 } });
  const c = new EngineClient(servers[0]!.url);
  reference = new Map();
  for (const p of prompts) {
    const r = await c.generate({ inputIds: p, sampling: long, returnLogprob: true });
    reference.set(key(p), { ids: Array.from(r.outputIds), lps: Array.from(r.logprobs) });
  }
});

afterAll(async () => {
  for (const f of fleets) await f.close();
  await child?.kill("SIGKILL");
  for (const s of servers) await s.close();
  for (const b of backends) b.close();
  rmSync(root, { recursive: true, force: true });
});

describe("fleet: attach, detach, list", () => {
  it("attaches engines, lists them, routes over them, and detaches", async () => {
    const f = fleet();
    const e0 = await f.attach(servers[0]!.url);
    expect(e0).toMatchObject({ id: servers[0]!.url, healthy: true, inFlight: 0, weightVersion: "1", source: "runtime", lastError: null });
    expect(e0.model).toMatchObject({ architectures: ["LlamaForCausalLM"], context_length: 512 });
    await f.attach(`${servers[1]!.url}/`, { source: "topology" });
    expect((await f.attach(servers[0]!.url)).id).toBe(servers[0]!.url); // idempotent
    expect(f.list().map((e) => [e.url, e.source])).toEqual([
      [servers[0]!.url, "runtime"],
      [servers[1]!.url, "topology"],
    ]);
    const rs = await Promise.all(prompts.map((p) => f.generate({ inputIds: p, sampling })));
    rs.forEach((r, i) => {
      expectIntact(r, prompts[i]!);
      expect(r).toMatchObject({ status: "truncated", redispatches: 0, finishReason: { type: "length", length: 160 } });
      expect(r.weightVersions).toEqual([{ start: 0, end: 160, version: "1" }]);
    });
    expect(new Set(rs.map((r) => r.engine)).size).toBe(2);
    await f.detach(servers[0]!.url);
    expect(f.list().map((e) => e.url)).toEqual([servers[1]!.url]);
    const after = await f.generate({ inputIds: prompts[0]!, sampling: { ...sampling, max_new_tokens: 8 } });
    expect(after.engine).toBe(servers[1]!.url);
    await expect(f.detach(servers[0]!.url)).rejects.toMatchObject({ code: "ACTOR_NOT_FOUND" });
  });

  it("refuses an engine serving another model, saying what differs", async () => {
    const backend = createNativeBackend({ modelDir: dirB });
    const other = await startEngineServer({ backend, weightVersion: "1" });
    try {
      const f = fleet();
      await f.attach(servers[0]!.url);
      const err = await f.attach(other.url).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OozeError);
      expect(err).toMatchObject({ code: "ENGINE_MISMATCH" });
      expect((err as Error).message).toMatch(/context_length: 256 \(this engine\) vs 512 \(expected\)/);
      expect(f.list().map((e) => e.url)).toEqual([servers[0]!.url]);
      // An explicit expectation (an HF config) is checked the same way; null skips the check.
      await expect(fleet().attach(servers[0]!.url, { expectModel: { max_position_embeddings: 256 } })).rejects.toMatchObject({ code: "ENGINE_MISMATCH" });
      expect((await fleet().attach(other.url, { expectModel: null })).healthy).toBe(true);
      await expect(f.attach("http://127.0.0.1:1")).rejects.toMatchObject({ code: "ENGINE_UNAVAILABLE" });
    } finally {
      await other.close();
      backend.close();
    }
  });

  it("refuses a model that differs only in its dimensions (from /model_info's config)", async () => {
    const config = JSON.parse(readFileSync(join(dirA, "config.json"), "utf8")) as LlamaHfConfig;
    const dirC = join(root, "c");
    await initModelDir({ ...config, hidden_size: 32, intermediate_size: 88, head_dim: 8 } as LlamaHfConfig, dirC, 6);
    const backend = createNativeBackend({ modelDir: dirC });
    const other = await startEngineServer({ backend, weightVersion: "1" });
    try {
      const f = fleet();
      await f.attach(servers[0]!.url);
      const err = await f.attach(other.url).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: "ENGINE_MISMATCH" });
      expect((err as Error).message).toMatch(/hidden_size/);
    } finally {
      await other.close();
      backend.close();
    }
  });
});

describe("fleet: partial rollout", () => {
  it("keeps the sampled tokens across /abort_request and re-dispatches the rest", async () => {
    const f = fleet({ stream: true });
    for (const s of servers) await f.attach(s.url);
    const p = f.generate({ inputIds: prompts[1]!, sampling, rid: "pr-1" });
    await waitUntil(() => (f.progress("pr-1") ?? 0) >= 5, { what: "5 tokens sampled" });
    const on = f.list().find((e) => e.inFlight > 0)!;
    await new EngineClient(on.url).abort({ rid: "pr-1" });
    const r = await p;
    expect(r.redispatches).toBeGreaterThanOrEqual(1);
    expect(r.status).toBe("truncated");
    expectIntact(r, prompts[1]!);
    // A detach mid-request asks the engine to abort: the tokens come back with the abort response.
    const logs: string[] = [];
    const g = fleet({ log: (l) => logs.push(l) });
    await g.attach(servers[0]!.url);
    // Engine 0 stops stepping at dt-1's 10th token until dt-1 is aborted there (by the detach).
    const held = gates[0]!.holdAfter("dt-1", 10);
    const q = g.generate({ inputIds: prompts[2]!, sampling: long, rid: "dt-1" });
    await withDeadline(held, 30_000, "dt-1 to sample 10 tokens on engine 0");
    await g.attach(servers[1]!.url);
    await g.detach(servers[0]!.url);
    const d = await q;
    expect(d.redispatches).toBe(1);
    expect(d.engine).toBe(servers[1]!.url);
    expectIntact(d, prompts[2]!, 400);
    const kept = Number(/re-dispatching dt-1 after (\d+) tokens/.exec(logs.join("\n"))?.[1]);
    expect(kept).toBeGreaterThan(0);
  });

  it("a caller's abort ends the request as aborted without re-dispatch", async () => {
    const f = fleet({ stream: true });
    await f.attach(servers[0]!.url);
    const ctl = new AbortController();
    const p = f.generate({ inputIds: prompts[2]!, sampling, rid: "ua-1", signal: ctl.signal });
    await waitUntil(() => (f.progress("ua-1") ?? 0) >= 3, { what: "3 tokens sampled" });
    ctl.abort();
    const r = await p;
    expect(r).toMatchObject({ status: "aborted", redispatches: 0 });
    expect(r.outputIds.length).toBeGreaterThanOrEqual(3);
    expect(Array.from(r.outputIds)).toEqual(reference.get(key(prompts[2]!))!.ids.slice(0, r.outputIds.length));
    expect(f.abort("ua-1")).toBe(false); // no longer running
    // Not streamed: the abort goes to the engine, whose abort response carries the partial tokens.
    const g = fleet();
    await g.attach(servers[0]!.url);
    // The engine stops stepping at ua-2's 10th token until ua-2 is aborted there: the abort finds
    // it running with tokens sampled, however fast the machine is.
    const held = gates[0]!.holdAfter("ua-2", 10);
    const q = g.generate({ inputIds: prompts[3]!, sampling: long, rid: "ua-2" });
    await withDeadline(held, 30_000, "ua-2 to sample 10 tokens on the engine");
    expect(g.abort("ua-2")).toBe(true);
    const a = await q;
    expect(a).toMatchObject({ status: "aborted", redispatches: 0 });
    expect(a.outputIds.length).toBeGreaterThanOrEqual(10);
    expect(a.outputIds.length).toBeLessThan(400);
    expect(Array.from(a.outputIds)).toEqual(reference.get(key(prompts[3]!))!.ids.slice(0, a.outputIds.length));
  });

  it("streams one request on a fleet that does not stream: its tokens come as sampled, and an abort reaches the engine", async () => {
    const f = fleet();
    await f.attach(servers[0]!.url);
    const seen: Int32Array[] = [];
    const held = gates[0]!.holdAfter("st-1", 10);
    const ctl = new AbortController();
    const p = f.generate({ inputIds: prompts[0]!, sampling: long, rid: "st-1", stream: true, onTokens: (ids) => seen.push(ids), signal: ctl.signal });
    await withDeadline(held, 30_000, "st-1 to sample 10 tokens on engine 0");
    // The engine is held at the 10th token: the first 10 came through the callback before the end.
    await waitUntil(() => seen.at(-1)?.length === 10, { what: "10 tokens reported while the engine is held", diagnostics: () => JSON.stringify(seen.map((x) => x.length)) });
    expect(seen.length).toBeGreaterThan(1);
    for (let i = 1; i < seen.length; i++) expect(Array.from(seen[i]!.subarray(0, seen[i - 1]!.length))).toEqual(Array.from(seen[i - 1]!));
    // The abort is sent to the engine (the held request ends only when aborted there).
    ctl.abort();
    const r = await p;
    expect(r).toMatchObject({ status: "aborted", redispatches: 0 });
    expect(Array.from(r.outputIds)).toEqual(Array.from(seen.at(-1)!));
    expect(Array.from(r.outputIds)).toEqual(reference.get(key(prompts[0]!))!.ids.slice(0, r.outputIds.length));
  });

  it("an engine SIGKILLed mid-request: the request finishes elsewhere intact; the engine rejoins after a restart on its port", async () => {
    const f = fleet({ routing: "least_load", stream: true });
    await f.attach(child.url);
    // The child holds k-1 at its 5th token: the request is still running there when it is killed.
    const p = f.generate({ inputIds: prompts[3]!, sampling: long, rid: "k-1" });
    await waitUntil(() => (f.progress("k-1") ?? 0) >= 5, { what: "5 tokens sampled on the child engine" });
    await f.attach(servers[0]!.url);
    const port = child.port;
    await child.kill("SIGKILL");
    const r = await p;
    expectIntact(r, prompts[3]!, 400);
    expect(r.redispatches).toBeGreaterThanOrEqual(1);
    expect(r.engine).toBe(servers[0]!.url);
    await waitUntil(() => f.list().find((e) => e.url === `http://127.0.0.1:${port}`)?.healthy === false, { what: "the killed engine out of routing" });
    child = await spawnEngine(dirA, port, "1");
    await waitUntil(() => f.list().find((e) => e.url === child.url)?.healthy, {
      what: "the restarted engine back in routing",
      diagnostics: () => JSON.stringify(f.list()),
    });
    // Killed while idle: the health checks take it out of routing, and back in after a restart.
    await child.kill("SIGKILL");
    const gone = await waitUntil(() => f.list().find((e) => e.url === `http://127.0.0.1:${port}` && !e.healthy), { what: "health checks to drop the engine" });
    expect(gone.lastError).toMatch(/failed 3 health checks in a row/);
    const q = f.generate({ inputIds: prompts[0]!, sampling: { ...sampling, max_new_tokens: 6 } });
    expect((await q).engine).toBe(servers[0]!.url);
    child = await spawnEngine(dirA, port, "1");
    await waitUntil(() => f.list().find((e) => e.url === child.url)?.healthy, { what: "the engine back after its second restart" });
  });

  it("with no engine, a request waits for one to be attached", async () => {
    const f = fleet();
    const p = f.generate({ inputIds: prompts[0]!, sampling: { ...sampling, max_new_tokens: 12 } });
    await f.attach(servers[1]!.url);
    const r = await p;
    expect(Array.from(r.outputIds)).toEqual(reference.get(key(prompts[0]!))!.ids.slice(0, 12));
    await expect(fleet({ requestTimeoutMs: 200 }).generate({ inputIds: prompts[0]!, sampling })).rejects.toMatchObject({ code: "ENGINE_UNAVAILABLE" });
    // Closing the fleet ends waiting and running requests with ACTOR_STOPPED.
    const g = fleet();
    const waiting = g.generate({ inputIds: prompts[0]!, sampling });
    const h = fleet({ stream: true });
    await h.attach(servers[1]!.url);
    const running = h.generate({ inputIds: prompts[1]!, sampling, rid: "cl-1" });
    await waitUntil(() => (h.progress("cl-1") ?? 0) >= 1, { what: "a token sampled" });
    await Promise.all([g.close(), h.close()]);
    await expect(waiting).rejects.toMatchObject({ code: "ACTOR_STOPPED" });
    await expect(running).rejects.toMatchObject({ code: "ACTOR_STOPPED" });
    await expect(g.generate({ inputIds: prompts[0]!, sampling })).rejects.toMatchObject({ code: "ACTOR_STOPPED" });
    await expect(f.generate({ inputIds: prompts[0]!, sampling: { ...sampling, n: 2 } })).rejects.toMatchObject({ code: "CONFIG_INVALID" });
    await expect(f.generate({ inputIds: prompts[0]!, sampling: { temperature: 0 } })).rejects.toMatchObject({ code: "CONFIG_INVALID" });
  });
});

describe("fleet: external SGLang router", () => {
  it("registers attached engines with POST /workers and removes them with DELETE /workers/{id}; falls back to /add_worker", async () => {
    // Stands in for an SGLang router's worker registry (the boundary is its HTTP API).
    const calls: string[] = [];
    const workers = new Map<string, string>();
    let legacy = false;
    const router = createServer((req, res) => {
      let body = "";
      req.on("data", (d) => (body += d));
      req.on("end", () => {
        calls.push(`${req.method} ${req.url}`);
        const url = req.url ?? "";
        if (legacy && url.startsWith("/workers")) return void res.writeHead(404).end();
        if (req.method === "POST" && url === "/workers") {
          const j = JSON.parse(body) as { url: string; worker_type: string };
          expect(j.worker_type).toBe("regular");
          workers.set(`w${workers.size}`, j.url);
          return void res.writeHead(200).end("{}");
        }
        if (req.method === "GET" && url === "/workers") {
          return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ workers: [...workers].map(([id, u]) => ({ id, url: u })) }));
        }
        if (req.method === "DELETE" && url.startsWith("/workers/")) {
          workers.delete(decodeURIComponent(url.slice("/workers/".length)));
          return void res.writeHead(200).end("{}");
        }
        if (req.method === "POST" && (url.startsWith("/add_worker?") || url.startsWith("/remove_worker?"))) return void res.writeHead(200).end("ok");
        res.writeHead(404).end();
      });
    });
    await new Promise<void>((r) => router.listen(0, "127.0.0.1", () => r()));
    const routerUrl = `http://127.0.0.1:${(router.address() as AddressInfo).port}`;
    try {
      const f = fleet({ externalRouter: routerUrl });
      await f.attach(servers[0]!.url);
      expect([...workers.values()]).toEqual([servers[0]!.url]);
      await f.detach(servers[0]!.url);
      expect(workers.size).toBe(0);
      expect(calls).toEqual(["POST /workers", "GET /workers", "DELETE /workers/w0"]);
      legacy = true;
      calls.length = 0;
      await f.attach(servers[1]!.url);
      await f.detach(servers[1]!.url);
      const enc = encodeURIComponent(servers[1]!.url);
      expect(calls).toEqual(["POST /workers", `POST /add_worker?url=${enc}`, "GET /workers", `POST /remove_worker?url=${enc}`]);
    } finally {
      await new Promise<void>((r) => router.close(() => r()));
    }
  });
});

describe("fleet: weight updates and the KV registry", () => {
  it("recovers the engine set from the job's KV bucket", async () => {
    const bus = await nats.connect();
    const job = "fleet-kv";
    const f1 = fleet({ bus, job });
    await f1.attach(servers[0]!.url);
    await f1.attach(servers[1]!.url, { source: "topology" });
    await f1.close();
    const f2 = await Fleet.open({ bus, job, healthIntervalMs: 100 });
    fleets.push(f2);
    expect(f2.list().map((e) => [e.url, e.source, e.healthy])).toEqual([
      [servers[0]!.url, "runtime", true],
      [servers[1]!.url, "topology", true],
    ]);
    await f2.detach(servers[0]!.url);
    const kv = await bus.kv(jobNames(job).kvEngines);
    const keys: string[] = [];
    for await (const k of await kv.keys()) keys.push(k);
    expect(keys.filter((k) => k.startsWith("engine."))).toHaveLength(1);
    const f3 = await Fleet.open({ bus, job, healthIntervalMs: 0 });
    fleets.push(f3);
    expect(f3.list().map((e) => e.url)).toEqual([servers[1]!.url]);
  });

  it("updateWeights moves every engine to a higher version, re-dispatches aborted requests onto it, and refuses a lower one", async () => {
    const bus = await nats.connect();
    const f = fleet({ bus, job: "fleet-wu", stream: true });
    for (const s of servers) await f.attach(s.url);
    // Round-robin: wu-0 and wu-2 run on engine 0, wu-1 and wu-3 on engine 1; each engine stops
    // stepping once its two have sampled 2 tokens, until the update aborts them.
    const held = [gates[0]!.holdAfter(["wu-0", "wu-2"], 2), gates[1]!.holdAfter(["wu-1", "wu-3"], 2)];
    const running = prompts.map((p, i) => f.generate({ inputIds: p, sampling, rid: `wu-${i}` }));
    await withDeadline(Promise.all(held), 30_000, "every request to sample 2 tokens");
    await f.updateWeights(dirA2, "2");
    expect(f.weightVersion).toBe("2");
    expect(f.list().map((e) => e.weightVersion)).toEqual(["2", "2"]);
    for (const s of servers) expect(await new EngineClient(s.url).weightVersion()).toBe("2");
    const rs = await Promise.all(running);
    for (const [i, r] of rs.entries()) {
      expect(r.outputIds.length).toBe(160);
      expect(r.redispatches).toBeGreaterThanOrEqual(1);
      const spans = r.weightVersions;
      expect(spans.map((s) => s.version)).toEqual(["1", "2"]);
      expect(spans[0]).toMatchObject({ start: 0 });
      expect(spans[1]).toMatchObject({ start: spans[0]!.end, end: 160 });
      // The tokens of version 1 are the old weights' greedy tokens.
      expect(Array.from(r.outputIds.slice(0, spans[0]!.end))).toEqual(reference.get(key(prompts[i]!))!.ids.slice(0, spans[0]!.end));
    }
    await expect(f.updateWeights(dirA, "1")).rejects.toMatchObject({ code: "CONFIG_INVALID" });
    await expect(f.updateWeights(dirA, "2")).rejects.toMatchObject({ code: "CONFIG_INVALID" });
    // in_place: running requests are kept by the engines and go on with the new weights.
    // Four re-dispatches later round-robin sends ip-0 to engine 0 and ip-1 to engine 1; each is held
    // at 2 tokens until the update loads the new weights.
    const heldIp = [gates[0]!.holdAfter("ip-0", 2), gates[1]!.holdAfter("ip-1", 2)];
    const kept = prompts.slice(0, 2).map((p, i) => f.generate({ inputIds: p, sampling, rid: `ip-${i}` }));
    await withDeadline(Promise.all(heldIp), 30_000, "both requests to sample 2 tokens");
    await f.updateWeights(dirA, "10", { mode: "in_place" });
    for (const r of await Promise.all(kept)) {
      expect(r.redispatches).toBe(0);
      expect(r.outputIds.length).toBe(160);
      expect(r.weightVersions.map((s) => s.version)).toEqual(["2", "10"]);
    }
    // A late joiner serving version 1 is brought to the fleet's version before it takes traffic.
    await f.attach(child.url);
    expect(f.list().find((e) => e.url === child.url)?.weightVersion).toBe("10");
    expect(await new EngineClient(child.url).weightVersion()).toBe("10");
    // A recovered fleet keeps the version order.
    const g = await Fleet.open({ bus, job: "fleet-wu", healthIntervalMs: 0 });
    fleets.push(g);
    expect(g.weightVersion).toBe("10");
    await expect(g.updateWeights(dirA, "1")).rejects.toMatchObject({ code: "CONFIG_INVALID" });
    // Not streamed, a dispatch that crosses an in_place update is recorded under its older version.
    const h = fleet();
    await h.attach(servers[0]!.url);
    // Held at its 10th token until the update loads the new weights.
    const heldNs = gates[0]!.holdAfter("ns-1", 10);
    const crossing = h.generate({ inputIds: prompts[0]!, sampling: long, rid: "ns-1" });
    await withDeadline(heldNs, 30_000, "ns-1 to sample 10 tokens");
    await h.updateWeights(dirA, "11", { mode: "in_place" });
    const c = await crossing;
    expect(c.redispatches).toBe(0);
    expect(c.weightVersions).toEqual([{ start: 0, end: 400, version: "10" }]);
  });

  it("an update with flushCache false keeps the engines' prefix caches for the next turns; by default an update flushes them", async () => {
    const f = fleet();
    await f.attach(servers[1]!.url);
    const turn = () => f.generate({ inputIds: prompts[3]!, sampling: { ...sampling, max_new_tokens: 4 } });
    await turn();
    expect((await turn()).cachedTokens).toBeGreaterThan(0); // the prompt is cached
    await f.updateWeights(dirA2, "20", { flushCache: false });
    const kept = await turn();
    expect(kept.cachedTokens).toBeGreaterThan(0);
    expect(kept.weightVersions.map((w) => w.version)).toEqual(["20"]);
    await f.updateWeights(dirA, "21");
    expect((await turn()).cachedTokens).toBe(0);
  });

  it("a fleet that follows another's version keeps an engine behind it out of routing until it is brought up to date", async () => {
    // The engine came back from a restart on its initial weights (version 1, or an SGLang server's
    // "default") while the job is at version 3: the fleet that updates engines is another one.
    const behind = await initialEngine();
    const f = fleet();
    f.followVersion("2");
    f.followVersion("3");
    f.followVersion("1"); // versions only move forward
    const entry = await f.attach(behind.url, { allowUnreachable: true });
    expect(entry.healthy).toBe(false);
    expect(entry.lastError).toMatch(/serves weight version default and the job is at 3; it joins routing once/);
    const c = new EngineClient(behind.url);
    await c.updateWeightsFromDisk({ modelPath: dirA2, weightVersion: "2" });
    // A health check retries the join at version 2, and it is refused again.
    await waitUntil(() => /serves weight version 2 and the job is at 3/.test(f.list()[0]!.lastError ?? ""), { what: "the join retried at version 2", diagnostics: () => JSON.stringify(f.list()) });
    expect(f.list()[0]!.healthy).toBe(false);
    await c.updateWeightsFromDisk({ modelPath: dirA2, weightVersion: "3" });
    await waitUntil(() => f.list()[0]!.healthy, { what: "the engine in routing once at version 3", diagnostics: () => JSON.stringify(f.list()) });
    const r = await f.generate({ inputIds: prompts[0]!, sampling: { ...sampling, max_new_tokens: 8 } });
    expect(r.weightVersions).toEqual([{ start: 0, end: 8, version: "3" }]);
  });

  it("an engine back on its initial weights between two health checks (restarted) is brought to the fleet's version again", async () => {
    const engine = await initialEngine();
    const lines: string[] = [];
    const f = fleet({ log: (l) => lines.push(l) });
    await f.attach(engine.url);
    await f.updateWeights(dirA2, "7");
    // What a restart looks like to the fleet: the engine answers its health checks, at its first weights.
    const c = new EngineClient(engine.url);
    await c.updateWeightsFromDisk({ modelPath: dirA, weightVersion: "default" });
    await waitUntil(async () => (await c.weightVersion()) === "7", { what: "the fleet to update the engine again", diagnostics: () => lines.join("\n") });
    expect(lines.some((l) => /left routing: it serves weight version default, not 7 \(restarted on its initial weights\?\)/.test(l))).toBe(true);
    await waitUntil(() => f.list()[0]!.healthy, { what: "the engine back in routing" });
    const r = await f.generate({ inputIds: prompts[1]!, sampling: { ...sampling, max_new_tokens: 8 } });
    expect(r.weightVersions).toEqual([{ start: 0, end: 8, version: "7" }]);
  });

  for (const stream of [false, true])
    it(`a reply sampled on the initial weights of an engine restarted between health checks is dropped, and the request re-dispatched at the fleet's version (${stream ? "streamed" : "plain"})`, async () => {
      const engine = await initialEngine();
      const lines: string[] = [];
      // No health checks: only the reply can show the restart.
      const f = fleet({ log: (l) => lines.push(l), healthIntervalMs: 0, stream });
      await f.attach(engine.url);
      await f.updateWeights(dirA2, "7");
      const c = new EngineClient(engine.url);
      await c.updateWeightsFromDisk({ modelPath: dirA, weightVersion: "default" });
      const r = await f.generate({ inputIds: prompts[1]!, sampling: { ...sampling, max_new_tokens: 8 } });
      expect(r.weightVersions).toEqual([{ start: 0, end: 8, version: "7" }]);
      expect(r.redispatches).toBe(1);
      expect(await c.weightVersion()).toBe("7");
      expect(lines.some((l) => /left routing: \S+ answered under weight version default, not 7 \(restarted on its initial weights\?\)/.test(l)), lines.join("\n")).toBe(true);
    });

  it("a fleet that follows another's version drops a reply from an engine back on its initial weights, and re-dispatches once the engine is brought up to date", async () => {
    const engine = await initialEngine();
    const c = new EngineClient(engine.url);
    const lines: string[] = [];
    // Health checks 2 s apart: the restart below shows in the reply first.
    const f = fleet({ log: (l) => lines.push(l), healthIntervalMs: 2_000 });
    // Joined before the job's first update (as a rollout's fleet does), then the updating fleet
    // (here: by hand) brings the engine to version 7, which this one follows.
    await f.attach(engine.url);
    await c.updateWeightsFromDisk({ modelPath: dirA2, weightVersion: "7" });
    f.followVersion("7");
    // The engine restarts on its initial weights.
    await c.updateWeightsFromDisk({ modelPath: dirA, weightVersion: "default" });
    const pending = f.generate({ inputIds: prompts[1]!, sampling: { ...sampling, max_new_tokens: 8 } });
    await waitUntil(() => lines.some((l) => /left routing: \S+ answered under weight version default, not 7/.test(l)), { what: "the reply to show the restart", diagnostics: () => lines.join("\n") });
    // The updating fleet (here: by hand) brings the engine back; a health check lets it join again.
    await c.updateWeightsFromDisk({ modelPath: dirA2, weightVersion: "7" });
    const r = await pending;
    expect(r.weightVersions).toEqual([{ start: 0, end: 8, version: "7" }]);
    expect(r.redispatches).toBe(1);
  });
});
