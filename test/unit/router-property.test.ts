// Property test of the Router: random sequences of add/remove/route/release never route to an engine
// outside the set, and a session stays on its engine while that engine remains in the set.
// FAST_CHECK_RUNS raises the number of cases; a failure prints fast-check's seed and shrunk sequence.
import fc from "fast-check";
import { describe, it } from "vitest";
import { ApproxPrefixTree, Router, type RoutingPolicy } from "../../src/engine/fleet/router.ts";

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

describe("Router cache_aware (property)", () => {
  // The router finds the least and most loaded engines and the best-matching ones from indexes
  // (cost independent of the engines in the set); this checks each decision against SGLang's rules
  // applied by visiting every engine: an imbalance goes to a least loaded engine, else a match
  // above the threshold to the least loaded of the longest-matching engines, else to a smallest tree.
  // Ties may go to any of the tied engines.
  type CacheOp = { op: "add"; id: number } | { op: "remove"; id: number } | { op: "release"; id: number } | { op: "route"; ids: number[]; avoid: number | null };
  // few engines and a two-token alphabet, so that prefixes are shared, often by every engine
  const cacheOp: fc.Arbitrary<CacheOp> = fc.oneof(
    { arbitrary: fc.record({ op: fc.constant("add" as const), id: fc.integer({ min: 0, max: 3 }) }), weight: 2 },
    { arbitrary: fc.record({ op: fc.constant("remove" as const), id: fc.integer({ min: 0, max: 3 }) }), weight: 1 },
    { arbitrary: fc.record({ op: fc.constant("release" as const), id: fc.integer({ min: 0, max: 3 }) }), weight: 3 },
    {
      arbitrary: fc.record({
        op: fc.constant("route" as const),
        ids: fc.array(fc.integer({ min: 0, max: 1 }), { minLength: 1, maxLength: 8 }),
        avoid: fc.option(fc.integer({ min: 0, max: 3 }), { nil: null }),
      }),
      weight: 6,
    },
  );

  it("each decision is one the rules allow, checked against every engine", () => {
    fc.assert(
      fc.property(fc.array(cacheOp, { maxLength: 120 }), (ops) => {
        const opts = { maxTreeTokens: 24, balanceAbsThreshold: 2, balanceRelThreshold: 1.5, cacheThreshold: 0.3 };
        const r = new Router({ policy: "cache_aware", ...opts });
        const tree = new ApproxPrefixTree(); // the router's tree, mirrored
        for (const o of ops) {
          if (o.op === "add") r.addEngine(`e${o.id}`);
          else if (o.op === "remove") {
            r.removeEngine(`e${o.id}`);
            tree.removeEngine(`e${o.id}`);
          } else if (o.op === "release") r.release(`e${o.id}`);
          else {
            const all = r.engines();
            if (all.length === 0) continue;
            const avoid = o.avoid === null ? undefined : `e${o.avoid}`;
            const set = avoid !== undefined && all.length > 1 ? all.filter((e) => e !== avoid) : all;
            const loads = set.map((e) => r.load(e));
            const min = Math.min(...loads);
            const max = Math.max(...loads);
            const matched = tree.match(o.ids);
            const best = Math.max(...set.map((e) => matched.get(e) ?? 0));
            let allowed: string[];
            if (max - min > opts.balanceAbsThreshold && max > opts.balanceRelThreshold * min) allowed = set.filter((e) => r.load(e) === min);
            else if (best / o.ids.length > opts.cacheThreshold) {
              const holders = set.filter((e) => (matched.get(e) ?? 0) === best);
              const least = Math.min(...holders.map((e) => r.load(e)));
              allowed = holders.filter((e) => r.load(e) === least);
            } else {
              const smallest = Math.min(...set.map((e) => tree.size(e)));
              allowed = set.filter((e) => tree.size(e) === smallest);
            }
            const got = r.route(avoid === undefined ? { inputIds: o.ids } : { inputIds: o.ids, avoid });
            if (!allowed.includes(got)) return false;
            tree.insert(o.ids, got);
            if (tree.size(got) > opts.maxTreeTokens) tree.evict(got, Math.floor(opts.maxTreeTokens * 0.9));
            if (r.treeSize(got) !== tree.size(got)) return false;
          }
        }
        return true;
      }),
      { numRuns: 10 * runs } // cheap (a few ms a hundred), and the shared-prefix cases are a few percent,
    );
  });
});

describe("ApproxPrefixTree smallest (property)", () => {
  // The smallest tree comes from a heap of the engines' sizes; this checks it against a visit of
  // every engine in the order they were first counted (the first among equal sizes wins).
  type TreeOp = { op: "track"; id: number } | { op: "remove"; id: number } | { op: "insert"; id: number; ids: number[] } | { op: "evict"; id: number; target: number } | { op: "ask"; avoid: number | null };
  const treeOp: fc.Arbitrary<TreeOp> = fc.oneof(
    fc.record({ op: fc.constant("track" as const), id: fc.integer({ min: 0, max: 6 }) }),
    fc.record({ op: fc.constant("remove" as const), id: fc.integer({ min: 0, max: 6 }) }),
    { arbitrary: fc.record({ op: fc.constant("insert" as const), id: fc.integer({ min: 0, max: 6 }), ids: fc.array(fc.integer({ min: 0, max: 2 }), { minLength: 1, maxLength: 8 }) }), weight: 3 },
    fc.record({ op: fc.constant("evict" as const), id: fc.integer({ min: 0, max: 6 }), target: fc.integer({ min: 0, max: 8 }) }),
    { arbitrary: fc.record({ op: fc.constant("ask" as const), avoid: fc.option(fc.integer({ min: 0, max: 6 }), { nil: null }) }), weight: 2 },
  );

  it("names the engine a visit of every engine names", () => {
    fc.assert(
      fc.property(fc.array(treeOp, { maxLength: 100 }), (ops) => {
        const tree = new ApproxPrefixTree();
        const order: string[] = []; // engines counted, in the order they were first counted
        for (const o of ops) {
          if (o.op === "ask") {
            const avoid = o.avoid === null ? undefined : `e${o.avoid}`;
            let want: string | null = null;
            for (const e of order) if (e !== avoid && (want === null || tree.size(e) < tree.size(want))) want = e;
            if (tree.smallest(avoid) !== want) return false;
            continue;
          }
          const e = `e${o.id}`;
          if (o.op === "remove") {
            tree.removeEngine(e);
            if (order.includes(e)) order.splice(order.indexOf(e), 1);
            continue;
          }
          if (o.op === "track" || o.op === "insert") if (!order.includes(e)) order.push(e);
          if (o.op === "track") tree.track(e);
          else if (o.op === "insert") tree.insert(o.ids, e);
          else tree.evict(e, o.target);
        }
        return true;
      }),
      { numRuns: 5 * runs },
    );
  });
});
