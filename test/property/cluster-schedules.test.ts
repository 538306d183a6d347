// Property (ooze/testing on a NATS cluster): a small training job (`ooze train`'s actors in this
// process, an embedded tiny engine) on a real 3-server nats cluster with 3 stream replicas, under
// schedules of SIGKILL + restart of one named server (`nats-restart` with `server`) and crashes of
// single actors through the runtime's supervision. Every sample once, versions only increase, no
// batch beyond staleness 0 (sync), no sample lost to a failed episode, every step recorded once.
// Runs: propertyRuns(2).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { enginesSchema, trainSchema } from "../../actors/loop/config.ts";
import { runTrainJob } from "../../src/cli/train-job.ts";
import { parseTopology } from "../../src/topology/load.ts";
import {
  assertInvariants,
  checkSchedules,
  everySampleOnce,
  noFailedSamples,
  playFaults,
  propertyRuns,
  readJsonLines,
  stalenessWithin,
  startTestNatsCluster,
  versionsIncrease,
  withDeadline,
  type FaultPlayer,
  type MetricsLine,
  type TestNatsCluster,
} from "../harness/index.ts";

const RUNS = propertyRuns(2);
const STEPS = 6;
const ACTORS = ["rollout", "buffer", "trainer", "weight-sync"];
const root = mkdtempSync(join(tmpdir(), "ooze-cluster-schedules-"));
let cluster: TestNatsCluster;

beforeAll(async () => {
  cluster = await startTestNatsCluster();
}, 60_000);
afterAll(async () => {
  await cluster?.stop();
  rmSync(root, { recursive: true, force: true });
});

describe("a training job on a 3-server NATS cluster under fault schedules (ooze/testing)", () => {
  it("every invariant holds when one server at a time is killed and restarted and single actors crash", { timeout: 60_000 + RUNS * 150_000 }, async () => {
    let n = 0;
    const topology = parseTopology(["name: cluster-schedules", "actors: [{ name: trainer, kind: train.trainer }]"].join("\n"));
    const result = await checkSchedules(
      // One server down at a time keeps a quorum of the 3 replicas: at most one nats-restart per schedule.
      { kinds: ["nats-restart", "actor"], natsServers: ["s0", "s1", "s2"], actors: ACTORS, horizonMs: 2_500, maxForMs: 1_500, maxFaults: 3 },
      async (schedule) => {
        const restarts = schedule.filter((f) => f.kind === "nats-restart");
        const plan = restarts.length > 1 ? schedule.filter((f) => f.kind !== "nats-restart" || f === restarts[0]) : schedule;
        const out = join(root, `run-${n++}`);
        const lines: string[] = [];
        let player: FaultPlayer | null = null;
        try {
          await cluster.waitJetStream();
          await withDeadline(
            runTrainJob({
              topology,
              train: trainSchema.parse({ task: "addition", taskConfig: { digits: 1 }, preset: "tiny", promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2, steps: STEPS }),
              engines: enginesSchema.parse({ count: 1, maxRunning: 32, cacheTokens: 4096 }),
              out,
              job: `cluster-schedules-${process.pid}-${n}`,
              verbose: true,
              nats: { url: cluster.urls, token: cluster.token, replicas: 3 },
              log: (l) => lines.push(l),
              onStart: (info) => {
                player = playFaults(plan, {
                  natsServers: Object.fromEntries(cluster.servers.map((s, i) => [`s${i}`, s])),
                  actors: Object.fromEntries(ACTORS.map((a) => [a, () => info.crashActor(a)])),
                });
              },
            }),
            120_000,
            `the job under ${JSON.stringify(plan)} to finish; log:\n${lines.slice(-40).join("\n")}`,
          );
        } finally {
          await (player as FaultPlayer | null)?.stop();
        }
        await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, versionsIncrease, stalenessWithin(0), noFailedSamples], `schedule ${JSON.stringify(plan)}\n${lines.slice(-30).join("\n")}`);
        expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
      },
      { runs: RUNS, label: "job on a 3-server NATS cluster: one server killed/restarted, actor crashes" },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });
});
