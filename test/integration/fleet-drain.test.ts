// Fleet.drain on real simulated engines (SGLang's API over HTTP): a drained engine takes no new
// dispatch, the request running on it finishes there (not dispatched again), and it is detached once
// nothing runs on it; attaching it again before that keeps it. This is how a rollout instance hands
// engines of its share to another (actors/rollout/rollout-actor.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { H100_LLAMA_8B } from "../../src/engine/sim/perf-model.ts";
import { startSimEngines, type SimEngines } from "../../src/engine/sim/sim-engines.ts";
import { waitUntil } from "../harness/index.ts";

// The serving model 10 times slower: 48 tokens take about 3 s.
const SLOW = 10;
const table = {
  ...H100_LLAMA_8B,
  decodeTokensPerSecond: H100_LLAMA_8B.decodeTokensPerSecond.map((row) => row.map((r) => r / SLOW)),
  prefillTokensPerSecond: H100_LLAMA_8B.prefillTokensPerSecond.map((r) => r / SLOW),
};
let engines: SimEngines;

beforeAll(async () => {
  engines = await startSimEngines({ count: 2, table, stopProbability: 0 });
});
afterAll(async () => {
  await engines?.close();
});

const request = (sessionId: string) => ({ inputIds: Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8]), sampling: { max_new_tokens: 48, temperature: 1 }, sessionId });

describe("Fleet.drain", () => {
  it("keeps the running request on the drained engine, routes new ones elsewhere, detaches it when idle", async () => {
    const [a, b] = engines.urls as [string, string];
    const fleet = new Fleet({ healthIntervalMs: 0, log: () => undefined });
    try {
      await fleet.attach(a);
      const running = fleet.generate(request("s1"));
      await waitUntil(() => fleet.list()[0]!.inFlight === 1, { timeoutMs: 10_000, what: "the request running on a" });
      await fleet.attach(b);
      fleet.drain(a);
      const entryA = fleet.list().find((e) => e.id === a)!;
      expect(entryA).toMatchObject({ draining: true, healthy: false, inFlight: 1 });
      // A new request goes to b, the only engine in routing.
      const other = await fleet.generate({ ...request("s2"), sampling: { max_new_tokens: 2, temperature: 1 } });
      expect(other.engine).toBe(b);
      const r = await running;
      expect(r).toMatchObject({ engine: a, redispatches: 0, status: "truncated" });
      expect(r.outputIds.length).toBe(48);
      await waitUntil(() => fleet.list().every((e) => e.id !== a), { timeoutMs: 5_000, what: "a detached once idle" });
      expect(fleet.list().map((e) => e.id)).toEqual([b]);
    } finally {
      await fleet.close();
    }
  }, 60_000);

  it("an engine attached again while draining stays in routing; one with nothing in flight goes at once", async () => {
    const [a, b] = engines.urls as [string, string];
    const fleet = new Fleet({ healthIntervalMs: 0, log: () => undefined });
    try {
      await fleet.attach(a);
      await fleet.attach(b);
      const running = fleet.generate({ ...request("s3") });
      await waitUntil(() => fleet.list().some((e) => e.inFlight === 1), { timeoutMs: 10_000, what: "a request running" });
      const busy = fleet.list().find((e) => e.inFlight === 1)!.id;
      const idle = busy === a ? b : a;
      fleet.drain(idle);
      expect(fleet.list().map((e) => e.id)).toEqual([busy]);
      fleet.drain(busy);
      await fleet.attach(busy);
      expect(fleet.list().find((e) => e.id === busy)).toMatchObject({ draining: false, healthy: true });
      const r = await running;
      expect(r).toMatchObject({ engine: busy, redispatches: 0 });
      expect(fleet.list().map((e) => e.id)).toEqual([busy]);
      expect(() => fleet.drain(idle)).toThrow(/not attached/);
    } finally {
      await fleet.close();
    }
  }, 60_000);
});
