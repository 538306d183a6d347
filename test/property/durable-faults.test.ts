// Property: a supervised actor consuming a durable JetStream mailbox in a real child process, under
// random schedules of handler crashes (before or after its effect), SIGKILLs of the consumer process
// (restarted at once) and nats-server restarts: every message's effect happens exactly once — each id
// is in the effects file exactly once, none missing. Cases: OOZE_PROPERTY_RUNS (default 5).
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, durableRef } from "../../src/actor/index.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats, waitUntil } from "../harness/index.ts";
import { spawnHost, type HostChild } from "../fixtures/actors/spawn-host.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 5);
const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-durable-prop-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Crash = "none" | "before" | "after";
type Step = { op: "send"; crashes: Crash[] } | { op: "kill" } | { op: "natsRestart" } | { op: "pause"; ms: number };

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant("send" as const),
      crashes: fc.array(fc.constantFrom<Crash>("none", "none", "none", "before", "after"), { minLength: 1, maxLength: 12 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("kill" as const) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("natsRestart" as const) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("pause" as const), ms: fc.integer({ min: 0, max: 100 }) }) },
);

let caseNo = 0;
const job = "prop-dur";
let host: HostChild | null = null;
const hostCfg = () => ({ url: nats.server.url, token: nats.server.token, job, ledger: { ackWaitMs: 1000 } });
afterAll(async () => {
  await host?.kill();
});

describe("durable mailbox under faults (property)", () => {
  it("every message's effect happens exactly once", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(stepArb, { minLength: 2, maxLength: 5 }), async (steps) => {
        const tag = `c${++caseNo}`;
        const file = join(dir, `${tag}.log`);
        // One consumer process serves every case until a schedule kills it.
        host ??= await spawnHost(hostCfg());
        const bus = await nats.connect();
        const sender = createSystem({ name: job, log: () => {} });
        await attachBus(sender, bus, { events: false });
        const ref = await durableRef<{ crash: Crash; file: string }>(sender, "ledger");
        const ids: string[] = [];
        try {
          for (const s of steps) {
            if (s.op === "send") {
              for (const crash of s.crashes) {
                const id = `${tag}-m${ids.length}`;
                ids.push(id);
                // Re-send the same id until stored (the duplicate window keeps it once).
                await waitUntil(() => ref.send({ crash, file }, { id, timeoutMs: 1000 }).then(() => true), {
                  what: `message ${id} to be stored`,
                  timeoutMs: 20_000,
                  intervalMs: 50,
                });
              }
            } else if (s.op === "kill") {
              await host.kill();
              host = await spawnHost(hostCfg());
            } else if (s.op === "natsRestart") {
              await nats.server.restart();
            } else {
              await new Promise((r) => setTimeout(r, s.ms));
            }
          }
          const jsm = await bus.jsm();
          const stream = jobNames(job).streamMailboxes;
          const lines = () => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0) : []);
          // Work queue empty = every message acked = every handler finished after its effect.
          await waitUntil(async () => (await jsm.streams.info(stream)).state.messages === 0, {
            what: "the mailbox stream to be empty",
            timeoutMs: 30_000,
            diagnostics: () => `effects: ${lines().length}/${ids.length}\nhost output:\n${host?.output()}`,
          });
          const counts = new Map<string, number>();
          for (const l of lines()) counts.set(l, (counts.get(l) ?? 0) + 1);
          const missing = ids.filter((id) => !counts.has(id));
          const twice = [...counts].filter(([, c]) => c !== 1);
          expect({ missing, twice }).toEqual({ missing: [], twice: [] });
          expect(counts.size).toBe(ids.length);
        } finally {
          await sender.stop();
        }
      }),
      { numRuns: RUNS },
    );
  }, 30_000 + RUNS * 15000);
});
