// The training loop of `ooze train`: engines, trainer worker, rollouts, buffer, weight sync and
// metrics, in sync mode (generate, train, sync, repeat), async mode (one step off-policy: the
// rollout of step n+1 runs on the engines while the trainer trains step n) or fully_async mode
// (./fully-async.ts: generation never stops; partial rollout and a staleness bound). Resumable from
// the last checkpoint at the same data position; every sample index ends trained, dropped or
// requeued (batches.jsonl).
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { GroupBuffer, type TrainSample } from "../buffer/groups.ts";
import type { Task } from "../environment/task.ts";
import { rolloutRange, type RolloutResult } from "../rollout/rollout.ts";
import { criticFields, PolicyTrainer, policyTrainerConfig, type TrainStepResult } from "../trainer/policy-trainer.ts";
import { FullWeightSync } from "../weight-sync/full.ts";
import { DeltaWeightSync } from "../weight-sync/delta-sync.ts";
import { OozeError } from "../../src/errors.ts";
import type { Sample } from "../../src/sample.ts";
import type { EnginesConfig, TrainConfig } from "./config.ts";
import { FleetGenerator, startEngineProcess, type EngineProcess, type Generator } from "./engines.ts";
import { appendJsonl, readJsonl, rewardStats, writeRewardSvg, type StepMetrics } from "./metrics.ts";
import { checkpointDir, commitCheckpoint, latestCheckpoint, pruneCheckpoints, type RunState } from "./state.ts";
import { runFullyAsync } from "./fully-async.ts";
import { loadTask } from "./task-loader.ts";

/** Hooks for the CLI's progress display and for fault-injection tests. */
export interface TrainHooks {
  /** After the engines and the trainer started. */
  onStart?(info: { engines: string[]; enginePids: number[]; trainerPid: number | null; state: RunState }): void;
  /** Just before the trainer gets step `step`'s batch (`batch`: its samples). */
  beforeTrain?(step: number, trainer: PolicyTrainer, batch: readonly TrainSample[]): void;
  onStep?(m: StepMetrics): void;
  /** An embedded engine died and a new one took its place. */
  onEngineRestart?(oldUrl: string, newUrl: string): void;
  log?(line: string): void;
}

/** Options of runTraining. */
export interface TrainRunOptions {
  out: string;
  train: TrainConfig;
  engines: EnginesConfig;
  /** Directory that relative paths in the topology (task modules, model) resolve against. */
  baseDir: string;
  /** Continue from DIR's latest checkpoint. */
  resume?: boolean;
  hooks?: TrainHooks;
  /** Set to stop after the current step (checkpoint and summary as usual). */
  stopSignal?: { stop: boolean };
}

/** What a run reports at its end. */
export interface TrainSummary {
  steps: number;
  seconds: number;
  samples: number;
  rewardFirst: number | null;
  rewardLast: number | null;
  /** Mean reward over the last 5 steps. */
  rewardTail: number | null;
  /** Mean success rate of the last 5 steps. */
  successTail: number | null;
  weightVersion: number;
  trainerRestarts: number;
  checkpoint: string | null;
  metricsPath: string;
  svgPath: string;
}

/**
 * One record of batches.jsonl: which sample indices the step trained on, which it dropped (filter,
 * failed episodes) and, in fully_async mode, which it requeued (their group was beyond the staleness
 * bound; its prompt is generated again under new sample indices).
 */
export interface BatchRecord {
  step: number;
  trained: number[];
  dropped: number[];
  requeued?: number[];
  /** Prompt indices of the requeued groups. */
  requeuedPrompts?: number[];
  /** fully_async: prompt indices of the groups trained, and of those dropped (filter, or too stale too often). */
  trainedPrompts?: number[];
  droppedPrompts?: number[];
}

interface Collected {
  samples: TrainSample[];
  all: Sample[];
  dropped: number[];
  stalenessMax: number;
  rolloutSeconds: number;
  /** Data position after the rollouts this batch used. */
  end: { nextPrompt: number; nextSample: number };
}

