// Property: a supervised actor consuming a durable JetStream mailbox in a real child process, under
// fault schedules drawn by ooze/testing — SIGKILLs of the consumer process (restarted at once),
// SIGSTOP/SIGCONT of it, nats-server restarts — while messages whose handlers crash before or after
// their effect are sent: every message's effect happens exactly once — each id is in the effects
// file exactly once, none missing. Runs: propertyRuns(10).
import { mkdtempSync, readFileSync, existsSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, durableRef, type DurableStats } from "../../src/actor/index.ts";
import { jobNames } from "../../src/transport/names.ts";
import { checkSchedules, playFaults, propertyRuns, useNats, waitUntil } from "../harness/index.ts";
import { spawnHost, type HostChild } from "../fixtures/actors/spawn-host.ts";

const RUNS = propertyRuns(10);
const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-durable-prop-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Crash = "none" | "before" | "after";

/** Batches of messages sent while the schedule plays, each after a gap; each message's handler crashes before or after its effect, or not. */
const trafficArb = fc.array(
  fc.record({
    crashes: fc.array(fc.constantFrom<Crash>("none", "none", "none", "before", "after"), { minLength: 1, maxLength: 12 }),
    gapMs: fc.integer({ min: 0, max: 300 }),
  }),
  { minLength: 1, maxLength: 4 },
);

let caseNo = 0;
/** Cases drained with a message the server still counted as awaiting its ack (see the drain check). */
let serverHeld = 0;
afterAll(() => void (serverHeld > 0 && process.stdout.write(`durable-faults: ${serverHeld} case(s) drained with a message nats-server still counted as awaiting its ack and never redelivered\n`)));
const job = "prop-dur";
const hostCfg = () => ({ url: nats.server.url, token: nats.server.token, job, ledger: { ackWaitMs: 1000 } });
/** The consumer process, restarted at once whenever a fault kills it (the test is its supervisor). */
let host: HostChild | null = null;
let respawn: Promise<void> | null = null;
let closing = false;
async function startHost(): Promise<void> {
  // Like `ooze up` restarting a node: a start that fails (the nats-server is down being restarted) is tried again.
  let last = "";
  const h = await waitUntil(() => spawnHost(hostCfg()).catch((e: unknown) => void (last = String(e))), {
    what: "the consumer process to start",
    timeoutMs: 30_000,
    intervalMs: 100,
    diagnostics: () => last,
  });
  host = h;
  h.proc.once("exit", () => {
    if (!closing) respawn = startHost();
  });
}
afterAll(async () => {
  closing = true;
  await respawn?.catch(() => {});
  await host?.kill();
});

