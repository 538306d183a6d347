// Property (ooze/testing on a NATS cluster): a small training job started by runJobSchedule
// (`ooze train`'s actors in this process, a tiny `ooze serve` engine behind a recording proxy) on a
// real 3-server nats cluster with 3 stream replicas, under schedules of SIGKILL + restart of one
// named server (`nats-restart` with `server`) and crashes of single actors through the runtime's
// supervision. The job's invariants (every sample once, no sample lost to a failed episode,
// versions only increase, no batch beyond staleness 0, every trained token one the engine sampled,
// no actor left crashed, finished within 180 s: a job whose stream leader is killed has taken up to
// 114 s while JetStream re-elects) and every step recorded once.
// Runs: propertyRuns(2).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseTopology } from "../../src/topology/load.ts";
import { checkSchedules, propertyRuns, readJsonLines, runJobSchedule, startTestNatsCluster, type MetricsLine, type TestNatsCluster } from "../harness/index.ts";

const RUNS = propertyRuns(2);
const STEPS = 6;
const root = mkdtempSync(join(tmpdir(), "ooze-cluster-schedules-"));
let cluster: TestNatsCluster;

beforeAll(async () => {
  cluster = await startTestNatsCluster();
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  rmSync(root, { recursive: true, force: true });
});

const topology = parseTopology(
  [
    "name: cluster-schedules",
    "actors: [{ name: trainer, kind: train.trainer }]",
    "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
    `train: { task: addition, taskConfig: { digits: 1 }, preset: tiny, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2, steps: ${STEPS} }`,
  ].join("\n"),
);

describe("a training job on a 3-server NATS cluster under fault schedules (ooze/testing)", () => {
  it("every invariant holds when one server at a time is killed and restarted and single actors crash", { timeout: 60_000 + RUNS * 260_000 }, async () => {
    let n = 0;
    const result = await checkSchedules(
      // One server down at a time keeps a quorum of the 3 replicas: at most one nats-restart per schedule.
      { kinds: ["nats-restart", "actor"], natsServers: ["s0", "s1", "s2"], actors: ["rollout", "buffer", "trainer", "weight-sync"], horizonMs: 2_500, maxForMs: 1_500, maxFaults: 3 },
      async (schedule) => {
        const restarts = schedule.filter((f) => f.kind === "nats-restart");
        const plan = restarts.length > 1 ? schedule.filter((f) => f.kind !== "nats-restart" || f === restarts[0]) : schedule;
        const out = join(root, `run-${n++}`);
        const report = await runJobSchedule({ topology, out, nats: { cluster, replicas: 3 }, deadlineMs: 180_000 }, plan);
        const bad = report.verdicts.filter((v) => !v.ok);
        expect(bad, `schedule ${JSON.stringify(plan)}\n${report.logs.job?.split("\n").slice(-30).join("\n")}`).toEqual([]);
        expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
      },
      { runs: RUNS, label: "job on a 3-server NATS cluster: one server killed/restarted, actor crashes" },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });
});