/** What one step produced: written to metrics.jsonl and batches.jsonl, and checkpointed. */
export interface StepOutcome {
  step: number;
  /** The trained batch (empty when nothing could be trained). */
  samples: TrainSample[];
  /** Samples whose fate this step decided (trained or dropped): reward and length metrics. */
  all: Sample[];
  dropped: number[];
  requeued?: number[];
  requeuedPrompts?: number[];
  trainedPrompts?: number[];
  droppedPrompts?: number[];
  stalenessMax: number;
  /** Seconds the step spent waiting for its rollouts. */
  rolloutSeconds: number;
  trained: TrainStepResult | null;
  stepSeconds: number;
  trainSeconds: number;
  syncSeconds: number;
  /** Trainer worker restarts during the step. */
  restarts: number;
  /** Groups the dynamic filter dropped so far in this run. */
  droppedGroups: number;
  /** The run's position after the step (seconds are filled in). */
  state: Omit<RunState, "seconds">;
}

/** What pushes each new version to the engines (full checkpoints or deltas). */
export interface WeightSync {
  push(modelDir: string, version: number): Promise<unknown>;
}

/** What the fully_async loop gets from runTraining: the started components and the step bookkeeping. */
export interface LoopContext {
  cfg: TrainConfig;
  task: Task;
  gen: Generator;
  trainer: PolicyTrainer;
  sync: WeightSync;
  /** Where the run starts (resume: the checkpoint's state). */
  start: RunState;
  hooks: TrainHooks;
  log: (line: string) => void;
  /** Whether a step after `step` should run (steps, stop signal, time limit). */
  more(step: number): boolean;
  /** Records a finished step (metrics, batches.jsonl, chart, periodic checkpoint). */
  commit(o: StepOutcome): Promise<void>;
}