describe("durable mailbox under faults (property, ooze/testing schedules)", () => {
  it("every message's effect happens exactly once", async () => {
    const result = await checkSchedules(
      // SIGKILL or SIGSTOP/SIGCONT of the consumer process, nats-server restarts, within 1.5 s.
      { kinds: ["kill", "pause", "nats-restart"], processes: ["consumer"], horizonMs: 1_500, maxForMs: 600, maxFaults: 3 },
      async (schedule, traffic) => {
        const tag = `c${++caseNo}`;
        const file = join(dir, `${tag}.log`);
        // One consumer process serves every case until a schedule kills it.
        if (host === null) await startHost();
        await respawn;
        const bus = await nats.connect();
        const sender = createSystem({ name: job, log: () => {} });
        await attachBus(sender, bus, { events: false });
        const ref = await durableRef<{ crash: Crash; file: string }>(sender, "ledger");
        const ids: string[] = [];
        const player = playFaults(schedule, { processes: { consumer: () => host?.proc.pid ?? null }, nats: nats.server });
        try {
          for (const batch of traffic) {
            await new Promise((r) => setTimeout(r, batch.gapMs));
            for (const crash of batch.crashes) {
              const id = `${tag}-m${ids.length}`;
              ids.push(id);
              // Re-send the same id until stored (the duplicate window keeps it once).
              await waitUntil(() => ref.send({ crash, file }, { id, timeoutMs: 1000 }).then(() => true), {
                what: `message ${id} to be stored`,
                timeoutMs: 20_000,
                intervalMs: 50,
              });
            }
          }
          await player.done;
          await player.stop();
          while (respawn !== null) {
            const r = respawn;
            await r;
            if (respawn === r) respawn = null;
          }
          const jsm = await bus.jsm();
          const stream = jobNames(job).streamMailboxes;
          const lines = () => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0) : []);
          // Every message delivered and acked (nothing pending, nothing awaiting an ack) = every
          // handler finished after its effect. Not "the work queue is empty": after a SIGKILL of
          // nats-server 2.9 a work-queue stream can keep messages its consumer has already acked
          // (below the ack floor, never redelivered), which is the server's leftover, not a lost ack.
          const consumerState = async () => {
            const out: { pending: number; ackPending: number; delivered: unknown; ackFloor: unknown; redelivered: number; waiting: number }[] = [];
            for await (const c of jsm.consumers.list(stream))
              out.push({ pending: c.num_pending, ackPending: c.num_ack_pending, delivered: c.delivered, ackFloor: c.ack_floor, redelivered: c.num_redelivered, waiting: c.num_waiting });
            return out;
          };
          // Or, where the server still counts a message awaiting its ack: the consumer process has
          // run no handler and received nothing for QUIET_MS (three ack waits), every delivery it
          // got acked or naked. A message the server would still deliver comes within one ack wait
          // (a nak's redelivery within 20 ms), so it would have shown; what is left is nats-server
          // 2.9's pending entry that is never redelivered after restarts (docs/reliability.md,
          // "Fresh-clone CI observations": the consumer's sequences show no delivery for 30 s).
          const QUIET_MS = 3 * hostCfg().ledger.ackWaitMs;
          let quietSince = { key: "", at: Date.now() };
          const consumerQuiet = (): boolean => {
            // the host prints its mailbox's stats every 500 ms: the last whole line of them, from the output's tail
            const line = (host?.output() ?? "").slice(-4096).split("\n").slice(0, -1).findLast((l) => l.startsWith("durable {"));
            if (!line) return false;
            const st = JSON.parse(line.slice("durable ".length)) as DurableStats;
            const key = `${host?.proc.pid}:${st.delivered}`;
            if (key !== quietSince.key) quietSince = { key, at: Date.now() };
            const settled = st.running === 0 && st.delivered === st.acked + st.naked + st.skipped + st.malformed;
            return settled && Date.now() - quietSince.at >= QUIET_MS;
          };
          let last = "";
          await waitUntil(
            async () => {
              const cs = await consumerState();
              last = JSON.stringify({ consumers: cs, stream: (await jsm.streams.info(stream)).state });
              const drained = cs.length > 0 && cs.every((c) => c.pending === 0) && lines().length >= ids.length;
              if (!drained) return false;
              if (cs.every((c) => c.ackPending === 0)) return true;
              if (!consumerQuiet()) return false;
              serverHeld++;
              return true;
            },
            {
              what: "every message delivered and acked",
              timeoutMs: 30_000,
              diagnostics: () => `effects: ${lines().length}/${ids.length}\n${last}\nfaults: ${JSON.stringify(player.applied())}\nhost output (its last lines):\n${(host?.output() ?? "").split("\n").slice(-4).join("\n")}`,
            },
          );
          const counts = new Map<string, number>();
          for (const l of lines()) counts.set(l, (counts.get(l) ?? 0) + 1);
          const missing = ids.filter((id) => !counts.has(id));
          const twice = [...counts].filter(([, c]) => c !== 1);
          expect({ missing, twice }).toEqual({ missing: [], twice: [] });
          expect(counts.size).toBe(ids.length);
        } finally {
          await player.stop();
          await sender.stop();
        }
      },
      // A failing schedule is shrunk until the time limit, then reported with its seed and path (the
      // last schedule started may still wait its 30 s for the mailbox to drain, and sends retry 20 s).
      { runs: RUNS, with: trafficArb, label: "durable mailbox: consumer SIGKILL/SIGSTOP and nats-server restarts", timeLimitMs: RUNS * 10_000 },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} with traffic ${JSON.stringify(result.drawn)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  }, 30_000 + RUNS * 15000);
});
