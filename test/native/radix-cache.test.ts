// Native RadixCache: concrete scenarios for prefix matching with splits, the budget, LRU eviction,
// locks, flush, hit accounting and errors on bad node ids.
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";

const { RadixCache } = loadNative();
const i32 = (...xs: number[]): Int32Array => Int32Array.from(xs);
const sorted = (a: Int32Array): number[] => Array.from(a).sort((x, y) => x - y);

describe("RadixCache", () => {
  it("matches the longest cached prefix, splitting a node mid-edge", () => {
    const c = new RadixCache(100);
    expect(c.insert(i32(1, 2, 3, 4), i32(10, 11, 12, 13)).cached).toBe(0);
    const m = c.match(i32(1, 2, 9));
    expect(m.length).toBe(2);
    expect(Array.from(m.slots)).toEqual([10, 11]);
    expect(c.nodeCount()).toBe(3); // root, [1,2], [3,4]
    expect(c.insert(i32(1, 2, 5), i32(20, 21, 22)).cached).toBe(2);
    expect(c.size()).toBe(5);
    expect(Array.from(c.match(i32(1, 2, 5, 6)).slots)).toEqual([10, 11, 22]);
    expect(c.match(i32(7)).length).toBe(0);
    expect(c.hitTokens()).toBe(2 + 3);
    expect(c.queriedTokens()).toBe(3 + 4 + 1);
    expect(c.validate()).toBe("");
  });

  it("evicts the least recently used leaf first, from its tail", () => {
    const c = new RadixCache(100);
    c.insert(i32(1, 1, 1), i32(0, 1, 2));
    c.insert(i32(2, 2, 2), i32(3, 4, 5));
    c.match(i32(1, 1, 1)); // 2,2,2 is now the oldest
    expect(c.evict(2)).toBe(2);
    expect(sorted(c.takeEvicted())).toEqual([4, 5]);
    expect(c.match(i32(2, 2, 2)).length).toBe(1);
    expect(c.match(i32(1, 1, 1)).length).toBe(3);
  });

  it("never exceeds the budget; caches only what fits when the rest is locked", () => {
    const c = new RadixCache(5);
    const r = c.insert(i32(1, 2, 3), i32(0, 1, 2));
    c.lock(r.node);
    const r2 = c.insert(i32(4, 5, 6, 7), i32(3, 4, 5, 6));
    expect(r2.cached).toBe(0);
    expect(c.size()).toBe(5);
    expect(sorted(c.takeEvicted())).toEqual([5, 6]); // tokens 6 and 7 did not fit
    expect(c.match(i32(4, 5, 6, 7)).length).toBe(2);
    expect(c.lockedTokens()).toBe(3);
    // The unlocked branch goes first; the locked one stays.
    c.insert(i32(8, 9), i32(7, 8));
    expect(sorted(c.takeEvicted())).toEqual([3, 4]);
    expect(c.match(i32(1, 2, 3)).length).toBe(3);
    expect(c.validate()).toBe("");
  });

  it("refuses to flush while locked, flushes everything after unlock", () => {
    const c = new RadixCache(10);
    c.insert(i32(1, 2), i32(0, 1));
    const m = c.match(i32(1));
    c.lock(m.node);
    expect(c.flush()).toBe(false);
    expect(c.size()).toBe(2);
    expect(c.evict(10)).toBe(1); // only the unlocked tail
    c.unlock(m.node);
    expect(c.flush()).toBe(true);
    expect(c.size()).toBe(0);
    expect(sorted(c.takeEvicted())).toEqual([0, 1]);
  });

  it("keeps a locked id on the same path when a later match splits its node", () => {
    const c = new RadixCache(10);
    const r = c.insert(i32(1, 2, 3, 4), i32(0, 1, 2, 3));
    c.lock(r.node);
    c.match(i32(1, 2)); // splits [1,2,3,4] into [1,2] + [3,4]; the id stays on [3,4]
    expect(c.lockedTokens()).toBe(4);
    c.unlock(r.node);
    expect(c.lockedTokens()).toBe(0);
    expect(c.validate()).toBe("");
  });

  it("throws on unknown ids and unbalanced unlocks", () => {
    const c = new RadixCache(10);
    expect(() => c.lock(42)).toThrow(/does not exist/);
    const r = c.insert(i32(1), i32(0));
    expect(() => c.unlock(r.node)).toThrow(/not locked/);
    expect(() => new RadixCache(-1)).toThrow(/budgetTokens/);
    expect(() => c.insert(i32(1, 2), i32(0))).toThrow(/differ in length/);
  });
});