/** Runs (or resumes) a training job; resolves with its summary. */
export async function runTraining(opts: TrainRunOptions): Promise<TrainSummary> {
  const cfg = opts.train;
  const out = resolve(opts.out);
  const log = opts.hooks?.log ?? (() => undefined);
  mkdirSync(out, { recursive: true });
  const metricsPath = join(out, "metrics.jsonl"), batchesPath = join(out, "batches.jsonl"), svgPath = join(out, "reward.svg");
  const task = await loadTask(cfg.task, cfg.taskConfig, opts.baseDir);

  // Where to start: a fresh model, or the latest checkpoint.
  let state: RunState = { step: 0, nextPrompt: 0, nextSample: 0, weightVersion: 0, seconds: 0 };
  let startDir: string;
  if (opts.resume) {
    const latest = latestCheckpoint(out);
    if (!latest) throw new OozeError("CONFIG_INVALID", `--resume ${out}: no checkpoint there (checkpoints/latest.json); run without --resume to start`);
    state = latest.state;
    startDir = latest.dir;
    truncateJsonl(metricsPath, state.step);
    truncateJsonl(batchesPath, state.step);
    log(`resuming from ${startDir} at step ${state.step} (prompt ${state.nextPrompt}, sample ${state.nextSample})`);
  } else {
    if (readJsonl(metricsPath).length > 0)
      throw new OozeError("CONFIG_INVALID", `${metricsPath} already has steps; use --resume ${opts.out} to continue, or another --out`);
    if (cfg.model) startDir = resolve(opts.baseDir, cfg.model);
    else {
      const { initModelDir } = await import("../../native/model-dir.ts");
      startDir = join(out, "weights", "v0");
      await initModelDir(cfg.preset, startDir, cfg.seed);
    }
  }

  const procs: EngineProcess[] = [];
  let trainer: PolicyTrainer | null = null;
  let fleet: FleetGenerator | null = null;
  let closing = false;
  const t0 = performance.now();
  const baseSeconds = state.seconds;
  const elapsed = () => baseSeconds + (performance.now() - t0) / 1000;
  // a run resumed from before success_rate existed: its earlier steps count the full reward as success
  const metrics: StepMetrics[] = readJsonl<StepMetrics>(metricsPath).map((m) => ({ ...m, success_rate: m.success_rate ?? m.reward_max_frac }));
  let lastCheckpoint: string | null = opts.resume ? startDir : null;
  let checkpointStep = state.step;
  try {
    const started = await Promise.all(
      Array.from({ length: opts.engines.count }, () =>
        startEngineProcess({ modelDir: startDir, maxRunning: opts.engines.maxRunning, cacheTokens: opts.engines.cacheTokens, weightVersion: String(state.weightVersion) }),
      ),
    );
    procs.push(...started);
    const urls = [...procs.map((p) => p.url), ...opts.engines.urls];
    const gen: Generator = (fleet = await FleetGenerator.create(urls));
    // An embedded engine that dies is started again at the trainer's current weights and takes its
    // place; its requests in flight are re-dispatched by the fleet (or retried by the rollout).
    const supervise = (i: number) => {
      const proc = procs[i]!;
      void proc.exited.then(async () => {
        if (closing) return;
        const version = trainer?.version ?? state.weightVersion;
        log(`engine ${proc.url} (pid ${proc.pid}) exited; starting a new one at weight version ${version}`);
        // The trainer prunes old version directories while the new engine loads, so it starts from a
        // copy (taken synchronously: no prune can interleave); the fleet then brings it to its version.
        const pinned = join(out, "weights", `engine-start-${proc.pid}`);
        try {
          cpSync(trainer?.modelDir ?? startDir, pinned, { recursive: true, filter: (src) => !src.endsWith("optimizer.bin") });
          const next = await startEngineProcess({
            modelDir: pinned, maxRunning: opts.engines.maxRunning, cacheTokens: opts.engines.cacheTokens, weightVersion: String(version),
          }).finally(() => rmSync(pinned, { recursive: true, force: true }));
          procs[i] = next;
          if (closing) return void next.stop();
          await gen.replace(proc.url, next.url);
          opts.hooks?.onEngineRestart?.(proc.url, next.url);
          supervise(i);
        } catch (e) {
          log(`could not restart the engine: ${(e as Error).message}`);
        }
      });
    };
    procs.forEach((_, i) => supervise(i));
    if (opts.engines.urls.length > 0) await gen.updateWeights(startDir, String(state.weightVersion));
    trainer = await PolicyTrainer.start({
      modelDir: startDir,
      version: state.weightVersion,
      weightsRoot: join(out, "weights"),
      config: policyTrainerConfig(cfg),
      onRestart: (reason) => log(`trainer worker restarted: ${reason}`),
    });
    opts.hooks?.onStart?.({ engines: [...procs.map((p) => p.url), ...opts.engines.urls], enginePids: procs.map((p) => p.pid), trainerPid: trainer.pid, state });

    const sync: WeightSync =
      cfg.weightSync === "delta"
        ? new DeltaWeightSync(gen, state.weightVersion, { dir: join(out, "weight-sync"), baseModelDir: startDir, wire: cfg.weightSyncWire, log })
        : new FullWeightSync(gen, state.weightVersion, log);
    const more = (step: number) => step < cfg.steps && !(opts.stopSignal?.stop ?? false) && !(cfg.maxSeconds > 0 && elapsed() >= cfg.maxSeconds);
    const commit = async (o: StepOutcome): Promise<void> => {
      state = { ...o.state, seconds: elapsed() };
      const m = stepMetrics(o, state.seconds, gen.takeCacheStats());
      metrics.push(m);
      appendJsonl(metricsPath, m);
      const rec: BatchRecord = { step: o.step, trained: o.samples.map((s) => s.index), dropped: o.dropped };
      if (o.requeued) Object.assign(rec, { requeued: o.requeued, requeuedPrompts: o.requeuedPrompts ?? [], trainedPrompts: o.trainedPrompts ?? [], droppedPrompts: o.droppedPrompts ?? [] });
      appendJsonl(batchesPath, rec);
      writeRewardSvg(svgPath, metrics, `ooze train: ${task.name} (${cfg.mode})`);
      opts.hooks?.onStep?.(m);
      if (o.step % cfg.checkpointEvery === 0) {
        lastCheckpoint = await checkpoint(out, trainer!, state, cfg.keepCheckpoints);
        checkpointStep = o.step;
      }
    };
    if (cfg.mode === "fully_async") {
      await runFullyAsync({ cfg, task, gen, trainer, sync, start: state, hooks: opts.hooks ?? {}, log, more, commit });
    } else {
      await stepLockedLoop({ cfg, task, gen, trainer, sync, start: state, hooks: opts.hooks ?? {}, log, more, commit });
    }
    if (state.step > checkpointStep) lastCheckpoint = await checkpoint(out, trainer, { ...state, seconds: elapsed() }, cfg.keepCheckpoints);
    const rewards = metrics.map((m) => m.reward_mean);
    const tailMean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
    return {
      steps: state.step,
      seconds: elapsed(),
      samples: metrics.reduce((n, m) => n + m.samples, 0),
      rewardFirst: rewards[0] ?? null,
      rewardLast: rewards[rewards.length - 1] ?? null,
      rewardTail: tailMean(rewards.slice(-5)),
      successTail: tailMean(metrics.slice(-5).map((m) => m.success_rate)),
      weightVersion: trainer.version,
      trainerRestarts: trainer.restarts,
      checkpoint: lastCheckpoint,
      metricsPath,
      svgPath,
    };
  } finally {
    closing = true;
    await fleet?.close().catch(() => undefined);
    await trainer?.close().catch(() => undefined);
    await Promise.all(procs.map((p) => p.stop().catch(() => undefined)));
  }
}

