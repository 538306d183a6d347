// Property (ooze/testing on the fleet): two real engine servers (tiny native model), each reached
// through a cut proxy (a TCP link that a `cut` fault resets and refuses) and an engine fault proxy
// (`engine` faults: 503, half a body, a reply that never comes, a slow reply, a reset connection),
// under schedules drawn by ooze/testing's scheduleArb and played by playFaults while a Fleet
// generates greedily (streamed and not, each routing policy). Every request finishes exactly once
// with the tokens a fault-free engine gives its prompt, none is lost or fails, none hangs (a
// deadline), and after the schedule no request is left in flight. These schedules are the cheap bulk
// of the suite's count (each well under a second on an idle machine). Runs: propertyRuns(60).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import {
  checkSchedules,
  createCutProxy,
  playFaults,
  propertyRuns,
  startEngineFaultProxy,
  withDeadline,
  type CutProxy,
  type EngineFaultProxy,
  type FaultSpec,
} from "../harness/index.ts";

const RUNS = propertyRuns(60);
const MAX_NEW = 12;
const sampling = { max_new_tokens: MAX_NEW, temperature: 0, ignore_eos: true };
const PROMPTS = Array.from({ length: 4 }, (_, k) => Int32Array.from([256, 70 + k, 32, 49 + k]));

const root = mkdtempSync(join(tmpdir(), "ooze-fleet-schedules-"));
const servers: EngineServer[] = [];
const links: CutProxy[] = [];
const proxies: EngineFaultProxy[] = [];
const reference: number[][] = [];
const tally = { schedules: 0, faults: 0, requests: 0, redispatched: 0, ms: 0 };

beforeAll(async () => {
  await initModelDir("tiny", join(root, "m"), 5);
  for (let i = 0; i < 2; i++) {
    const s = await startEngineServer({ backend: createNativeBackend({ modelDir: join(root, "m") }) });
    servers.push(s);
    const link = await createCutProxy(Number(new URL(s.url).port));
    links.push(link);
    proxies.push(await startEngineFaultProxy(`http://127.0.0.1:${link.port}`));
  }
  const c = new EngineClient(servers[0]!.url);
  for (const p of PROMPTS) reference.push(Array.from((await c.generate({ inputIds: p, sampling })).outputIds));
}, 120_000);

afterAll(async () => {
  process.stdout.write(
    `fleet schedules: ${tally.schedules} schedules, ${tally.faults} faults, ${tally.requests} requests (${tally.redispatched} re-dispatched), ` +
      `${tally.schedules > 0 ? Math.round((60_000 * tally.schedules) / tally.ms) : 0} schedules/min\n`,
  );
  for (const p of proxies) await p.close();
  for (const l of links) await l.close();
  for (const s of servers) await s.close();
  rmSync(root, { recursive: true, force: true });
});

const caseArb = fc.record({
  routing: fc.constantFrom("round_robin" as const, "least_load" as const, "cache_aware" as const),
  stream: fc.boolean(),
  requests: fc.array(fc.integer({ min: 0, max: PROMPTS.length - 1 }), { minLength: 1, maxLength: 4 }),
});

describe("fleet under fault schedules (ooze/testing)", () => {
  it("every request finishes once with the fault-free tokens, whatever engine faults and cuts hit its engines", { timeout: 120_000 + RUNS * 20_000 }, async () => {
    const result = await checkSchedules(
      { kinds: ["engine", "cut"], engines: ["e0", "e1"], links: ["e0", "e1"], horizonMs: 200, maxForMs: 200, maxFaults: 3 },
      async (schedule: FaultSpec[], c) => {
        const t0 = Date.now();
        const log: string[] = [];
        const fleet = new Fleet({
          routing: c.routing, stream: c.stream, healthIntervalMs: 100, healthTimeoutMs: 1_000, requestTimeoutMs: 20_000,
          progressTimeoutMs: 800, progressTimeoutPerTokenMs: 0, minProgressTimeoutMs: 800, streamIdleTimeoutMs: 800,
          maxRetries: 40, retryBaseMs: 10, retryMaxMs: 100, leaveAfterFailures: 1_000, log: (l) => log.push(l),
        });
        for (const p of proxies) await fleet.attach(p.url); // before the faults: attaching checks the engine
        const player = playFaults(schedule, { engines: { e0: proxies[0]!, e1: proxies[1]! }, links: { e0: links[0]!, e1: links[1]! } });
        try {
          // Rounds of the case's requests run back to back until every fault is injected and
          // undone, then one more: the faults meet requests in flight, the last round a healed fleet.
          let playing = true;
          void player.done.then(() => (playing = false));
          const rids: string[] = [];
          for (let round = 0; playing || round === 0; round++) {
            const ids = c.requests.map((_, i) => `s${tally.schedules}-${round}-r${i}`);
            rids.push(...ids);
            const results = await withDeadline(
              Promise.allSettled(c.requests.map((p, i) => fleet.generate({ inputIds: PROMPTS[p]!, sampling, rid: ids[i]! }))),
              30_000,
              `requests under [${schedule.map((f) => JSON.stringify(f)).join(", ")}] to finish; fleet log:\n${log.join("\n")}`,
            );
            results.forEach((r, i) => {
              if (r.status === "rejected") throw new Error(`${ids[i]} failed under the schedule: ${String(r.reason)}\nfleet log:\n${log.slice(-20).join("\n")}`);
              expect(Array.from(r.value.outputIds), `${ids[i]} (prompt ${c.requests[i]})`).toEqual(reference[c.requests[i]!]);
              expect(r.value.status).toBe("truncated");
              tally.requests++;
              if (r.value.redispatches > 0) tally.redispatched++;
            });
          }
          for (const rid of rids) expect(fleet.progress(rid), `${rid} left in flight`).toBeNull();
        } finally {
          const applied = await player.stop();
          tally.faults += applied.filter((a) => a.ok && !/(fault off|heal|SIGCONT|restart|free)/.test(a.action)).length;
          await fleet.close();
          for (const p of proxies) p.setFault({ kind: null });
          for (const l of links) l.heal();
          tally.schedules++;
          tally.ms += Date.now() - t0;
        }
      },
      { runs: RUNS, label: "fleet: engine faults and cuts under greedy requests", with: caseArb },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} with ${JSON.stringify(result.drawn)} (seed ${result.seed}, path ${result.path})`).toBeNull();
    expect(result.ok).toBe(true);
  });
});
