// Loop benchmark (`npm run bench -- loop [--steps N] [--reps R] [--staleness B] [--preset NAME] [--window G] [--explorer K] [--explorer-pairs P]`):
// trained samples/s of `ooze train` — the loop's actors on an embedded NATS JetStream — in sync, async
// (one step off-policy) and fully_async mode (partial rollout, staleness bound B = 2, the mode's
// default) on a workload with heavy-tailed generation lengths, against the ideal overlap bound measured
// in the same run; the length bias of fully_async (mean response tokens of the trained samples against
// sync's, with `lateGroups: wait`, the default, and `requeue`, which never waits for late groups) and
// the samples it generated for nothing (requeued as stale, or launched and still untrained when the
// run ended); fully_async at bound 8 as a variant; and,
// for weight sync, one step's lossless delta against the full checkpoint
// (bench/lib/weight-sync-figures.ts). Progress on stderr; one JSON line last on stdout.
//
// Workload: bench/lib/long-tail-task.ts — prompt i asks for k_i turns of up to 8 tokens, k_i a
// discrete Pareto draw (alpha 1.0, 1 to 16 turns: mean ≈ 3.4, the longest of 8 prompts ≈ 11 on
// average), 8 prompts × 8 samples per step, tiny preset, 1 embedded engine (maxRunning 128). A group's
// oldest token dates from its launch (partial rollout or not), and a 16-turn group at 128 requests in
// flight spans several trainer steps: under a small bound the tail's longest groups would go stale.
// With lateGroups wait (actors/buffer/continuous.ts) batches take the groups in launch order and
// launches stay within the bound's reach, so a long group delays its batch and none goes stale: the
// trained prompts are sync's (a task whose lengths depend on the prompt only gives sync's trained
// length). With lateGroups requeue stale groups are generated again (dropped after 3 tries).
//
// --explorer K: the trainer's explorer files keep K steps (train.explorer.keepSteps; default the
// config's, 20; 0 writes none) in every mode. Without it, each repetition also runs P pairs
// (`--explorer-pairs P`, default 4) of sync runs, one with the default explorer files and one with
// none, in alternating order, and the bench reports sync_explorer_vs_none: the rate with the
// explorer over the rate without, summed over the pairs; and, finer than that ratio's noise,
// sync_explorer_time_share: the explorer writes' own wall time (encoding and writing, the trainer's
// explorer_seconds metric) over the steps' wall time in the runs with them — the most the files can
// cost the loop, since a write entirely on the loop's path would add exactly its time.
//
// Trained samples/s: samples trained in steps 2..N over the wall time from the end of step 1 to the
// end of step N (engine and worker start-up excluded), for every mode.
//
// The bound (`bound`, samples/s) is what perfect overlap of generation and training would give with
// this machine's engine and trainer: min(generation-only rate, training-only rate), i.e. samples /
// max(generation time alone, training time alone), each measured alone in this run:
//   - generation only: the same engine settings and task generate (N+2)·8 groups with the engines
//     kept full (at most `window` groups in flight, as fully_async does); rate = samples of groups
//     9..8N over the time between the 8th and the (8N)th group's completion (start-up and the
//     last groups' tail excluded, like the loop's figure);
//   - training only: the trainer trains N batches of those samples (8 groups each) one after the
//     other; rate = samples of batches 2..N over their time (train step + saving the version, as in
//     the loop).
// fully_async_vs_bound = fully_async / bound; fully_async_vs_sync = fully_async / sync. Every figure is
// the mean over R repetitions (default 2), each of which runs all modes and both bound phases back
// to back; the per-repetition figures are printed too.
//
// CPU (bench/lib/cpu.ts, the whole machine's /proc/stat over each measured window): core-seconds
// per sample and the busy fraction of the cores for every mode and for each half of the bound;
// cpu_bound = cores / (CPU per generated sample + CPU per trained sample, each measured alone) is
// the rate with every core busy doing only that work. Where cpu_bound is below `bound`, the cores,
// not a lack of overlap, cap every mode; a mode's CPU per sample above the two halves' sum is work
// the overlap itself costs (aborted generations prefilled again, requeued groups, loop overhead).
//
// The machine has 2 cores shared by the engine, the trainer worker and this process (HTTP, episodes,
// buffer): every native pool runs one thread (OMP_NUM_THREADS=1, unless set) so an engine and a
// trainer working at once each keep a core, in every mode and in the bound's phases alike. The
// machine's load average before and after is printed too: other processes on the same cores make
// every figure (and the bound, measured at another moment) noisy.
process.env.OMP_NUM_THREADS ??= "1";
import { mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { cpuBetween, machineCpu, type CpuTimes } from "./lib/cpu.ts";
import { weightSyncFigures } from "./lib/weight-sync-figures.ts";
import { GroupBuffer } from "../actors/buffer/groups.ts";
import { enginesSchema, trainSchema, type TrainConfig } from "../actors/protocol/config.ts";
import { FleetGenerator, startEngineProcess } from "../actors/rollout/generator.ts";
import { readJsonl, type BatchRecord, type StepMetrics } from "../actors/protocol/metrics.ts";
import { latestCheckpoint } from "../actors/protocol/state.ts";
import { loadTask } from "../actors/environment/task-loader.ts";
import { rolloutRange } from "../actors/rollout/rollout.ts";
import { runTrainJob } from "../app/job/train-job.ts";
import { loadTopology } from "../src/topology/load.ts";
import { PolicyTrainer, policyTrainerConfig } from "../actors/trainer/policy-trainer.ts";
import type { Sample } from "../src/sample.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const steps = Number(arg("steps", "10"));
const repetitions = Number(arg("reps", "2"));
const staleness = Number(arg("staleness", "2"));
const looseBound = 8;
const preset = arg("preset", "tiny");
const prompts = 8;
const samples = 8;
const maxRunning = 128;
const window = Number(arg("window", String(2 * prompts)));
const explorerSteps = process.argv.includes("--explorer") ? Number(arg("explorer", "20")) : null;
const explorerPairCount = Number(arg("explorer-pairs", "4"));
const task = fileURLToPath(new URL("./lib/long-tail-task.ts", import.meta.url));
const taskConfig = { alpha: 1.0, maxTurns: 16, turnTokens: 8 };
const root = mkdtempSync(join(tmpdir(), "ooze-bench-loop-"));
const say = (s: string) => process.stderr.write(`[bench loop] ${s}\n`);
const engines = enginesSchema.parse({ count: 1, maxRunning, cacheTokens: 65536 });

function trainConfig(mode: TrainConfig["mode"], maxStaleness = staleness): TrainConfig {
  return trainSchema.parse({
    mode, task, taskConfig, preset, steps, promptsPerStep: prompts, samplesPerPrompt: samples, lr: 0.003, checkpointEvery: 1000,
    maxStaleness, maxInflightGroups: window, ...(explorerSteps !== null ? { explorer: { keepSteps: explorerSteps } } : {}),
  });
}

/** Trained samples/s over steps 2..N. */
function rate(ms: StepMetrics[]): number {
  const seconds = ms[ms.length - 1]!.seconds - ms[0]!.seconds;
  return ms.slice(1).reduce((n, m) => n + m.samples, 0) / seconds;
}

/** CPU over a measured window: core-seconds per sample, and the busy fraction of the machine. */
interface CpuUse {
  perSample: number;
  utilisation: number;
}

function cpuUse(c: CpuTimes | null, samples: number): CpuUse {
  return c && c.total > 0 ? { perSample: c.busy / samples, utilisation: c.busy / c.total } : { perSample: NaN, utilisation: NaN };
}

/** The loop's actors as `ooze train` runs them (topologies/quickstart.yaml's roles), with this bench's train: section. */
const loopTopology = loadTopology(fileURLToPath(new URL("../topologies/quickstart.yaml", import.meta.url)));

/** One mode's run through `ooze train`'s actors: trained samples/s over steps 2..N, its metrics, and the CPU it took. */
async function run(mode: TrainConfig["mode"], rep: number, variant: Partial<TrainConfig> = {}): Promise<{ sps: number; out: string; ms: StepMetrics[]; cpu: CpuUse }> {
  const cfg = { ...trainConfig(mode), ...variant };
  const label = `${mode}${mode === "fully_async" ? ` (staleness bound ${cfg.maxStaleness}, lateGroups ${cfg.lateGroups})` : ""}`;
  const out = join(root, `${mode}-${cfg.maxStaleness}-${cfg.lateGroups}-x${cfg.explorer.keepSteps}-${rep}`);
  // the machine's CPU at the end of step 1 and of the last step: the window `rate` measures
  let c1: CpuTimes | null = null, cN: CpuTimes | null = null;
  const onStep = (m: StepMetrics) => {
    if (m.step === 1) c1 = machineCpu();
    cN = machineCpu();
  };
  await runTrainJob({ topology: loopTopology, train: cfg, engines, out, log: (l) => say(`${label}: ${l}`), onStep });
  const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
  const sps = rate(ms);
  const cpu = cpuUse(cpuBetween(c1, cN), ms.slice(1).reduce((n, m) => n + m.samples, 0));
  say(`${label}: ${sps.toFixed(1)} trained samples/s over steps 2..${ms.length} (mean step ${(ms.slice(1).reduce((n, m) => n + m.step_seconds, 0) / (ms.length - 1)).toFixed(2)} s), trained response ${trainedLength(ms).toFixed(1)} tokens a sample`);
  return { sps, out, ms, cpu };
}

/** Mean response tokens of the samples trained in a run (every step). */
function trainedLength(ms: StepMetrics[]): number {
  const n = ms.reduce((a, m) => a + m.samples, 0);
  return ms.reduce((a, m) => a + m.response_length_mean * m.samples, 0) / Math.max(1, n);
}

/** Generation alone: groups kept in flight up to `window`, as fully_async does, no trainer. */
async function generationOnly(modelDir: string): Promise<{ sps: number; groups: Sample[][]; cpu: CpuUse }> {
  const cfg = trainConfig("fully_async");
  const t = await loadTask(task, taskConfig, process.cwd());
  const proc = await startEngineProcess({ modelDir, maxRunning, cacheTokens: engines.cacheTokens, weightVersion: "0" });
  const gen = await FleetGenerator.create([proc.url]);
  try {
    const total = (steps + 2) * prompts;
    const done: { at: number; samples: Sample[]; cpu: CpuTimes | null }[] = [];
    let next = 0;
    await new Promise<void>((resolve, reject) => {
      const launch = () => {
        const p = next++;
        rolloutRange(t, gen, { firstPrompt: p, prompts: 1, samplesPerPrompt: samples, firstSample: p * samples }, { seed: cfg.seed, temperature: cfg.temperature }).then((r) => {
          done.push({ at: performance.now(), samples: r.samples, cpu: done.length === prompts - 1 || done.length === steps * prompts - 1 ? machineCpu() : null });
          if (next < total) launch();
          if (done.length === total) resolve();
        }, reject);
      };
      for (let i = 0; i < Math.min(window, total); i++) launch();
    });
    const first = done[prompts - 1]!, last = done[steps * prompts - 1]!;
    const n = (steps - 1) * prompts * samples;
    return { sps: n / ((last.at - first.at) / 1000), groups: done.map((d) => d.samples), cpu: cpuUse(cpuBetween(first.cpu, last.cpu), n) };
  } finally {
    await gen.close();
    await proc.stop();
  }
}

/** Training alone: N batches of 8 groups from the generation-only samples, one after the other. */
async function trainingOnly(modelDir: string, groups: Sample[][], rep: number): Promise<{ sps: number; cpu: CpuUse }> {
  const cfg = trainConfig("sync");
  const trainer = await PolicyTrainer.start({
    modelDir, version: 0, weightsRoot: join(root, `train-only-${rep}`),
    config: policyTrainerConfig(cfg), // the trainer actor's settings
  });
  try {
    const buffer = new GroupBuffer({ batchGroups: prompts, estimator: cfg.estimator, dropZeroVariance: false, maxStaleness: null });
    for (const g of groups) {
      for (const s of g) buffer.add(s);
      buffer.close(g[0]!.groupIndex, g.length);
    }
    let seconds = 0, trained = 0;
    const used: CpuTimes = { busy: 0, total: 0 };
    for (let step = 1; step <= steps; step++) {
      const { batch } = buffer.takeBatch(trainer.version);
      if (!batch) throw new Error(`training only: no batch for step ${step}`);
      const t0 = performance.now(), c0 = machineCpu();
      await trainer.step(batch.samples);
      if (step > 1) {
        seconds += (performance.now() - t0) / 1000;
        trained += batch.samples.length;
        const c = cpuBetween(c0, machineCpu());
        if (c) {
          used.busy += c.busy;
          used.total += c.total;
        }
      }
    }
    return { sps: trained / seconds, cpu: cpuUse(used, trained) };
  } finally {
    await trainer.close();
  }
}

const loadBefore = loadavg()[0]!;
try {
  const v0 = join(root, "bound-v0");
  const { initModelDir } = await import("../native/model-dir.ts");
  await initModelDir(preset, v0, 0);
  // Repetitions, each measuring every mode and both halves of the bound back to back, so a change
  // in the machine's other load hits them alike; figures are the means over repetitions.
  const reps: { sync: number; async: number; fully_async: number; fully_async_requeue: number; fully_async_staleness8: number; generation_only: number; training_only: number; bound: number }[] = [];
  /** Per repetition: CPU core-seconds per sample and busy fraction of the machine, by phase. */
  const cpuReps: Record<"sync" | "async" | "fully_async" | "generation_only" | "training_only", CpuUse>[] = [];
  /** Per repetition: mean trained response tokens a sample, and samples generated and never trained (requeued as stale), by mode. */
  const lengths: Record<"sync" | "async" | "fully_async" | "fully_async_requeue", number>[] = [];
  const wasted: Record<"fully_async" | "fully_async_requeue", { requeued: number; untrained: number }>[] = [];
  let lastSync = "", stalenessSeen = 0, partialSamples = 0;
  /** Without --explorer: each pair's sync rate with the default explorer files and with none. */
  const explorerPairs: { with: number; without: number; share: number; encodeShare: number }[] = [];
  /** Samples generated for nothing: requeued as stale, and launched but undecided at the end (the last checkpoint's pending groups). */
  const wastedOf = (out: string) => ({
    requeued: readJsonl<BatchRecord>(join(out, "batches.jsonl")).reduce((n, x) => n + (x.requeued?.length ?? 0), 0),
    untrained: (latestCheckpoint(out)?.state.pending ?? []).reduce((n, g) => n + g.count, 0),
  });
  for (let rep = 1; rep <= repetitions; rep++) {
    say(`repetition ${rep}/${repetitions}`);
    const sync = await run("sync", rep);
    // The explorer's cost: pairs of sync runs with the default explorer files and with none, in
    // alternating order (one pair's two 10-step runs differ by several % on this machine alone).
    for (let k = 0; explorerSteps === null && k < explorerPairCount; k++) {
      const none = { explorer: { ...trainConfig("sync").explorer, keepSteps: 0 } };
      const first = await run("sync", rep * 100 + k, k % 2 === 0 ? {} : none);
      const second = await run("sync", rep * 100 + k, k % 2 === 0 ? none : {});
      const withRun = k % 2 === 0 ? first : second, withoutRun = k % 2 === 0 ? second : first;
      // the writes' own time over the steps' (steps 2..N, as the rate): an upper bound of the cost
      const measured = withRun.ms.slice(1), stepTime = measured.reduce((n, m) => n + m.step_seconds, 0);
      const share = measured.reduce((n, m) => n + (m.explorer_seconds ?? NaN), 0) / stepTime;
      const encodeShare = measured.reduce((n, m) => n + (m.explorer_encode_seconds ?? NaN), 0) / stepTime;
      say(`explorer pair ${k + 1}: with/without ${(withRun.sps / withoutRun.sps).toFixed(3)}, the writes took ${(share * 100).toFixed(2)} % of the steps' time (encoding ${(encodeShare * 100).toFixed(2)} %)`);
      explorerPairs.push({ with: withRun.sps, without: withoutRun.sps, share, encodeShare });
    }
    const async_ = await run("async", rep);
    const full = await run("fully_async", rep);
    // lateGroups requeue: a batch never waits for late groups (the length bias lateGroups wait removes)
    const requeue = await run("fully_async", rep, { lateGroups: "requeue" });
    const loose = await run("fully_async", rep, { maxStaleness: looseBound });
    const genOnly = await generationOnly(v0);
    say(`generation only: ${genOnly.sps.toFixed(1)} samples/s (window ${window} groups)`);
    const trainOnly = await trainingOnly(v0, genOnly.groups, rep);
    say(`training only: ${trainOnly.sps.toFixed(1)} samples/s`);
    reps.push({ sync: sync.sps, async: async_.sps, fully_async: full.sps, fully_async_requeue: requeue.sps, fully_async_staleness8: loose.sps, generation_only: genOnly.sps, training_only: trainOnly.sps, bound: Math.min(genOnly.sps, trainOnly.sps) });
    cpuReps.push({ sync: sync.cpu, async: async_.cpu, fully_async: full.cpu, generation_only: genOnly.cpu, training_only: trainOnly.cpu });
    lengths.push({ sync: trainedLength(sync.ms), async: trainedLength(async_.ms), fully_async: trainedLength(full.ms), fully_async_requeue: trainedLength(requeue.ms) });
    wasted.push({ fully_async: wastedOf(full.out), fully_async_requeue: wastedOf(requeue.out) });
    say(`CPU ms/sample (machine busy): ${Object.entries(cpuReps.at(-1)!).map(([k, c]) => `${k} ${(c.perSample * 1000).toFixed(2)} (${(c.utilisation * 100).toFixed(0)} %)`).join(", ")}`);
    stalenessSeen = Math.max(stalenessSeen, ...full.ms.map((m) => m.staleness_max));
    partialSamples += full.ms.reduce((n, m) => n + m.partial_samples, 0);
    lastSync = sync.out;
  }
  const ws = await weightSyncFigures(join(lastSync, "weights"));
  const r = (x: number, d = 2) => Number(x.toFixed(d));
  const mean = (k: keyof (typeof reps)[number]) => reps.reduce((n, x) => n + x[k], 0) / reps.length;
  const m = { sync: mean("sync"), async: mean("async"), full: mean("fully_async"), gen: mean("generation_only"), train: mean("training_only"), bound: mean("bound") };
  // The CPU bound: the rate at which every core is busy with nothing but generating and training
  // (cores / CPU-seconds a sample costs to generate and train, each measured alone). Where it is
  // below `bound`, the cores, not the lack of overlap, limit every mode.
  const cores = availableParallelism();
  const cpuMean = (k: keyof (typeof cpuReps)[number], f: keyof CpuUse) => cpuReps.reduce((n, x) => n + x[k][f], 0) / cpuReps.length;
  const cpuBound = cores / (cpuMean("generation_only", "perSample") + cpuMean("training_only", "perSample"));
  const phases = ["sync", "async", "fully_async", "generation_only", "training_only"] as const;
  console.log(
    JSON.stringify({
      explorer_keep_steps: explorerSteps ?? trainConfig("sync").explorer.keepSteps,
      ...(explorerPairs.length > 0
        ? {
            sync_no_explorer: r(explorerPairs.reduce((n, x) => n + x.without, 0) / explorerPairs.length),
            sync_explorer_vs_none: r(explorerPairs.reduce((n, x) => n + x.with, 0) / explorerPairs.reduce((n, x) => n + x.without, 0), 3),
            sync_explorer_vs_none_by_pair: explorerPairs.map((x) => r(x.with / x.without, 3)),
            // the explorer writes' own wall time over the steps' wall time in the runs with them: the
            // most the files can cost (were every write on the loop's path), measured inside each run
            sync_explorer_time_share: r(explorerPairs.reduce((n, x) => n + x.share, 0) / explorerPairs.length, 4),
            sync_explorer_time_share_max: r(Math.max(...explorerPairs.map((x) => x.share)), 4),
            sync_explorer_encode_share: r(explorerPairs.reduce((n, x) => n + x.encodeShare, 0) / explorerPairs.length, 4),
          }
        : {}),
      workload: `long-tail turns (Pareto alpha ${taskConfig.alpha}, 1-${taskConfig.maxTurns} turns of <=${taskConfig.turnTokens} tokens), preset ${preset}, ${prompts} prompts x ${samples} samples, ${steps} steps, 1 engine (maxRunning ${maxRunning}), OMP_NUM_THREADS=${process.env.OMP_NUM_THREADS}, ${repetitions} repetitions`,
      sync: r(m.sync),
      async: r(m.async),
      fully_async: r(m.full),
      async_vs_sync: r(m.async / m.sync, 3),
      fully_async_vs_sync: r(m.full / m.sync, 3),
      bound: r(m.bound),
      generation_only: r(m.gen),
      training_only: r(m.train),
      fully_async_vs_bound: r(m.full / m.bound, 3),
      repetitions: reps.map((x) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, r(v)]))),
      fully_async_window_groups: window,
      fully_async_staleness_bound: staleness,
      fully_async_staleness_max: stalenessSeen,
      fully_async_partial_samples: partialSamples,
      // Length bias: mean response tokens of the trained samples, and samples generated and never
      // trained (requeued as stale; pending: launched and undecided when the run ended), with
      // lateGroups wait (the default) and requeue (no waiting), summed over the repetitions.
      trained_response_length: Object.fromEntries((["sync", "async", "fully_async", "fully_async_requeue"] as const).map((k) => [k, r(lengths.reduce((n, x) => n + x[k], 0) / lengths.length, 1)])),
      fully_async_length_vs_sync: r(lengths.reduce((n, x) => n + x.fully_async, 0) / lengths.reduce((n, x) => n + x.sync, 0), 3),
      fully_async_requeue_length_vs_sync: r(lengths.reduce((n, x) => n + x.fully_async_requeue, 0) / lengths.reduce((n, x) => n + x.sync, 0), 3),
      fully_async_requeued_samples: wasted.reduce((n, x) => n + x.fully_async.requeued, 0),
      fully_async_requeue_requeued_samples: wasted.reduce((n, x) => n + x.fully_async_requeue.requeued, 0),
      fully_async_pending_at_end_samples: wasted.reduce((n, x) => n + x.fully_async.untrained, 0),
      fully_async_requeue_pending_at_end_samples: wasted.reduce((n, x) => n + x.fully_async_requeue.untrained, 0),
      fully_async_requeue: r(mean("fully_async_requeue")),
      fully_async_staleness8: r(mean("fully_async_staleness8")),
      fully_async_staleness8_vs_sync: r(mean("fully_async_staleness8") / m.sync, 3),
      cores,
      cpu_bound: r(cpuBound),
      fully_async_vs_cpu_bound: r(m.full / cpuBound, 3),
      cpu_ms_per_sample: Object.fromEntries(phases.map((k) => [k, r(cpuMean(k, "perSample") * 1000, 3)])),
      cpu_busy: Object.fromEntries(phases.map((k) => [k, r(cpuMean(k, "utilisation"), 3)])),
      // 1-minute load average of the machine before and after: other work competes for the 2 cores.
      load_before: r(loadBefore),
      load_after: r(loadavg()[0]!),
      ...ws,
    }),
  );
} finally {
  rmSync(root, { recursive: true, force: true });
}
