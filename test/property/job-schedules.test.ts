// Property (ooze/testing on whole training jobs): `ooze fuzz`'s runner (app/job/fuzz-job.ts) runs a
// quickstart-actors-sized job — the loop's actors on a fresh nats-server behind a cut proxy, a real
// `ooze serve` engine behind a fault proxy, the trainer's worker process — under schedules of
// SIGKILL / SIGSTOP of the trainer worker, nats-server restarts, cuts of the job's NATS link,
// engine faults and crashes of single actors (rollout, buffer, trainer, weight-sync, fleet) through
// the runtime's supervision, in sync and fully_async mode. Every sample is trained, dropped,
// requeued or pending exactly once, no sample is lost to a failed episode, versions only increase,
// no batch is beyond the mode's staleness bound, and the job finishes within its deadline.
// Runs: propertyRuns(2) per mode (a schedule takes seconds; these are the suite's few job-level ones).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { fuzzSummary, runFuzz } from "../../app/job/fuzz-job.ts";
import { propertyRuns } from "../harness/index.ts";

const RUNS = propertyRuns(2);
const dir = mkdtempSync(join(tmpdir(), "ooze-job-schedules-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function topology(mode: "sync" | "fully_async"): string {
  const file = join(dir, `${mode}.yaml`);
  writeFileSync(
    file,
    [
      `name: job-schedules-${mode}`,
      "actors: [{ name: trainer, kind: train.trainer }]",
      "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
      `train: { mode: ${mode}, task: addition, taskConfig: { digits: 1 }, preset: tiny, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 }`,
    ].join("\n"),
  );
  return file;
}

describe("training jobs under fault schedules (ooze/testing)", () => {
  for (const mode of ["sync", "fully_async"] as const) {
    it(`${mode}: every invariant holds under kill, pause, cut, engine and actor faults`, { timeout: 60_000 + RUNS * 120_000 }, async () => {
      const lines: string[] = [];
      const r = await runFuzz({
        file: topology(mode),
        runs: RUNS,
        faults: ["kill", "pause", "nats-restart", "cut", "engine", "actor"],
        steps: 8,
        horizonMs: 1_500,
        deadlineMs: 90_000,
        out: join(dir, mode),
        shrinkRuns: 2,
        label: `job (${mode}): trainer-worker kill/pause, nats-server restart, cut, engine, actor crash`,
        log: (l) => lines.push(l),
      });
      expect(r.ok, `${fuzzSummary(r)}\n${lines.join("\n")}`).toBe(true);
      expect(r.runs).toBe(RUNS);
    });
  }
});
