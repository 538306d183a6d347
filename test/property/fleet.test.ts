// Property: whatever schedule of attach / detach / SIGKILL / restart / abort_all hits the engines
// while N greedy requests are in flight, every request completes exactly once with the tokens and
// logprobs a single engine produces for its prompt (identical weights everywhere), its weight-version
// spans covering its output. Engines are real child processes on fixed ports. Cases:
// propertyRuns(10); a failure prints fast-check's seed and shrunk schedule. Its schedules mix fleet
// membership changes (attach, detach, abort_all) with engine kills and restarts, so they are drawn
// here rather than by ooze/testing's scheduleArb (whose faults are not membership changes); the
// count is recorded with recordSchedules like the others.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { initModelDir } from "../../native/model-dir.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet, type FleetGenerateResult } from "../../src/engine/fleet/fleet.ts";
import { spawnEngine, type EngineProcess } from "../fixtures/engine-process.ts";
import { propertyRuns, recordSchedules, waitUntil } from "../harness/index.ts";

const RUNS = propertyRuns(10);
const ENGINES = 3;
const MAX_NEW = 128;
const sampling = { max_new_tokens: MAX_NEW, temperature: 0, ignore_eos: true };
const POOL = Array.from({ length: 6 }, (_, k) => Int32Array.from([256, 65 + k, 32, 50 + (k % 3), 43, 51 + k]));

let dir: string;
/** Current process per slot, null while killed; ports stay fixed so restarts reuse them. */
const procs: (EngineProcess | null)[] = [];
const ports: number[] = [];
const reference: { ids: number[]; lps: number[] }[] = [];
const urlOf = (i: number) => `http://127.0.0.1:${ports[i]}`;
/** Re-dispatches over all cases, printed at the end (so a run shows that faults did hit requests). */
const tally = { requests: 0, redispatched: 0, redispatches: 0 };

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "ooze-fleet-prop-"));
  await initModelDir("tiny", dir, 11);
  for (let i = 0; i < ENGINES; i++) {
    const p = await spawnEngine(dir, 0, "v1");
    procs.push(p);
    ports.push(p.port);
  }
  const c = new EngineClient(urlOf(0));
  for (const p of POOL) {
    const r = await c.generate({ inputIds: p, sampling, returnLogprob: true });
    reference.push({ ids: Array.from(r.outputIds), lps: Array.from(r.logprobs) });
  }
});

afterAll(async () => {
  process.stdout.write(`fleet property: ${tally.requests} requests, ${tally.redispatched} re-dispatched (${tally.redispatches} re-dispatches)\n`);
  for (const p of procs) await p?.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

type Op =
  | { op: "attach"; i: number }
  | { op: "detach"; i: number }
  | { op: "kill"; i: number }
  | { op: "restart"; i: number }
  | { op: "abortAll"; i: number };

/** Target ENGINES means "the engine with the most requests in flight now", so faults hit work. */
const target = fc.integer({ min: 0, max: ENGINES });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 2, arbitrary: fc.record({ op: fc.constant("attach" as const), i: target }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("detach" as const), i: target }) },
  { weight: 3, arbitrary: fc.record({ op: fc.constant("kill" as const), i: target }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("restart" as const), i: target }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("abortAll" as const), i: target }) },
);

const caseArb = fc.record({
  routing: fc.constantFrom("round_robin" as const, "least_load" as const, "cache_aware" as const),
  stream: fc.boolean(),
  initial: fc.uniqueArray(fc.integer({ min: 0, max: ENGINES - 1 }), { minLength: 1, maxLength: ENGINES }),
  requests: fc.array(fc.integer({ min: 0, max: POOL.length - 1 }), { minLength: 2, maxLength: 5 }),
  ops: fc.array(opArb, { minLength: 1, maxLength: 5 }),
});

async function restart(i: number): Promise<void> {
  if (procs[i] !== null) return;
  procs[i] = await spawnEngine(dir, ports[i]!, "v1");
}

