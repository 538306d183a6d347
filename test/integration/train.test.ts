// ooze train end to end on the tiny preset: the CLI writes metrics.jsonl with every field, the reward
// chart and checkpoints, with increasing weight versions; a SIGKILLed trainer worker is restarted and
// the run finishes with every sample index trained or dropped exactly once; --resume continues at the
// same data position; async mode trains one step off-policy; fully_async mode keeps generating through
// weight updates (partial rollout), never trains beyond the staleness bound, survives a killed
// trainer worker and engine, and resumes after a crash by generating its in-flight groups again.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { trainSchema, enginesSchema } from "../../actors/loop/config.ts";
import { runTraining, type BatchRecord } from "../../actors/loop/loop.ts";
import { readJsonl, type StepMetrics } from "../../actors/loop/metrics.ts";
import type { RunState } from "../../actors/loop/state.ts";
import type { TrainSample } from "../../actors/buffer/groups.ts";

const run = promisify(execFile);
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "ooze-train-"));
  dirs.push(d);
  return d;
};
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const tiny = { task: "addition", taskConfig: { digits: 1 }, preset: "tiny", promptsPerStep: 3, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 };
const engines = enginesSchema.parse({ count: 1, maxRunning: 32, cacheTokens: 4096 });

/** Every sample index from 0 to n-1 appears exactly once over trained ∪ dropped. */
function checkAccounting(records: BatchRecord[], n: number) {
  const seen = records.flatMap((r) => [...r.trained, ...r.dropped]).sort((a, b) => a - b);
  expect(seen).toEqual(Array.from({ length: n }, (_, i) => i));
}

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const byNumber = (a: number, b: number) => a - b;

/**
 * fully_async: every sample index below the stream's position is trained, dropped, requeued, or
 * pending in the latest checkpoint, exactly once; and every prompt index is trained, dropped or
 * pending, exactly once (a requeued prompt is generated again, then trained once).
 */
function checkFullyAsyncAccounting(out: string) {
  const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
  const latest = JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8")) as RunState;
  const pending = latest.pending ?? [];
  const seen = [...records.flatMap((r) => [...r.trained, ...r.dropped, ...(r.requeued ?? [])]), ...pending.flatMap((g) => range(g.firstSample, g.count))];
  expect(seen.sort(byNumber)).toEqual(range(0, latest.nextSample));
  const prompts = [...records.flatMap((r) => [...(r.trainedPrompts ?? []), ...(r.droppedPrompts ?? [])]), ...pending.map((g) => g.prompt)];
  expect(prompts.sort(byNumber)).toEqual(range(0, latest.nextPrompt));
  return { records, latest };
}

/** Each trained sample's spans are in order, cover its model tokens, and lie within the staleness bound. */
function checkSpans(batch: readonly TrainSample[], trainerVersion: number, bound: number): number {
  let partial = 0;
  for (const s of batch) {
    const vs = s.weightVersions.map((sp) => Number(sp.version));
    expect(vs.length).toBeGreaterThan(0);
    for (let i = 1; i < vs.length; i++) expect(vs[i]!).toBeGreaterThanOrEqual(vs[i - 1]!);
    expect(Math.min(...vs)).toBeGreaterThanOrEqual(trainerVersion - bound);
    expect(Math.max(...vs)).toBeLessThanOrEqual(trainerVersion);
    const modelTokens = s.lossMask.reduce((n, m) => n + m, 0);
    expect(s.weightVersions.reduce((n, sp) => n + sp.end - sp.start, 0)).toBe(modelTokens);
    if (new Set(vs).size > 1) partial++;
  }
  return partial;
}

