// Router policies: round-robin, least-load (two choices), cache-aware (SGLang's rules over an
// approximate token-id radix tree), session affinity, add/remove at any time, and tree eviction.
import { describe, expect, it } from "vitest";
import { OozeError } from "../../src/errors.ts";
import { ApproxPrefixTree, Router } from "../../src/engine/fleet/router.ts";

const seq = (start: number, n: number) => Array.from({ length: n }, (_, i) => start + i);

describe("ApproxPrefixTree", () => {
  it("matches per engine, splits edges, and counts tokens per engine", () => {
    const t = new ApproxPrefixTree();
    t.insert([1, 2, 3, 4], "a");
    t.insert([1, 2, 9], "b");
    expect(t.match([1, 2, 3, 4, 5])).toEqual(new Map([["a", 4], ["b", 2]]));
    expect(t.match([1, 2, 9, 9])).toEqual(new Map([["a", 2], ["b", 3]]));
    expect(t.match([1, 2, 3])).toEqual(new Map([["a", 3], ["b", 2]]));
    expect(t.match([7])).toEqual(new Map());
    expect(t.size("a")).toBe(4);
    expect(t.size("b")).toBe(3);
    t.insert([1, 2, 3, 4], "b");
    expect(t.size("b")).toBe(5);
  });

  it("evicts an engine's least recently used leaves first, keeping others' entries", () => {
    const t = new ApproxPrefixTree();
    t.insert([1, 1, 1], "a"); // oldest
    t.insert([2, 2, 2], "a");
    t.insert([1, 1, 1], "b");
    t.insert([3, 3, 3], "a"); // newest
    t.evict("a", 6);
    expect(t.size("a")).toBe(6);
    expect(t.match([1, 1, 1]).get("a")).toBeUndefined();
    expect(t.match([1, 1, 1]).get("b")).toBe(3);
    expect(t.match([3, 3, 3]).get("a")).toBe(3);
    t.removeEngine("a");
    expect(t.size("a")).toBe(0);
    expect(t.match([2, 2, 2])).toEqual(new Map());
  });
});

describe("Router", () => {
  it("throws ENGINE_UNAVAILABLE with no engines", () => {
    const r = new Router({ policy: "round_robin" });
    expect(() => r.route({ inputIds: [1] })).toThrow(OozeError);
  });

  it("round_robin cycles and tracks in-flight counts", () => {
    const r = new Router({ policy: "round_robin" });
    ["a", "b", "c"].forEach((e) => r.addEngine(e));
    expect([1, 2, 3, 4].map(() => r.route({ inputIds: [1] }))).toEqual(["a", "b", "c", "a"]);
    expect(r.load("a")).toBe(2);
    r.release("a");
    expect(r.load("a")).toBe(1);
  });

  it("least_load picks the less loaded of two", () => {
    const r = new Router({ policy: "least_load", random: () => 0 });
    r.addEngine("a");
    r.addEngine("b");
    // random()=0 → candidates a and b; equal load keeps a, then b is less loaded.
    expect(r.route({ inputIds: [1] })).toBe("a");
    expect(r.route({ inputIds: [1] })).toBe("b");
    expect(r.route({ inputIds: [1] })).toBe("a");
  });

  it("cache_aware: longest prefix above the threshold, else the smallest tree", () => {
    const r = new Router({ policy: "cache_aware" });
    r.addEngine("a");
    r.addEngine("b");
    const p1 = seq(0, 100);
    const p2 = seq(1000, 100);
    const first = r.route({ inputIds: p1 }); // empty trees: smallest = a
    expect(first).toBe("a");
    expect(r.route({ inputIds: p2 })).toBe("b"); // no match → smallest tree (b)
    // Shared 80% prefix with p1 → a, although a's tree is larger.
    r.route({ inputIds: seq(5000, 300) }); // b grows
    expect(r.route({ inputIds: [...seq(0, 80), ...seq(7000, 20)] })).toBe("a");
    // Matched fraction below the threshold → smallest tree.
    const small = r.treeSize("a") < r.treeSize("b") ? "a" : "b";
    expect(r.route({ inputIds: [...seq(0, 10), ...seq(9000, 90)] })).toBe(small);
  });

  it("cache_aware: imbalance beyond both thresholds routes to the least loaded", () => {
    const r = new Router({ policy: "cache_aware", balanceAbsThreshold: 2, balanceRelThreshold: 1.5 });
    r.addEngine("a");
    r.addEngine("b");
    const p = seq(0, 50);
    for (let i = 0; i < 3; i++) expect(r.route({ inputIds: p })).toBe("a"); // a: 3 in flight
    expect(r.route({ inputIds: p })).toBe("b"); // 3 − 0 > 2 and 3 > 0 → least loaded
    // 3 − 1 = 2, not > 2 → balanced: both engines now hold p, and the tie goes to the less loaded.
    expect(r.route({ inputIds: p })).toBe("b");
  });

  it("session affinity holds while the engine is in the set; removal drops tree entries", () => {
    const r = new Router({ policy: "round_robin" });
    ["a", "b", "c"].forEach((e) => r.addEngine(e));
    const s = r.route({ inputIds: [1], routingKey: "ep-1" });
    for (let i = 0; i < 5; i++) expect(r.route({ inputIds: [1, 2, 3], routingKey: "ep-1" })).toBe(s);
    r.removeEngine(s);
    const moved = r.route({ inputIds: [1], routingKey: "ep-1" });
    expect(moved).not.toBe(s);
    expect(r.route({ inputIds: [1], routingKey: "ep-1" })).toBe(moved);
    r.addEngine(s);
    expect(r.route({ inputIds: [1], routingKey: "ep-1" })).toBe(moved);

    const c = new Router({ policy: "cache_aware" });
    c.addEngine("x");
    c.route({ inputIds: seq(0, 10) });
    expect(c.treeSize("x")).toBe(10);
    c.removeEngine("x");
    expect(c.treeSize("x")).toBe(0);
  });

  it("cache_aware trees are bounded by per-engine LRU eviction", () => {
    const r = new Router({ policy: "cache_aware", maxTreeTokens: 100 });
    r.addEngine("a");
    for (let i = 0; i < 50; i++) {
      r.route({ inputIds: seq(i * 1000, 30) });
      expect(r.treeSize("a")).toBeLessThanOrEqual(100);
    }
  });
});
