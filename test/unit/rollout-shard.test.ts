// Engine shares of rollout instances (actors/rollout/shard.ts): every engine belongs to exactly one
// member, shares are near even, a member joining or leaving moves only its own engines, and a member
// left without an engine takes one.
import { describe, expect, it } from "vitest";
import { engineShare } from "../../actors/rollout/shard.ts";
import { rolloutConcurrency, rolloutInstances } from "../../actors/rollout/rollout-actor.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { topologySchema } from "../../src/topology/schema.ts";

const urls = Array.from({ length: 256 }, (_, i) => `http://127.0.0.1:${20000 + i}`);
const members = (k: number) => Array.from({ length: k }, (_, i) => `rollout-${i}/0`);

describe("engineShare", () => {
  it("one member routes over every engine", () => {
    expect(engineShare(urls, ["rollout/0"], "rollout/0")).toEqual(urls);
    expect(engineShare(urls, [], "rollout/0")).toEqual(urls); // not yet listed: itself only
  });

  it("K members split the engines: disjoint, covering, each within 40 % of an even share", () => {
    for (const k of [2, 3, 8]) {
      const m = members(k);
      const shares = m.map((self) => engineShare(urls, m, self));
      expect(shares.flat().sort()).toEqual([...urls].sort());
      for (const s of shares) expect(Math.abs(s.length - urls.length / k)).toBeLessThan(0.4 * (urls.length / k));
    }
  });

  it("a member joining takes engines only from the others' shares, and leaving gives back only its own", () => {
    const before = members(4);
    const after = [...before, "rollout-new/0"];
    const joined = engineShare(urls, after, "rollout-new/0");
    expect(joined.length).toBeGreaterThan(0);
    for (const self of before) {
      const was = new Set(engineShare(urls, before, self));
      const now = engineShare(urls, after, self);
      for (const u of now) expect(was.has(u)).toBe(true); // nothing moves between old members
      for (const u of was) expect(now.includes(u) || joined.includes(u)).toBe(true);
    }
  });

  it("more members than engines: every member still routes over one engine, the engines all used", () => {
    const few = urls.slice(0, 3);
    const m = members(8);
    const shares = m.map((self) => engineShare(few, m, self));
    for (const s of shares) expect(s.length).toBeGreaterThanOrEqual(1);
    expect(new Set(shares.flat())).toEqual(new Set(few));
  });
});

describe("rolloutConcurrency", () => {
  it("divides the job's groups in flight among the topology's rollout instances, rounded up", () => {
    const topo = topologySchema.parse({
      name: "t",
      actors: [
        { name: "rollout", kind: "train.rollout", count: 2 },
        { name: "rollout-b", kind: "train.rollout" },
        { name: "buffer", kind: "train.buffer" },
      ],
    });
    expect(rolloutInstances(topo)).toBe(3);
    const train = (t: Record<string, unknown>) => trainConfigOf({ train: t, engines: undefined, file: "t.yaml" }).train;
    // fully_async: maxInflightGroups (given, or a step's prompts × the bound)
    expect(rolloutConcurrency(train({ mode: "fully_async", promptsPerStep: 8, maxInflightGroups: 4096 }), 4)).toEqual({ job: 4096, instance: 1024 });
    expect(rolloutConcurrency(train({ mode: "fully_async", promptsPerStep: 8, maxStaleness: 4 }), 3)).toEqual({ job: 32, instance: 11 });
    // the other modes: a step's prompts
    expect(rolloutConcurrency(train({ mode: "sync", promptsPerStep: 8 }), 3)).toEqual({ job: 8, instance: 3 });
    expect(rolloutConcurrency(train({ mode: "sync", promptsPerStep: 8 }), 1)).toEqual({ job: 8, instance: 8 });
    // never below one
    expect(rolloutConcurrency(train({ mode: "sync", promptsPerStep: 2 }), 5)).toEqual({ job: 2, instance: 1 });
  });
});
