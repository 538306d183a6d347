// Property (ooze/testing on a NATS cluster): a small training job started by runJobSchedule
// (`ooze train`'s actors in this process, a tiny `ooze serve` engine behind a recording proxy) on a
// real 3-server nats cluster with 3 stream replicas and its routes through cut proxies, under
// schedules of one server's fault at a time — SIGKILL + restart of a named server or of the meta
// leader (`nats-restart` with `server`), or a server partitioned away from the other two and healed
// (`cut` of `partition-sN`: its clients stay connected to it) — and crashes of single actors
// through the runtime's supervision. Then two of the three servers down together and back (no
// quorum: the job waits, then goes on). The job's invariants (every sample once, no sample lost to
// a failed episode, versions only increase, no batch beyond staleness 0, every trained token one
// the engine sampled, no actor left crashed, finished within 180 s) and every step recorded once.
// Runs: propertyRuns(2).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseTopology } from "../../src/topology/load.ts";
import { checkSchedules, parseFaultSchedule, propertyRuns, readJsonLines, runJobSchedule, startTestNatsCluster, type MetricsLine, type TestNatsCluster } from "../harness/index.ts";

const RUNS = propertyRuns(2);
const STEPS = 6;
const DEADLINE_MS = 180_000;
const TIMEOUT_MS = 60_000 + RUNS * 260_000;
const root = mkdtempSync(join(tmpdir(), "ooze-cluster-schedules-"));
let cluster: TestNatsCluster;

beforeAll(async () => {
  cluster = await startTestNatsCluster({ partitionable: true });
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
  it("every invariant holds when one server at a time is killed and restarted, or partitioned and healed, and single actors crash", { timeout: TIMEOUT_MS }, async () => {
    let n = 0;
    const result = await checkSchedules(
      {
        kinds: ["nats-restart", "cut", "actor"],
        natsServers: ["s0", "s1", "s2", "meta-leader"],
        links: Object.keys(cluster.partitions),
        actors: ["rollout", "buffer", "trainer", "weight-sync"],
        horizonMs: 2_500,
        maxForMs: 1_500,
        maxFaults: 3,
      },
      async (schedule) => {
        // One server down or cut off at a time keeps a quorum of the 3 replicas: the first server fault of a schedule is kept.
        const serverFaults = schedule.filter((f) => f.kind === "nats-restart" || f.kind === "cut");
        const plan = serverFaults.length > 1 ? schedule.filter((f) => (f.kind !== "nats-restart" && f.kind !== "cut") || f === serverFaults[0]) : schedule;
        const out = join(root, `run-${n++}`);
        const report = await runJobSchedule({ topology, out, nats: { cluster, replicas: 3 }, deadlineMs: DEADLINE_MS }, plan);
        // the violations as one string: a failing schedule's first line (all checkSchedules reports) names them
        const bad = report.verdicts.filter((v) => !v.ok).map((v) => `${v.name}: ${v.detail ?? ""}`).join("; ");
        expect(bad, `schedule ${JSON.stringify(plan)}\n${report.logs.job?.split("\n").slice(-30).join("\n")}`).toBe("");
        expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
      },
      // a schedule that runs to its deadline is reported, shrunk as far as time allowed, not timed out
      { runs: RUNS, label: "job on a 3-server NATS cluster: one server killed/restarted or partitioned, actor crashes", timeLimitMs: TIMEOUT_MS - DEADLINE_MS - 40_000 },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });

  it("two of the three servers down together, then back: the job waits without a quorum, then goes on, losing nothing", { timeout: 240_000 }, async () => {
    const out = join(root, "two-down");
    const plan = parseFaultSchedule([
      { kind: "nats-restart", server: "s1", at: 1_500, downMs: 6_000 },
      { kind: "nats-restart", server: "s2", at: 1_500, downMs: 6_000 },
    ]);
    const report = await runJobSchedule({ topology, out, nats: { cluster, replicas: 3 }, deadlineMs: 180_000 }, plan);
    expect(report.verdicts.filter((v) => !v.ok).map((v) => `${v.name}: ${v.detail ?? ""}`).join("; "), report.logs.job?.split("\n").slice(-30).join("\n")).toBe("");
    // (the two restarts run at once: in either order)
    expect(report.applied.map((a) => `${a.action} ${a.ok}`).sort()).toEqual(["SIGKILL nats-server s1 true", "SIGKILL nats-server s2 true", "restart nats-server s1 true", "restart nats-server s2 true"]);
    expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
  });
});
