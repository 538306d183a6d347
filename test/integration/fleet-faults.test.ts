// The Fleet's retries and progress deadlines over real engine servers (tiny native model), with the
// fault proxy of ooze/testing and an engine-side pause (test/fixtures/gated-backend.ts): a live engine
// that makes no progress past the deadline answers the abort with its tokens, which are kept; a reply
// that never comes is abandoned and the request finishes on the other engine; an engine that fails
// every dispatch leaves routing while another takes its traffic; with one engine a failing dispatch
// is retried after a backoff and fails, naming the faults, when retries run out.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { ProgressDeadlines, backoffMs, type RetrySettings } from "../../src/engine/fleet/retry.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { GatedBackend } from "../fixtures/gated-backend.ts";
import { startEngineFaultProxy, waitUntil, withDeadline, type EngineFaultProxy } from "../harness/index.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-fleet-faults-"));
let gated: GatedBackend;
const servers: EngineServer[] = [];
const fleets: Fleet[] = [];
const proxies: EngineFaultProxy[] = [];
let reference: number[];
const prompt = Int32Array.from([256, 72, 101, 108, 108, 111]);
const sampling = { max_new_tokens: 60, temperature: 0, ignore_eos: true };

function fleet(opts: ConstructorParameters<typeof Fleet>[0] = {}): Fleet {
  const f = new Fleet({ routing: "round_robin", healthIntervalMs: 0, requestTimeoutMs: 30_000, ...opts });
  fleets.push(f);
  return f;
}

beforeAll(async () => {
  await initModelDir("tiny", join(root, "m"), 3);
  gated = new GatedBackend(createNativeBackend({ modelDir: join(root, "m") }));
  servers.push(await startEngineServer({ backend: gated }), await startEngineServer({ backend: createNativeBackend({ modelDir: join(root, "m") }) }));
  reference = Array.from((await new EngineClient(servers[1]!.url).generate({ inputIds: prompt, sampling })).outputIds);
});

afterAll(async () => {
  for (const f of fleets) await f.close();
  for (const p of proxies) await p.close();
  for (const s of servers) await s.close();
  rmSync(root, { recursive: true, force: true });
});

describe("fleet: progress deadlines and retries", () => {
  it("a live engine stuck past the deadline answers the abort with its tokens: kept, the rest generated, no fault counted", async () => {
    const f = fleet({ progressTimeoutMs: 2_000, progressTimeoutPerTokenMs: 0, minProgressTimeoutMs: 2_000 });
    await f.attach(servers[0]!.url);
    // The engine stops stepping at the 7th token until the fleet's abort (at the deadline) reaches it.
    let reached = false;
    void gated.holdAfter("slow-1", 7).then(() => (reached = true));
    const r = await withDeadline(f.generate({ inputIds: prompt, sampling, rid: "slow-1" }), 30_000, "slow-1 to finish");
    expect(Array.from(r.outputIds)).toEqual(reference);
    expect(r.redispatches).toBeGreaterThanOrEqual(1);
    expect(r.status).toBe("truncated");
    // Held at 7 tokens, the engine's abort answer carried them: a retry, not a fault. (Only a machine
    // too slow to sample 7 tokens in 2 s would see an abort answer without tokens, a timeout fault.)
    if (reached) expect(r.faults).toEqual([]);
    else expect(r.faults.every((x) => x === "timeout")).toBe(true);
  });

  it("a reply that never comes is abandoned at the deadline and the request finishes on the other engine", async () => {
    const hang = await startEngineFaultProxy(servers[0]!.url, { kind: "hang", schedule: [0] });
    proxies.push(hang);
    const logs: string[] = [];
    const f = fleet({ progressTimeoutMs: 2_000, progressTimeoutPerTokenMs: 0, minProgressTimeoutMs: 2_000, log: (l) => logs.push(l) });
    await f.attach(hang.url);
    await f.attach(servers[1]!.url);
    const r = await f.generate({ inputIds: prompt, sampling, rid: "hang-1" });
    expect(Array.from(r.outputIds)).toEqual(reference);
    expect(r.faults).toEqual(["timeout"]);
    expect(r.engine).toBe(servers[1]!.url);
    expect(logs.some((l) => /hang-1: no reply from .* within 2000 ms \(progress deadline\)/.test(l))).toBe(true);
    expect(f.takeFaultStats()).toEqual({ faults: { timeout: 1 }, retried: 1, exhausted: 0 });
  });

  it("an engine failing every dispatch leaves routing while another takes the traffic; alone, retries back off and run out naming the fault", async () => {
    const bad = await startEngineFaultProxy(servers[0]!.url, { kind: "http-503" });
    proxies.push(bad);
    const f = fleet({ leaveAfterFailures: 3 });
    await f.attach(bad.url);
    await f.attach(servers[1]!.url);
    for (let i = 0; i < 6; i++) expect(Array.from((await f.generate({ inputIds: prompt, sampling })).outputIds)).toEqual(reference);
    const gone = f.list().find((e) => e.url === bad.url)!;
    expect(gone.healthy).toBe(false);
    expect(gone.lastError).toMatch(/failed 3 dispatches in a row \(last: http-503: .*answered 503/);
    const stats = f.takeFaultStats();
    expect(stats).toMatchObject({ faults: { "http-503": 3 }, retried: 3, exhausted: 0 });

    const alone = fleet({ maxRetries: 2, retryBaseMs: 50, leaveAfterFailures: 1 });
    await alone.attach(bad.url);
    const before = bad.stats().faulted["http-503"] ?? 0;
    const err = await alone.generate({ inputIds: prompt, sampling, rid: "x-1" }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "ENGINE_UNAVAILABLE" });
    expect((err as Error).message).toMatch(/request x-1 failed 3 dispatches \(http-503 ×3\), retries exhausted \(maxRetries 2\); last: .*answered 503/);
    expect((bad.stats().faulted["http-503"] ?? 0) - before).toBe(3);
    expect(alone.list()[0]!.healthy).toBe(true); // the only engine stays in routing
  });
});