describe("ooze train", () => {
  it("CLI: a tiny run writes metrics with every field, the chart, checkpoints; versions increase", async () => {
    const dir = tmp();
    const topo = join(dir, "t.yaml");
    writeFileSync(
      topo,
      [
        "name: tiny-train",
        "actors: [{ name: trainer, kind: train.trainer }]",
        "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
        "train:",
        ...Object.entries({ ...tiny, steps: 3 }).map(([k, v]) => `  ${k}: ${JSON.stringify(v)}`),
      ].join("\n"),
    );
    const out = join(dir, "run");
    const { stdout } = await run(process.execPath, ["bin/ooze.mjs", "train", topo, "--out", out, "--quiet"], { timeout: 60_000 });
    expect(stdout).toMatch(/ooze train: 3 steps, 36 samples/);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.step)).toEqual([1, 2, 3]);
    for (const k of ["step", "reward_mean", "samples", "tokens", "seconds", "weight_version", "staleness_max", "cache_hit_rate", "loss", "kl", "entropy", "clipfrac"])
      for (const m of ms) expect(typeof (m as unknown as Record<string, unknown>)[k], k).toBe("number");
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    expect(ms.every((m) => m.samples === 12 && m.staleness_max === 0)).toBe(true);
    expect(readFileSync(join(out, "reward.svg"), "utf8")).toMatch(/^<svg[\s\S]*<path d="M/);
    expect(existsSync(join(out, "checkpoints", "step-000002", "model.safetensors"))).toBe(true);
    expect(existsSync(join(out, "checkpoints", "step-000003", "optimizer.bin"))).toBe(true);
    const latest = JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8"));
    expect(latest).toMatchObject({ step: 3, nextPrompt: 9, nextSample: 36, weightVersion: 3 });
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);
    // a bad override is refused before anything starts, naming the flag
    await expect(run(process.execPath, ["bin/ooze.mjs", "train", topo, "--out", join(dir, "bad"), "--seed", "1.5"], { timeout: 30_000 })).rejects.toThrow(/--seed must be an integer/);
    expect(existsSync(join(dir, "bad"))).toBe(false);
  }, 60_000);

  it("a SIGKILLed trainer worker restarts; no sample is lost or trained twice; --resume continues the data stream", async () => {
    const out = join(tmp(), "run");
    let killed: number | null = null;
    const train = trainSchema.parse({ ...tiny, steps: 3 });
    const s1 = await runTraining({
      out, train, engines, baseDir: process.cwd(),
      hooks: {
        beforeTrain: (step, trainer) => {
          if (step === 2 && trainer.pid !== null) {
            killed = trainer.pid;
            process.kill(trainer.pid, "SIGKILL");
          }
        },
      },
    });
    expect(killed).not.toBeNull();
    expect(s1.steps).toBe(3);
    expect(s1.trainerRestarts).toBeGreaterThanOrEqual(1);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    expect(ms[1]!.trainer_restarts).toBeGreaterThanOrEqual(1);
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);

    // resume to 5 steps: same data stream, one record per step
    const s2 = await runTraining({ out, train: { ...train, steps: 5 }, engines, baseDir: process.cwd(), resume: true });
    expect(s2.steps).toBe(5);
    const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
    expect(records.map((r) => r.step)).toEqual([1, 2, 3, 4, 5]);
    checkAccounting(records, 60);
    expect(readJsonl<StepMetrics>(join(out, "metrics.jsonl")).map((m) => m.weight_version)).toEqual([1, 2, 3, 4, 5]);
  }, 60_000);

  it("an embedded engine SIGKILLed mid-run is replaced; the run finishes with no failed, lost or duplicated sample", async () => {
    const out = join(tmp(), "run");
    let enginePid: number | null = null;
    const restarts: string[] = [];
    const s = await runTraining({
      out, train: trainSchema.parse({ ...tiny, steps: 3 }), engines, baseDir: process.cwd(),
      hooks: {
        onStart: (info) => (enginePid = info.enginePids[0] ?? null),
        beforeTrain: (step) => {
          if (step === 1 && enginePid !== null) process.kill(enginePid, "SIGKILL");
        },
        onEngineRestart: (from, to) => restarts.push(`${from} -> ${to}`),
      },
    });
    expect(s.steps).toBe(3);
    expect(restarts).toHaveLength(1);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.failed)).toEqual([0, 0, 0]);
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
    expect(records.flatMap((r) => r.dropped)).toEqual([]);
    checkAccounting(records, 36);
  }, 60_000);

  it("async mode: generation one step off-policy (staleness 1 after the first step), every sample accounted for", async () => {
    const out = join(tmp(), "run");
    const s = await runTraining({ out, train: trainSchema.parse({ ...tiny, steps: 3, mode: "async" }), engines, baseDir: process.cwd() });
    expect(s.steps).toBe(3);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.staleness_max)).toEqual([0, 1, 1]);
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);
  }, 60_000);

  it("delta weight sync: each new version reaches the engine as a lossless delta against the previous one", async () => {
    const out = join(tmp(), "run");
    const lines: string[] = [];
    const s = await runTraining({
      out, train: trainSchema.parse({ ...tiny, steps: 3, weightSync: "delta" }), engines, baseDir: process.cwd(),
      hooks: { log: (l) => lines.push(l) },
    });
    expect(s.steps).toBe(3);
    expect(s.weightVersion).toBe(3);
    // the newest deltas are kept (v1-v2, v2-v3); none fell back to a full load
    const files = readdirSync(join(out, "weight-sync")).filter((f) => f.endsWith(".ooze-delta")).sort();
    expect(files).toEqual(["v1-v2.ooze-delta", "v2-v3.ooze-delta"]);
    expect(lines.filter((l) => /fall/i.test(l))).toEqual([]);
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);
  }, 60_000);

  it("fully_async: generation goes on through weight updates; a SIGKILLed trainer worker and engine lose and duplicate nothing; staleness bounded", async () => {
    const out = join(tmp(), "run");
    let enginePid: number | null = null;
    let trainerKilled = false;
    const restarts: string[] = [];
    let partial = 0;
    const s = await runTraining({
      out, train: trainSchema.parse({ ...tiny, steps: 4, mode: "fully_async" }), engines, baseDir: process.cwd(),
      hooks: {
        onStart: (info) => (enginePid = info.enginePids[0] ?? null),
        beforeTrain: (step, trainer, batch) => {
          partial += checkSpans(batch, trainer.version, 2);
          if (step === 1 && enginePid !== null) process.kill(enginePid, "SIGKILL");
          if (step === 2 && trainer.pid !== null) {
            trainerKilled = true;
            process.kill(trainer.pid, "SIGKILL");
          }
        },
        onEngineRestart: (from, to) => restarts.push(`${from} -> ${to}`),
      },
    });
    expect(s.steps).toBe(4);
    expect(trainerKilled).toBe(true);
    expect(s.trainerRestarts).toBeGreaterThanOrEqual(1);
    expect(restarts).toHaveLength(1);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3, 4]);
    expect(ms.map((m) => m.failed)).toEqual([0, 0, 0, 0]);
    for (const m of ms) expect(m.staleness_max).toBeLessThanOrEqual(2);
    expect(ms.reduce((n, m) => n + m.partial_samples, 0)).toBe(partial);
    const { records, latest } = checkFullyAsyncAccounting(out);
    expect(records.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    expect(records.every((r) => r.trained.length === 12)).toBe(true);
    expect(latest.pending!.length).toBeGreaterThan(0); // the look-ahead was in flight at the end
  }, 60_000);

  it("fully_async: a run that crashes after a checkpoint resumes there, generating the groups then in flight again", async () => {
    const out = join(tmp(), "run");
    const train = trainSchema.parse({ ...tiny, steps: 4, mode: "fully_async" });
    const crash = runTraining({
      out, train, engines, baseDir: process.cwd(),
      hooks: {
        onStep: (m) => {
          if (m.step === 3) throw new Error("crash after step 3");
        },
      },
    });
    await expect(crash).rejects.toThrow(/crash after step 3/);
    const before = JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8")) as RunState;
    expect(before.step).toBe(2);
    expect(before.pending!.length).toBeGreaterThan(0);
    expect(readJsonl<BatchRecord>(join(out, "batches.jsonl")).map((r) => r.step)).toEqual([1, 2, 3]);

    const s = await runTraining({ out, train: { ...train, steps: 5 }, engines, baseDir: process.cwd(), resume: true });
    expect(s.steps).toBe(5);
    const { records } = checkFullyAsyncAccounting(out);
    expect(records.map((r) => r.step)).toEqual([1, 2, 3, 4, 5]);
    // The groups in flight at the checkpoint were trained after the resume, under their sample indices.
    const trainedAfter = new Set(records.filter((r) => r.step > 2).flatMap((r) => r.trainedPrompts ?? []));
    expect(before.pending!.some((g) => trainedAfter.has(g.prompt))).toBe(true);
    expect(readJsonl<StepMetrics>(join(out, "metrics.jsonl")).map((m) => m.weight_version)).toEqual([1, 2, 3, 4, 5]);
  }, 60_000);

  it("fully_async with staleness bound 0: no trained token is older than the trainer; stale groups are requeued, never trained or lost", async () => {
    const out = join(tmp(), "run");
    const s = await runTraining({ out, train: trainSchema.parse({ ...tiny, steps: 4, mode: "fully_async", maxStaleness: 0 }), engines, baseDir: process.cwd() });
    expect(s.steps).toBe(4);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.staleness_max)).toEqual([0, 0, 0, 0]);
    expect(ms.map((m) => m.partial_samples)).toEqual([0, 0, 0, 0]);
    checkFullyAsyncAccounting(out);
  }, 60_000);

  it("fully_async with the dynamic filter: dropped groups are recorded (samples and prompts) and never trained", async () => {
    const out = join(tmp(), "run");
    const s = await runTraining({ out, train: trainSchema.parse({ ...tiny, steps: 3, mode: "fully_async", dropZeroVariance: true }), engines, baseDir: process.cwd() });
    expect(s.steps).toBe(3);
    const { records } = checkFullyAsyncAccounting(out);
    const droppedPrompts = new Set(records.flatMap((r) => r.droppedPrompts ?? []));
    for (const r of records) for (const p of r.trainedPrompts ?? []) expect(droppedPrompts.has(p)).toBe(false);
  }, 60_000);
});
