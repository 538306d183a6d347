// ooze train end to end on the tiny preset: the CLI writes metrics.jsonl with every field, the reward
// chart and checkpoints, with increasing weight versions; a SIGKILLed trainer worker is restarted and
// the run finishes with every sample index trained or dropped exactly once; --resume continues at the
// same data position; async mode trains one step off-policy.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { trainSchema, enginesSchema } from "../../actors/loop/config.ts";
import { runTraining, type BatchRecord } from "../../actors/loop/loop.ts";
import { readJsonl, type StepMetrics } from "../../actors/loop/metrics.ts";

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
});