describe("fleet: health checks of a busy engine", () => {
  it("a health check left unanswered does not count against an engine that answers its dispatches; once idle, it does", async () => {
    // At 1,024 simulated engines the health checks of busy engines went unanswered in time (the
    // rollout process's own event loop stalled past their deadline), and engines that answered every
    // request left routing, each leave re-dispatching its requests (docs/experiments/scale.md, Dec 1).
    const p = await startEngineFaultProxy(servers[1]!.url, { kind: null });
    proxies.push(p);
    const f = fleet({ healthIntervalMs: 300, healthTimeoutMs: 100 });
    await f.attach(p.url);
    p.setFault({ kind: "hang", paths: ["/health"] });
    const short = { max_new_tokens: 4, temperature: 0, ignore_eos: true };
    let answered = 0;
    const loop = async () => {
      while ((p.stats().faulted.hang ?? 0) < 6) {
        await f.generate({ inputIds: prompt, sampling: short });
        answered++;
      }
    };
    await withDeadline(Promise.all([loop(), loop()]), 60_000, "six unanswered health checks during traffic");
    const e = f.list().find((x) => x.url === p.url)!;
    expect(answered).toBeGreaterThan(0);
    expect(e.healthy).toBe(true);
    // Idle, the same unanswered checks take it out of routing.
    const gone = await waitUntil(() => f.list().find((x) => x.url === p.url && !x.healthy), { what: "the idle engine to leave routing" });
    expect(gone.lastError).toMatch(/failed 3 health checks in a row/);
  });
});

describe("fleet: every engine failing at once", () => {
  it("once a request has failed on every engine, each retry waits a backoff (it does not spend its budget in a burst)", async () => {
    // Found by test/property/fleet-schedules.test.ts: with both engines cut for ~15 ms a request went
    // back and forth between them without a pause and spent its whole retry budget in milliseconds.
    const bad = [await startEngineFaultProxy(servers[0]!.url, { kind: "http-503" }), await startEngineFaultProxy(servers[1]!.url, { kind: "http-503" })];
    proxies.push(...bad);
    const logs: string[] = [];
    const f = fleet({ maxRetries: 4, retryBaseMs: 5, retryMaxMs: 20, leaveAfterFailures: 1_000, log: (l) => logs.push(l) });
    for (const p of bad) await f.attach(p.url);
    const err = await f.generate({ inputIds: prompt, sampling, rid: "all-bad" }).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(/request all-bad failed 5 dispatches \(http-503 ×5\), retries exhausted/);
    const lines = logs.filter((l) => l.includes("re-dispatching all-bad"));
    expect(lines).toHaveLength(4);
    // The first retry goes to the other engine at once; every later one (all engines tried) backs off.
    expect(lines.map((l) => /after a backoff of \d+ ms/.test(l))).toEqual([false, true, true, true]);
  });
});

describe("progress deadline arithmetic", () => {
  const s: RetrySettings = {
    progressTimeoutMs: 10_000, progressTimeoutPerTokenMs: 50, minProgressTimeoutMs: 1_000,
    maxDispatchMs: 600_000, maxStreamIdleMs: 120_000, retryBaseMs: 200, retryMaxMs: 5_000, random: () => 0.5,
  };

  it("fixed until dispatches are seen, then 4 × the slowest recent one (floored), doubled per deadline a live engine missed, capped", () => {
    const d = new ProgressDeadlines(s);
    expect(d.dispatchMs(100, 0)).toBe(15_000);
    for (let i = 0; i < 8; i++) d.observe(100);
    expect(d.dispatchMs(100, 0)).toBe(1_000);
    d.observe(900);
    expect(d.dispatchMs(100, 0)).toBe(3_600);
    expect(d.dispatchMs(100, 2)).toBe(14_400);
    expect(d.dispatchMs(100, 30)).toBe(600_000);
    expect(d.streamIdleMs(0)).toBe(10_000);
    expect(d.streamIdleMs(5)).toBe(120_000);
  });

  it("backoff doubles from the base, jittered, capped", () => {
    expect([1, 2, 3, 6, 9].map((n) => backoffMs(s, n))).toEqual([200, 400, 800, 5_000, 5_000]);
    expect(backoffMs({ ...s, random: () => 0 }, 1)).toBe(100);
  });
});
