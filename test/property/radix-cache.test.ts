// Property test: random sequences of match/insert/lock/unlock/evict/flush against the native
// RadixCache and the reference trie; both must agree on every answer and on the slots given back,
// the budget is never exceeded, locked slots are never given back, flush is refused while locked.
// OOZE_PROPERTY_RUNS sets the number of runs (default 50); a failure prints seed and shrunk ops.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { RadixCacheRef } from "../../native/reference/radix-cache.ts";

type Op =
  | { op: "match"; tokens: number[]; lock: boolean }
  | { op: "insert"; tokens: number[]; lock: boolean }
  | { op: "unlock"; which: number }
  | { op: "evict"; n: number }
  | { op: "flush" };

const tokens = fc.array(fc.integer({ min: 0, max: 3 }), { maxLength: 12 });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ op: fc.constant("match" as const), tokens, lock: fc.boolean() }) },
  { weight: 5, arbitrary: fc.record({ op: fc.constant("insert" as const), tokens, lock: fc.boolean() }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("unlock" as const), which: fc.nat(20) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("evict" as const), n: fc.nat(15) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("flush" as const) }) },
);

interface Held {
  node: number;
  tokens: number[];
  length: number;
  slots: number[];
}

const sorted = (a: ArrayLike<number>): number[] => Array.from(a).sort((x, y) => x - y);

/** Runs one sequence; throws (with the failing step) on the first disagreement. */
function runOps(budget: number, ops: Op[]): void {
  const { RadixCache } = loadNative();
  const nat = new RadixCache(budget);
  const ref = new RadixCacheRef(budget);
  const held: Held[] = [];
  let nextSlot = 0;
  let issued = 0;
  let keptByCaller = 0;
  let givenBack = 0;
  ops.forEach((o, step) => {
    const where = `step ${step} ${JSON.stringify(o)}`;
    if (o.op === "match") {
      const t = Int32Array.from(o.tokens);
      const a = nat.match(t);
      const b = ref.match(o.tokens);
      expect(a.length, `${where}: matched length`).toBe(b.length);
      expect(Array.from(a.slots), `${where}: matched slots`).toEqual(b.slots);
      if (o.lock) {
        nat.lock(a.node);
        ref.lock(o.tokens, b.length);
        held.push({ node: a.node, tokens: o.tokens, length: b.length, slots: b.slots });
      }
    } else if (o.op === "insert") {
      const t = Int32Array.from(o.tokens);
      const s = Int32Array.from(o.tokens, () => nextSlot++);
      issued += s.length;
      const a = nat.insert(t, s);
      const b = ref.insert(o.tokens, Array.from(s));
      expect(a.cached, `${where}: already cached`).toBe(b.cached);
      keptByCaller += a.cached;
      if (o.lock) {
        nat.lock(a.node);
        ref.lock(o.tokens, b.held);
        // The path's slots: the cached prefix's own slots are the cache's, not ours; ask the ref.
        const slots = ref.match(o.tokens.slice(0, b.held)).slots;
        nat.match(t.subarray(0, b.held));
        held.push({ node: a.node, tokens: o.tokens, length: b.held, slots });
      }
    } else if (o.op === "unlock") {
      if (held.length > 0) {
        const [h] = held.splice(o.which % held.length, 1);
        nat.unlock(h!.node);
        ref.unlock(h!.tokens, h!.length);
      }
    } else if (o.op === "evict") {
      expect(nat.evict(o.n), `${where}: evicted count`).toBe(ref.evict(o.n));
    } else {
      const anyLock = held.some((h) => h.length > 0);
      const ok = nat.flush();
      expect(ok, `${where}: flush result`).toBe(ref.flush());
      expect(ok, `${where}: flush must be refused exactly while a lock is held`).toBe(!anyLock);
    }
    const ea = nat.takeEvicted();
    const eb = ref.takeEvicted();
    givenBack += ea.length;
    expect(sorted(ea), `${where}: slots given back`).toEqual(sorted(eb));
    const lockedSlots = new Set(held.flatMap((h) => h.slots));
    const bad = Array.from(ea).filter((x) => lockedSlots.has(x));
    expect(bad, `${where}: locked slots were given back`).toEqual([]);
    expect(nat.size(), `${where}: size`).toBe(ref.size());
    expect(nat.size(), `${where}: budget exceeded`).toBeLessThanOrEqual(budget);
    expect(nat.lockedTokens(), `${where}: locked tokens`).toBe(ref.lockedTokens());
    expect(nat.validate(), `${where}: native invariants`).toBe("");
    expect(nat.hitTokens(), `${where}: hit tokens`).toBe(ref.hitTokens);
    expect(nat.queriedTokens(), `${where}: queried tokens`).toBe(ref.queriedTokens);
  });
  // Every slot issued comes back exactly once: kept by the caller, given back, or still cached.
  for (const h of held) nat.unlock(h.node);
  expect(nat.flush()).toBe(true);
  givenBack += nat.takeEvicted().length;
  expect(keptByCaller + givenBack, "slot conservation").toBe(issued);
}

describe("RadixCache native vs reference", () => {
  it("agrees on random operation sequences", () => {
    const numRuns = Number(process.env.OOZE_PROPERTY_RUNS ?? 50);
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 40 }), fc.array(opArb, { maxLength: 60 }), (budget, ops) => {
        runOps(budget, ops);
      }),
      { numRuns },
    );
  });
});
