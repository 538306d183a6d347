// Property test of the Router: random sequences of add/remove/route/release never route to an engine
// outside the set, and a session stays on its engine while that engine remains in the set.
// FAST_CHECK_RUNS raises the number of cases; a failure prints fast-check's seed and shrunk sequence.
import fc from "fast-check";
import { describe, it } from "vitest";
import { Router, type RoutingPolicy } from "../../src/engine/fleet/router.ts";

type Op =
  | { op: "add"; id: number }
  | { op: "remove"; id: number }
  | { op: "route"; key: number | null; ids: number[] }
  | { op: "release"; id: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ op: fc.constant("add" as const), id: fc.integer({ min: 0, max: 5 }) }),
  fc.record({ op: fc.constant("remove" as const), id: fc.integer({ min: 0, max: 5 }) }),
  fc.record({
    op: fc.constant("route" as const),
    key: fc.option(fc.integer({ min: 0, max: 4 }), { nil: null }),
    ids: fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 12 }),
  }),
  fc.record({ op: fc.constant("release" as const), id: fc.integer({ min: 0, max: 5 }) }),
);

const runs = Number(process.env.FAST_CHECK_RUNS ?? 200);

describe.each(["round_robin", "least_load", "cache_aware"] as RoutingPolicy[])("Router %s (property)", (policy) => {
  it("routes only inside the set and honours affinity while possible", () => {
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 80 }), fc.integer(), (ops, seed) => {
        let s = seed >>> 0;
        const random = () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32);
        const r = new Router({ policy, random, maxTreeTokens: 20, balanceAbsThreshold: 2 });
        const set = new Set<string>();
        const pinned = new Map<number, string>();
        for (const o of ops) {
          if (o.op === "add") {
            r.addEngine(`e${o.id}`);
            set.add(`e${o.id}`);
          } else if (o.op === "remove") {
            r.removeEngine(`e${o.id}`);
            set.delete(`e${o.id}`);
            for (const [k, v] of pinned) if (v === `e${o.id}`) pinned.delete(k);
          } else if (o.op === "release") {
            r.release(`e${o.id}`);
          } else {
            if (set.size === 0) {
              let threw = false;
              try {
                r.route({ inputIds: o.ids });
              } catch {
                threw = true;
              }
              if (!threw) return false;
              continue;
            }
            const got = r.route(o.key === null ? { inputIds: o.ids } : { inputIds: o.ids, routingKey: `k${o.key}` });
            if (!set.has(got)) return false;
            if (o.key !== null) {
              const want = pinned.get(o.key);
              if (want !== undefined && want !== got) return false;
              pinned.set(o.key, got);
            }
            if (policy === "cache_aware" && r.treeSize(got) > 20) return false;
          }
        }
        return r.engines().every((e) => set.has(e)) && set.size === r.engines().length;
      }),
      { numRuns: runs },
    );
  });
});
