// Property (ooze/testing across hosts): a fully_async training job on two hosts in separate Linux
// network namespaces (rollout; learner with the fleet, buffer, trainer and weight-sync), each
// `ooze node` in its own directory, under drawn schedules of whole-host faults: a host's node
// SIGKILLed (a host lost: the test, standing for the host's service manager, starts a new node in its
// place) and a host cut off the network and healed (its link down). The job finishes within its
// deadline and every sample is trained or dropped exactly once, versions only increase, no batch is
// beyond the staleness bound and no sample is lost to a failed episode. Skipped, with the reason,
// where namespaces cannot be made (not root, no iproute2). Runs: propertyRuns(2).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import {
  assertInvariants,
  checkSchedules,
  everySampleOnce,
  finishesWithin,
  noFailedSamples,
  playFaults,
  propertyRuns,
  readJsonLines,
  stalenessWithin,
  startTestNats,
  versionsIncrease,
  waitUntil,
  withDeadline,
  type FaultPlayer,
  type MetricsLine,
} from "../harness/index.ts";
import { createTestNetwork, namespacedTrainTopology, netnsUnavailable, spawnLogged, type LoggedProcess, type TestNetwork } from "../harness/netns.ts";

const why = netnsUnavailable();
if (why) console.warn(`host-schedules.test.ts skipped: ${why}`);
const RUNS = propertyRuns(2);
const STEPS = 16;
const DEADLINE_MS = 180_000;
const OOZE = resolve("bin/ooze.mjs");
const HOSTS = ["rollout", "learner"] as const;
type Host = (typeof HOSTS)[number];

const dirs: string[] = [];
const tally = { schedules: 0, faultsInjected: 0, nodesReplaced: 0 };
afterAll(() => void process.stdout.write(`host schedules: ${tally.schedules} schedules, ${tally.faultsInjected} faults injected, ${tally.nodesReplaced} nodes replaced\n`));
const live = new Set<LoggedProcess>();
let net: TestNetwork | null = null;
let server: NatsServerHandle | null = null;
beforeAll(async () => {
  if (why) return;
  net = createTestNetwork(HOSTS);
  server = await startTestNats({ host: net.gateway });
});
afterAll(async () => {
  for (const p of live) p.child.kill("SIGKILL");
  await server?.stop();
  net?.destroy();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

const tmp = (name: string) => {
  const d = mkdtempSync(join(tmpdir(), `ooze-host-schedules-${name}-`));
  dirs.push(d);
  return d;
};

describe.skipIf(why !== null)("a training job across namespaced hosts under host faults (ooze/testing)", () => {
  it("every invariant holds when hosts are killed and replaced, or cut off and healed", { timeout: 60_000 + RUNS * (DEADLINE_MS + 30_000) }, async () => {
    let n = 0;
    const result = await checkSchedules(
      { kinds: ["kill", "cut"], processes: [...HOSTS], signals: ["SIGKILL"], links: [...HOSTS], horizonMs: 2_000, maxForMs: 1_500, maxFaults: 3 },
      async (schedule) => {
        const job = `host-schedules-${process.pid}-${n++}`;
        const out = tmp("out");
        const url = `nats://${server!.token}@${net!.gateway}:${server!.port}`;
        const topology = namespacedTrainTopology(job, net!.hosts.find((h) => h.name === "learner")!.address, out, STEPS);
        const file = (d: string) => {
          writeFileSync(join(d, "train.yaml"), topology);
          return join(d, "train.yaml");
        };
        const upDir = tmp("up");
        const up = spawnLogged([process.execPath, OOZE, "up", file(upDir), "--nats", url, "--job", job], upDir);
        live.add(up);
        // Each host's node, started again when it dies by a signal (its service manager); an exit is the job's end.
        const nodes = {} as Record<Host, LoggedProcess>;
        const logs: Record<Host, string[]> = { rollout: [], learner: [] };
        let ended = false;
        const startNode = (h: Host) => {
          const d = tmp(h);
          const p = spawnLogged(net!.exec(h, [process.execPath, OOZE, "node", "--nats", url, "--job", job, "--topology", file(d), "--host", h]), d);
          live.add(p);
          nodes[h] = p;
          void p.exited.then(() => {
            live.delete(p);
            logs[h].push(p.log().slice(-3000));
            if (!ended && p.child.signalCode !== null && nodes[h] === p) {
              tally.nodesReplaced++;
              startNode(h);
            }
          });
        };
        HOSTS.forEach(startNode);
        const steps = () => readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).length;
        const diagnostics = () =>
          `schedule ${JSON.stringify(schedule)}\nup:\n${up.log().slice(-1500)}\n${HOSTS.map((h) => `${h} (earlier nodes, then now):\n${[...logs[h], nodes[h].log().slice(-3000)].join("\n--- new node ---\n")}`).join("\n")}`;
        let player: FaultPlayer | null = null;
        const t0 = Date.now();
        try {
          await waitUntil(() => up.log().includes("all 2 node(s) running"), { timeoutMs: 60_000, what: "both namespaced nodes running", diagnostics });
          player = playFaults(schedule, {
            processes: Object.fromEntries(HOSTS.map((h) => [h, () => nodes[h].child.pid ?? null])),
            links: Object.fromEntries(HOSTS.map((h) => [h, { cut: () => net!.cut(h), heal: () => net!.heal(h) }])),
          });
          const exited = (p: LoggedProcess) => p.child.exitCode !== null || p.child.signalCode !== null;
          await waitUntil(() => steps() >= STEPS && HOSTS.every((h) => exited(nodes[h]) && nodes[h].child.exitCode === 0), {
            timeoutMs: DEADLINE_MS,
            what: "the job to finish and stop both nodes",
            diagnostics,
          });
          ended = true;
        } finally {
          ended = true;
          const applied = (await (player as FaultPlayer | null)?.stop()) ?? [];
          tally.schedules++;
          tally.faultsInjected += new Set(applied.map((a) => a.index)).size;
          for (const h of HOSTS) if (nodes[h].child.exitCode === null) nodes[h].child.kill("SIGKILL");
          up.child.kill("SIGTERM");
          await withDeadline(up.exited, 30_000, "ooze up to stop").catch(() => up.child.kill("SIGKILL"));
          live.delete(up);
        }
        await assertInvariants(
          { dir: out, finished: true, durationMs: Date.now() - t0 },
          [everySampleOnce, versionsIncrease, stalenessWithin(2), noFailedSamples, finishesWithin(DEADLINE_MS)],
          diagnostics(),
        );
        expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
      },
      { runs: RUNS, label: "job across namespaced hosts: host SIGKILLed and replaced, host cut off and healed", timeLimitMs: RUNS * (DEADLINE_MS + 30_000) - DEADLINE_MS },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });
});