describe("fleet property: requests survive any schedule of engine churn", () => {
  it("every request completes exactly once with intact tokens", { timeout: 300_000 }, async () => {
    const d = await fc.check(
      fc.asyncProperty(caseArb, async (c) => {
        const fleet = new Fleet({ routing: c.routing, stream: c.stream, healthIntervalMs: 100, healthTimeoutMs: 2_000, requestTimeoutMs: 60_000 });
        const attached = new Set<number>();
        const log: string[] = [];
        try {
          for (const i of c.initial) {
            if (procs[i] === null) continue;
            await fleet.attach(urlOf(i));
            attached.add(i);
          }
          const settled: (FleetGenerateResult | Error)[] = [];
          let settles = 0;
          const rids = c.requests.map((_, k) => `q${k}`);
          const all = Promise.all(
            c.requests.map((p, k) =>
              fleet.generate({ inputIds: POOL[p]!, sampling, rid: rids[k]! }).then(
                (r) => {
                  settles++;
                  settled[k] = r;
                },
                (e: Error) => {
                  settles++;
                  settled[k] = e;
                },
              ),
            ),
          );
          const progress = () => rids.reduce((s, r) => s + (fleet.progress(r) ?? MAX_NEW), 0);
          for (const op of c.ops) {
            let i = op.i;
            if (i === ENGINES) {
              const busy = fleet.list().sort((a, b) => b.inFlight - a.inFlight)[0];
              i = busy ? ports.findIndex((p) => busy.url.endsWith(`:${p}`)) : 0;
            }
            const o = { op: op.op, i };
            log.push(`${o.op} ${o.i}`);
            const before = progress();
            if (o.op === "attach" && procs[o.i] !== null && !attached.has(o.i)) {
              await fleet.attach(urlOf(o.i));
              attached.add(o.i);
            } else if (o.op === "detach" && attached.has(o.i)) {
              await fleet.detach(urlOf(o.i));
              attached.delete(o.i);
            } else if (o.op === "kill" && procs[o.i] !== null) {
              await procs[o.i]!.kill("SIGKILL");
              procs[o.i] = null;
            } else if (o.op === "restart") {
              await restart(o.i);
            } else if (o.op === "abortAll" && procs[o.i] !== null) {
              await new EngineClient(urlOf(o.i)).abort({ all: true });
            }
            // Let generation move on before the next fault, when some attached engine is alive.
            if ([...attached].some((i) => procs[i] !== null)) {
              await waitUntil(() => settles === rids.length || progress() > before, {
                timeoutMs: 30_000,
                what: `progress after '${o.op} ${o.i}'`,
                diagnostics: () => `schedule: ${log.join(", ")}\nengines: ${JSON.stringify(fleet.list())}`,
              });
            }
          }
          for (let i = 0; i < ENGINES; i++) {
            await restart(i);
            if (!attached.has(i)) await fleet.attach(urlOf(i));
          }
          await waitUntil(() => settles === rids.length, {
            timeoutMs: 60_000,
            what: "every request to finish",
            diagnostics: () => `schedule: ${log.join(", ")}\nprogress: ${rids.map((r) => fleet.progress(r)).join(",")}\nengines: ${JSON.stringify(fleet.list())}`,
          });
          await all;
          expect(settles).toBe(rids.length);
          for (const r of rids) expect(fleet.progress(r)).toBeNull();
          c.requests.forEach((p, k) => {
            const r = settled[k]!;
            if (r instanceof Error) throw new Error(`request ${k} failed after schedule [${log.join(", ")}]: ${r.message}`);
            const ref = reference[p]!;
            expect(Array.from(r.outputIds), `request ${k} tokens after [${log.join(", ")}]`).toEqual(ref.ids);
            r.logprobs.forEach((lp, t) => expect(Math.abs(lp - ref.lps[t]!)).toBeLessThan(1e-4));
            expect(r.status).toBe("truncated");
            tally.requests++;
            tally.redispatches += r.redispatches;
            if (r.redispatches > 0) tally.redispatched++;
            const spans = r.weightVersions;
            expect(spans.map((s) => s.version)).toEqual(["v1"]);
            expect(spans[0]).toEqual({ start: 0, end: MAX_NEW, version: "v1" });
          });
        } finally {
          await fleet.close();
        }
      }),
      { numRuns: RUNS },
    );
    recordSchedules("fleet: engine churn (attach, detach, SIGKILL, restart, abort_all)", d.numRuns, !d.failed, d.seed);
    if (d.failed) throw new Error(`${fc.defaultReportMessage(d)}`);
  });
});