/** sync and async modes: each step's rollouts are a fixed range of the data stream. */
async function stepLockedLoop(ctx: LoopContext): Promise<void> {
  const { cfg, task, gen, trainer, sync } = ctx;
  if (ctx.start.pending?.length)
    ctx.log(`${cfg.mode} mode: the checkpoint lists ${ctx.start.pending.length} groups in flight (a fully_async run); they are not generated again in this mode`);
  const buffer = new GroupBuffer({ batchGroups: cfg.promptsPerStep, estimator: cfg.estimator, dropZeroVariance: cfg.dropZeroVariance, maxStaleness: null });
  // The data stream: the position of the next rollout to launch.
  let launch = { nextPrompt: ctx.start.nextPrompt, nextSample: ctx.start.nextSample };
  const startRollout = (prompts: number): Promise<RolloutResult & { end: typeof launch }> => {
    const range = { firstPrompt: launch.nextPrompt, prompts, samplesPerPrompt: cfg.samplesPerPrompt, firstSample: launch.nextSample };
    launch = { nextPrompt: launch.nextPrompt + prompts, nextSample: launch.nextSample + prompts * cfg.samplesPerPrompt };
    const end = launch;
    return rolloutRange(task, gen, range, { seed: cfg.seed, temperature: cfg.temperature }).then((r) => ({ ...r, end }));
  };
  const collect = async (first: Promise<RolloutResult & { end: typeof launch }>, version: number): Promise<Collected> => {
    const c: Collected = { samples: [], all: [], dropped: [], stalenessMax: 0, rolloutSeconds: 0, end: launch };
    let pending: Promise<RolloutResult & { end: typeof launch }> | null = first;
    for (let refill = 0; pending; refill++) {
      const r: RolloutResult & { end: typeof launch } = await pending;
      pending = null;
      c.rolloutSeconds += r.seconds;
      c.end = r.end;
      c.all.push(...r.samples);
      for (const s of r.samples) buffer.add(s);
      for (const g of r.groups) buffer.close(g.groupIndex, g.count);
      // Dynamic sampling: refill groups the filter dropped (at most 3 rounds; then train on what there is).
      if (buffer.readyGroups < cfg.promptsPerStep && refill < 3) pending = startRollout(cfg.promptsPerStep - buffer.readyGroups);
    }
    // One batch of all the step's groups: advantages are computed over all of them together.
    const { batch } = buffer.takeBatch(version, { partial: true });
    const taken = new Set(batch?.groups ?? []);
    if (batch) {
      c.samples = batch.samples;
      c.stalenessMax = batch.stalenessMax;
    }
    const trainedIdx = new Set(c.samples.map((s) => s.index));
    for (const s of c.all) if (!taken.has(s.groupIndex) || !trainedIdx.has(s.index)) c.dropped.push(s.index);
    return c;
  };

  let step = ctx.start.step;
  let nextRollout = startRollout(cfg.promptsPerStep);
  while (ctx.more(step)) {
    const stepStart = performance.now();
    step++;
    const batch = await collect(nextRollout, trainer.version);
    // async: the next rollout runs on the current weights while the trainer trains this batch.
    let overlapped: Promise<RolloutResult & { end: typeof launch }> | null = null;
    if (cfg.mode === "async" && step < cfg.steps) overlapped = startRollout(cfg.promptsPerStep);
    const tTrain = performance.now();
    ctx.hooks.beforeTrain?.(step, trainer, batch.samples);
    const restartsBefore = trainer.restarts;
    let trained: TrainStepResult | null = null;
    if (batch.samples.length > 0) trained = await trainer.step(batch.samples);
    const trainSeconds = (performance.now() - tTrain) / 1000;
    if (overlapped) nextRollout = Promise.resolve(await overlapped); // generation of step n+1 finishes before the engines change weights
    const tSync = performance.now();
    if (trained) await sync.push(trained.modelDir, trained.version);
    const syncSeconds = (performance.now() - tSync) / 1000;
    if (!overlapped && ctx.more(step)) nextRollout = startRollout(cfg.promptsPerStep);
    await ctx.commit({
      step, samples: batch.samples, all: batch.all, dropped: batch.dropped, stalenessMax: batch.stalenessMax, rolloutSeconds: batch.rolloutSeconds,
      trained, stepSeconds: (performance.now() - stepStart) / 1000, trainSeconds, syncSeconds, restarts: trainer.restarts - restartsBefore,
      droppedGroups: buffer.stats.dropped,
      state: { step, nextPrompt: batch.end.nextPrompt, nextSample: batch.end.nextSample, weightVersion: trainer.version },
    });
  }
}

