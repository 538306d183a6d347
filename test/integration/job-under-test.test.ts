// ooze/testing's public job under test, on real processes: startJobUnderTest starts a topology's
// job on its own nats-server behind a cut proxy, its engine as `ooze serve` behind a recording fault
// proxy, and names the targets faults reach; its invariants hold on a run under a schedule, and
// tokensAsSampled breaks when one trained token is changed in the job's record (it compares with
// what the engine really returned). A topology that cannot start fails before anything starts,
// naming the field.
import { readFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseTopology } from "../../src/topology/load.ts";
import { checkInvariants, readJsonLines, waitUntil, tokensAsSampled, type MetricsLine, type SampleTokensLine } from "../../src/testing/index.ts";
import { runJobSchedule, startJobUnderTest } from "../../app/job/testing.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-job-under-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const topology = parseTopology(
  [
    "name: job-under-test",
    "actors: [{ name: trainer, kind: train.trainer }]",
    "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
    "train: { mode: fully_async, task: guess-number, taskConfig: { max: 7, maxTurns: 3, replies: interval }, preset: tiny, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2, steps: 4 }",
  ].join("\n"),
);

describe("startJobUnderTest / runJobSchedule (ooze/testing)", () => {
  it("starts the job with its targets; its invariants hold, and a changed trained token breaks tokensAsSampled", { timeout: 120_000 }, async () => {
    const job = await startJobUnderTest({ topology, out: join(dir, "a"), deadlineMs: 90_000 });
    try {
      expect(Object.keys(job.targets.engines ?? {})).toEqual(["engine-0"]);
      expect(Object.keys(job.targets.links ?? {})).toEqual(["job-nats"]);
      expect(Object.keys(job.targets.processes ?? {})).toEqual(["trainer-worker"]);
      expect(Object.keys(job.targets.actors ?? {})).toEqual(["rollout", "buffer", "trainer", "weight-sync", "fleet"]);
      expect(job.space(["engine", "nats-restart"], { horizonMs: 1_000 })).toMatchObject({ engines: ["engine-0"], nats: true, maxForMs: 500 });
      await job.started;
      expect(await waitUntil(() => job.targets.processes!["trainer-worker"]!(), { timeoutMs: 30_000, what: "the trainer's worker pid" })).toBeGreaterThan(0);
      const outcome = await job.outcome;
      expect(outcome).toMatchObject({ finished: true, error: null });
      const verdicts = await checkInvariants(outcome, job.invariants);
      expect(verdicts.filter((v) => !v.ok), JSON.stringify(verdicts)).toEqual([]);
      expect(verdicts.map((v) => v.name)).toContain("every trained token is one an engine sampled");
      // multi-turn: the environment's replies sit between the model's turns
      const samples = readJsonLines<SampleTokensLine>(join(outcome.dir, "samples.jsonl"));
      expect(samples.length).toBe(32);
      const multi = samples.find((s) => s.sampled.length > 1)!;
      expect(multi, "a sample of more than one turn").toBeDefined();
      // One token of a later turn changed in the record: no engine sampled it in that context.
      const [s] = multi.sampled[1]!;
      const changed = samples.map((x) => (x === multi ? { ...x, tokens: x.tokens.map((t, i) => (i === s ? (t + 1) % 256 : t)) } : x));
      writeFileSync(join(outcome.dir, "samples.jsonl"), changed.map((x) => `${JSON.stringify(x)}\n`).join(""));
      const broken = await tokensAsSampled().check(outcome);
      expect(broken.ok).toBe(false);
      expect(broken.detail).toContain(`sample ${multi.index}: model tokens ${s}..`);
      expect(broken.detail).toContain(`from position ${s}`);
    } finally {
      await job.close();
    }
  });

  it("runs one schedule and reports its verdicts, the faults injected and the processes' logs", { timeout: 120_000 }, async () => {
    const report = await runJobSchedule({ topology, out: join(dir, "b"), train: { mode: "sync" }, deadlineMs: 90_000 }, [
      { kind: "engine", engine: "engine-0", fault: { kind: "truncated-body", rate: 0.5 }, at: 0, forMs: 1_000 },
      { kind: "actor", target: "rollout", at: 200 },
    ]);
    expect(report.verdicts.filter((v) => !v.ok), JSON.stringify(report.verdicts)).toEqual([]);
    expect(report.verdicts.map((v) => v.name)).toContain("no batch beyond staleness 0");
    expect(report.applied.length).toBeGreaterThan(0);
    expect(Object.keys(report.logs).sort()).toEqual(["engine-0", "job", "nats-server"]);
    expect(readJsonLines<MetricsLine>(join(dir, "b", "metrics.jsonl")).length).toBe(4);
  });

  it("with no fault, no engine leaves routing: the job's first update (from the engines' own 'default' to 0) is no restart", { timeout: 120_000 }, async () => {
    const report = await runJobSchedule({ topology, out: join(dir, "e"), train: { mode: "sync", steps: 2 }, deadlineMs: 90_000 }, []);
    expect(report.verdicts.filter((v) => !v.ok), JSON.stringify(report.verdicts)).toEqual([]);
    const job = Array.isArray(report.logs.job) ? report.logs.job.join("\n") : String(report.logs.job);
    expect(job).toMatch(/weight version default/); // the engine joined on its own label
    expect(job).not.toMatch(/left routing|re-dispatching|restarted on its initial weights/);
  });

  it("a topology that cannot start fails before anything starts, naming the field; so does a schedule naming a missing target", async () => {
    await expect(startJobUnderTest({ topology, out: join(dir, "c"), train: { promptsPerStep: 0 }, deadlineMs: 10_000 })).rejects.toThrow(/train: .*promptsPerStep/);
    await expect(runJobSchedule({ topology, out: join(dir, "d"), deadlineMs: 10_000 }, [{ kind: "engine", engine: "engine-7", fault: { kind: "hang" }, at: 0, forMs: 10 }])).rejects.toThrow(/engine-7/);
    expect(() => readFileSync(join(dir, "d", "metrics.jsonl"))).toThrow(); // no job ran
  });
});