async function checkpoint(out: string, trainer: PolicyTrainer, state: RunState, keep: number): Promise<string> {
  const dir = checkpointDir(out, state.step);
  await trainer.saveTo(dir);
  commitCheckpoint(out, dir, state);
  pruneCheckpoints(out, keep);
  return dir;
}

function truncateJsonl(path: string, lastStep: number): void {
  if (!existsSync(path)) return;
  const keep = readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "" && (JSON.parse(l) as { step: number }).step <= lastStep);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, keep.map((l) => `${l}\n`).join(""));
}

function stepMetrics(o: StepOutcome, seconds: number, cache: { promptTokens: number; cachedTokens: number }): StepMetrics {
  const t = o.trained?.metrics ?? null;
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, c) => a + c, 0) / xs.length : 0);
  return {
    step: o.step,
    ...rewardStats(o.all),
    samples: o.samples.length,
    tokens: o.samples.reduce((n, s) => n + s.tokens.length, 0),
    seconds,
    step_seconds: o.stepSeconds,
    rollout_seconds: o.rolloutSeconds,
    train_seconds: o.trainSeconds,
    sync_seconds: o.syncSeconds,
    samples_per_s: o.samples.length / Math.max(1e-9, o.stepSeconds),
    weight_version: o.state.weightVersion,
    staleness_max: o.stalenessMax,
    partial_samples: o.samples.filter((s) => new Set(s.weightVersions.map((v) => v.version)).size > 1).length,
    cache_hit_rate: cache.promptTokens > 0 ? cache.cachedTokens / cache.promptTokens : 0,
    loss: t?.loss ?? 0,
    kl: t?.ppoKl ?? 0,
    entropy: t?.entropy ?? 0,
    clipfrac: t?.clipfrac ?? 0,
    grad_norm: t?.gradNorm ?? 0,
    response_length_mean: mean(o.all.map((s) => s.responseLength)),
    failed: o.all.filter((s) => s.status === "failed").length,
    dropped_groups: o.droppedGroups,
    trainer_restarts: o.restarts,
    ...(o.trained?.critic ? criticFields(o.trained.critic) : {}),
  };
}

export type { Task };
