// The trainer actor (kind `train.trainer`, one per job): supervises the native trainer worker
// (PolicyTrainer), announces its starting weights as version 0 on WEIGHTS, consumes BATCHES in order
// (a batch is acked after its step is trained, saved and announced — once the previous version is on
// the engines, so the next step trains while this one syncs; a redelivered batch of a step already
// trained is skipped), writes OUT/metrics.jsonl, OUT/batches.jsonl (which sample indices
// each step trained and dropped), with train.recordTokens OUT/samples.jsonl (their tokens), with
// train.explorer OUT/explorer/ (each recent step's samples, for the dashboard's trajectory explorer:
// explorer-log.ts) and OUT/reward.svg like `ooze train`, checkpoints every K steps and
// at the end, and then (stopWhenDone) tells every node of the job to drain and stop. A trainer
// restarted in the same job (its process died) continues from its latest checkpoint and trains the
// batches after it again, replayed from BATCHES.
import { recordTrainerStep } from "../protocol/loop-metrics.ts";
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { z } from "zod";
import type { ActorSystem } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import { oldestVersion } from "../../src/sample.ts";
import { nodeDown } from "../../src/topology/node.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { defineLoopActor, type LoopEnv } from "../protocol/context.ts";
import { batchMsg, batchRegistry, stepMetricsMsg, weightsMsg, type PendingGroup, type TrainSample } from "../protocol/messages.ts";
import { consumeStream, ensureTrainStreams, publish, seqAfterStep, VersionsKv, type StreamConsumer } from "../protocol/streams.ts";
import { appendJsonl, readJsonl, rewardStats, sampleTokensRecord, writeRewardSvg, type BatchRecord, type StepMetrics } from "../protocol/metrics.ts";
import { POLICY_FILE, policySpecs } from "../protocol/policies.ts";
import { PolicySetTrainer } from "./policy-set-trainer.ts";
import { checkpointDir, commitCheckpoint, latestCheckpoint, pruneCheckpoints, type RunState } from "../protocol/state.ts";
import { criticFields, PolicyTrainer, policyTrainerConfig, type TrainStepResult } from "./policy-trainer.ts";
import type { TrainStepMetrics } from "../../native/trainer.ts";
import { SimTrainer, type StepTrainer } from "./sim-trainer.ts";
import { copyTokenizerFiles } from "./sft.ts";
import { ExplorerLog } from "./explorer-log.ts";

/** The trainer actor's `config`. */
export const trainerActorConfig = z.object({
  /** Run directory (relative to the topology file; `{job}` becomes the job id): metrics.jsonl, batches.jsonl, reward.svg, weights/, checkpoints/. */
  out: z.string().min(1),
  /** After the last step: tell every node of the job to drain and stop (`ooze up` then exits 0). */
  stopWhenDone: z.boolean().default(true),
  /**
   * A batch comes back after this long without a heartbeat: a killed trainer's, or one whose ack a
   * crashed nats-server forgot (the trainer takes one batch at a time, so nothing else arrives
   * meanwhile). The handler beats every third of it while it trains.
   */
  ackWaitMs: z.number().int().min(500).default(10_000),
});

type Batch = z.output<typeof batchMsg.schema>;

interface TrainerState {
  trainer: StepTrainer;
  stopVersions: () => Promise<void>;
  consumer: StreamConsumer;
  run: Run;
  explorer: ExplorerLog | null;
}

/** The trainer actor definition for a node's system and topology. */
export function trainerActor(system: ActorSystem, topology: Topology) {
  return defineLoopActor(system, topology, {
    role: "trainer",
    config: trainerActorConfig,
    async init(env, cfg, ctx): Promise<TrainerState> {
      const t = env.train;
      const out = resolve(env.baseDir, cfg.out.replaceAll("{job}", env.job));
      const paths = { metrics: join(out, "metrics.jsonl"), batches: join(out, "batches.jsonl"), samples: join(out, "samples.jsonl"), svg: join(out, "reward.svg") };
      mkdirSync(out, { recursive: true });
      const from = await startingPoint(out, env, paths);
      if (from.resumed) ctx.log.warn(`trainer: resuming job ${env.job} at step ${from.step} from ${from.modelDir}`);
      const explorer = t.explorer.keepSteps > 0 ? new ExplorerLog(out, t.explorer.keepSteps, t.model ? resolve(env.baseDir, t.model) : null, (l) => ctx.log.warn(l)) : null;
      explorer?.cutAfter(from.step);
      const config = policyTrainerConfig(t);
      const policies = policySpecs(t.policies);
      const onRestart = (reason: string, pid: number | null) => ctx.log.warn(`trainer worker restarted: ${reason}; trainer: worker pid ${pid ?? "-"} now`);
      const trainer: StepTrainer = t.simulate
        ? new SimTrainer(from.modelDir, from.version, t.simulate)
        : policies.length > 1
          ? await PolicySetTrainer.start({
              modelDir: from.modelDir, version: from.version, weightsRoot: from.weightsRoot, config, policies, onRestart,
              resumed: existsSync(join(from.modelDir, policies[0]!.name, POLICY_FILE)),
            })
          : await PolicyTrainer.start({
            modelDir: from.modelDir,
            version: from.version,
            weightsRoot: from.weightsRoot,
            config,
            // the new pid in the same words as at start: what fault injection and operators look up
            onRestart: (reason, pid) => ctx.log.warn(`trainer worker restarted: ${reason}; trainer: worker pid ${pid ?? "-"} now`),
            log: (line) => ctx.log.info(`torch setup: ${line}`),
          });
      ctx.log.info(`trainer: worker pid ${trainer.pid ?? "-"} at weight version ${trainer.version} (${t.simulate ? "simulated" : t.trainer.backend} trainer)`);
      try {
        await ensureTrainStreams(env.bus, env.names, env.train);
        const versions = await (await VersionsKv.open(env.bus, env.names)).follow();
        const announce = (step: number, position: Position) =>
          publish(env.bus, env.names.trainWeights, weightsMsg, { version: trainer.version, modelDir: trainer.modelDir, step, position }, `weights-${step}`, ctx.path);
        await announce(from.step, from.position);
        const publishMetrics = (m: StepMetrics) => (recordTrainerStep(env.job, ctx.path, m),
          publish(env.bus, env.names.trainMetrics, stepMetricsMsg, { step: m.step, metrics: m as unknown as Record<string, number | number[]> }, `metrics-${m.step}`, ctx.path));
        const run = new Run(env, cfg, out, paths, trainer, versions, announce, publishMetrics, from.step, (l) => ctx.log.info(l), explorer);
        // A resumed trainer trains again the batches after its checkpoint (still on BATCHES).
        const startSeq = from.resumed ? await seqAfterStep(env.bus, env.names.streamBatches, batchRegistry, (m) => m.body.step, from.step) : undefined;
        const consumer = consumeStream({
          ...(startSeq !== undefined ? { startSeq } : {}),
          bus: env.bus, names: env.names, stream: env.names.streamBatches, subject: env.names.trainBatches, durable: env.names.consumer("train_trainer"),
          registry: batchRegistry, actor: ctx.path, ackWaitMs: cfg.ackWaitMs, log: (l) => ctx.log.warn(l),
          handle: (msg) => run.onBatch(msg.body),
        });
        ctx.log.info(`trainer: ${t.steps} steps of ${t.promptsPerStep}×${t.samplesPerPrompt} samples (${t.mode}), run directory ${out}`);
        run.finishIfDone();
        return { trainer, consumer, run, stopVersions: versions.stop, explorer };
      } catch (e) {
        await trainer.close();
        throw e;
      }
    },
    async onStop(state, ctx) {
      // Stop taking batches, then end the version watch: a handler waiting for a version (the
      // weight-sync actor may have stopped first) ends at once instead of holding the stop for the
      // consumer's whole grace; its batch, not acked, comes back to the next trainer.
      const consumerStopped = state.consumer.stop();
      await state.stopVersions();
      await consumerStopped;
      // Stopped between checkpoints (Ctrl-C, `ooze down`, a crash): keep what was trained.
      await state.run.checkpointLast().catch((e) => ctx.log.error(`trainer: final checkpoint failed: ${(e as Error).message}`));
      await state.explorer?.flush();
      await state.trainer.close();
    },
  });
}

/** The data position after a step: where a fresh buffer starts (resumed runs). */
type Position = { nextPrompt: number; nextSample: number; pending: PendingGroup[] };

/** Where a trainer (re)starts: fresh at version 0, or at the run's latest checkpoint of this job. */
interface StartingPoint {
  step: number;
  version: number;
  position: Position;
  modelDir: string;
  /** Where new versions go (a fresh directory per incarnation: engines may still read the old ones). */
  weightsRoot: string;
  resumed: boolean;
}

/**
 * A fresh run directory starts at version 0 (the preset, or train.model); one this job wrote before
 * (its trainer's process died) continues at its latest checkpoint (version 0 if none), with
 * metrics.jsonl, batches.jsonl and samples.jsonl cut back to that step. A directory of another job is refused.
 */
async function startingPoint(out: string, env: LoopEnv, paths: { metrics: string; batches: string; samples: string }): Promise<StartingPoint> {
  const t = env.train;
  const marker = join(out, "job.json");
  const owner = existsSync(marker) ? (JSON.parse(readFileSync(marker, "utf8")) as { job: string; incarnation: number }) : null;
  if (owner === null && readJsonl(paths.metrics).length > 0)
    throw new OozeError("CONFIG_INVALID", `trainer: ${paths.metrics} already has steps of another run; give the trainer another 'out'`);
  if (owner !== null && owner.job !== env.job)
    throw new OozeError("CONFIG_INVALID", `trainer: ${out} belongs to job '${owner.job}'; give the trainer another 'out' (e.g. runs/{job})`);
  const incarnation = (owner?.incarnation ?? -1) + 1;
  writeFileSync(marker, JSON.stringify({ job: env.job, incarnation }));
  const weightsRoot = join(out, "weights", incarnation === 0 ? "" : `i${incarnation}`);
  const ckpt = owner ? latestCheckpoint(out) : null;
  const step = ckpt?.state.step ?? 0;
  if (owner) for (const p of [paths.metrics, paths.batches, paths.samples]) cutJsonl(p, step);
  if (ckpt) {
    const { nextPrompt, nextSample, pending = [], weightVersion } = ckpt.state;
    const position = { nextPrompt, nextSample, pending: pending.map((g) => ({ ...g, attempt: g.attempt ?? 0 })) };
    return { step, version: weightVersion, position, modelDir: ckpt.dir, weightsRoot, resumed: true };
  }
  const fresh = { step: 0, version: 0, position: { nextPrompt: 0, nextSample: 0, pending: [] }, weightsRoot, resumed: owner !== null };
  if (t.model) return { ...fresh, modelDir: resolve(env.baseDir, t.model) };
  const v0 = join(out, "weights", "v0");
  if (!existsSync(join(v0, "model.safetensors"))) {
    const { initModelDir } = await import("../../native/model-dir.ts");
    await initModelDir(t.preset, v0, t.seed, t.initStd);
  }
  return { ...fresh, modelDir: v0 };
}

/** Keeps the records of steps ≤ `step` in a JSONL file. */
function cutJsonl(path: string, step: number): void {
  if (!existsSync(path)) return;
  writeFileSync(path, readJsonl<{ step: number }>(path).filter((r) => r.step <= step).map((r) => `${JSON.stringify(r)}\n`).join(""));
}

/** Trained samples by staleness (entry k: oldest token k versions behind `trainerVersion`; dashboards). */
function stalenessHist(samples: Batch["samples"], trainerVersion: number): number[] {
  const hist: number[] = [];
  for (const s of samples) {
    const k = Math.max(0, trainerVersion - (oldestVersion(s) ?? trainerVersion));
    while (hist.length <= k) hist.push(0);
    hist[k]!++;
  }
  return hist;
}

/** One run's progress: steps trained, metrics, checkpoints. */
class Run {
  private step: number;
  private checkpointStep: number;
  private readonly t0: number;
  private lastStepEnd = performance.now();
  private readonly metrics: StepMetrics[];
  private last: RunState | null = null;
  /** The run reached its last step (steps or maxSeconds); later batches are not trained. */
  private done = false;
  /** The step trained last, with its result (kept until it is announced and synced). */
  private trained: { step: number; result: TrainStepResult | null; seconds: number; restarts: number; versionBefore: number } | null = null;

  constructor(
    private readonly env: LoopEnv,
    private readonly cfg: z.output<typeof trainerActorConfig>,
    private readonly out: string,
    private readonly paths: { metrics: string; batches: string; samples: string; svg: string },
    private readonly trainer: StepTrainer,
    private readonly versions: { until(step: number): Promise<unknown> },
    private readonly announce: (step: number, position: Position) => Promise<unknown>,
    private readonly publishMetrics: (m: StepMetrics) => Promise<unknown>,
    from: number,
    private readonly log: (l: string) => void,
    private readonly explorer: ExplorerLog | null = null,
  ) {
    this.step = this.checkpointStep = from;
    this.metrics = readJsonl<StepMetrics>(paths.metrics);
    this.t0 = performance.now() - (this.metrics.at(-1)?.seconds ?? 0) * 1000;
  }

  async onBatch(b: Batch): Promise<void> {
    if (b.step <= this.step || this.done) return; // redelivered (trained already), or the run is over
    if (b.step !== this.step + 1) throw new OozeError("INTERNAL", `trainer: batch of step ${b.step} arrived after step ${this.step}`);
    const t = this.env.train;
    // Trained once: a batch redelivered after a failed announce (NATS away) is only announced again.
    if (this.trained?.step !== b.step) {
      const tTrain = performance.now();
      const restartsBefore = this.trainer.restarts;
      const versionBefore = this.trainer.version;
      const result = b.samples.length > 0 ? await this.trainer.step(b.samples) : null;
      this.trained = { step: b.step, result, seconds: (performance.now() - tTrain) / 1000, restarts: this.trainer.restarts - restartsBefore, versionBefore };
    }
    const { result: trained, seconds: trainSeconds, restarts, versionBefore } = this.trained;
    // One version in flight to the engines: this step's is announced once the previous one is on
    // them. The trainer does not wait for its own (but at the last step): the next batch trains
    // while it syncs — weight sync overlaps training, as the buffer cuts that batch already.
    const tSync = performance.now();
    await this.versions.until(b.step - 1);
    await this.announce(b.step, { nextPrompt: b.nextPrompt, nextSample: b.nextSample, pending: b.pending });
    const last = b.step >= t.steps || (t.maxSeconds > 0 && (performance.now() - this.t0) / 1000 >= t.maxSeconds);
    if (last) await this.versions.until(b.step);
    const syncSeconds = (performance.now() - tSync) / 1000;
    this.step = b.step;
    const now = performance.now();
    const stepSeconds = (now - this.lastStepEnd) / 1000;
    this.lastStepEnd = now;
    const tm = trained?.metrics ?? null;
    const s = b.stats;
    const explorerTime = this.explorer?.takeSeconds();
    const m: StepMetrics = {
      step: b.step, ...s.rewards, samples: b.samples.length,
      tokens: b.samples.reduce((n, x) => n + x.tokens.length, 0), seconds: (now - this.t0) / 1000, step_seconds: stepSeconds,
      rollout_seconds: s.rolloutSeconds, train_seconds: trainSeconds, sync_seconds: syncSeconds, samples_per_s: b.samples.length / Math.max(1e-9, stepSeconds),
      weight_version: this.trainer.version, staleness_max: b.stalenessMax,
      partial_samples: b.samples.filter((x) => new Set(x.weightVersions.map((w) => w.version)).size > 1).length, cache_hit_rate: s.promptTokens > 0 ? s.cachedTokens / s.promptTokens : 0,
      loss: tm?.loss ?? 0, kl: tm?.ppoKl ?? 0, entropy: tm?.entropy ?? 0, clipfrac: tm?.clipfrac ?? 0, grad_norm: tm?.gradNorm ?? 0,
      response_length_mean: b.samples.length ? b.samples.reduce((n, x) => n + x.responseLength, 0) / b.samples.length : 0, failed: s.failed, dropped_groups: s.droppedGroups, trainer_restarts: restarts,
      lr: trained ? this.trainer.lrAt(this.trainer.version) : 0, entropy_coef: trained?.entropyCoef ?? 0, ...(trained?.entropyTarget != null ? { entropy_target: trained.entropyTarget } : {}), ...(t.uniformCoef > 0 && tm ? { uniform_ce: tm.uniformCe } : {}), staleness_hist: stalenessHist(b.samples, versionBefore),
      ...(explorerTime ? { explorer_seconds: explorerTime.total, explorer_encode_seconds: explorerTime.encode } : {}),
      ...(trained?.critic ? criticFields(trained.critic) : {}),
      ...policyFields(b.samples, trained?.policies ?? null),
    };
    this.metrics.push(m);
    appendJsonl(this.paths.metrics, m);
    const record: BatchRecord = { step: b.step, trained: b.samples.map((x) => x.index), dropped: b.dropped };
    if (t.mode === "fully_async")
      Object.assign(record, { requeued: b.requeued, requeuedPrompts: b.requeuedPrompts, trainedPrompts: b.trainedPrompts, droppedPrompts: b.droppedPrompts });
    // Tokens first: a batch record always has its samples' tokens (tokensAsSampled reads both).
    if (t.recordTokens) appendFileSync(this.paths.samples, b.samples.map((x) => `${JSON.stringify(sampleTokensRecord(b.step, x))}\n`).join(""));
    appendJsonl(this.paths.batches, record);
    writeRewardSvg(this.paths.svg, this.metrics, `ooze: ${t.task} (${t.mode})`);
    await this.publishMetrics(m);
    // the explorer's file of the step: queued, written while the next step trains
    this.explorer?.write(b.step, b.samples, b.failedSamples);
    this.log(`trainer: step ${b.step}/${t.steps} reward ${m.reward_mean.toFixed(3)} version ${m.weight_version}`);
    const state: RunState = { step: b.step, nextPrompt: b.nextPrompt, nextSample: b.nextSample, weightVersion: this.trainer.version, seconds: m.seconds };
    if (t.mode === "fully_async") state.pending = b.pending;
    this.last = state;

    if (b.step % t.checkpointEvery === 0 || last) await this.checkpoint(state);
    if (last && !this.done) {
      this.done = true;
      this.log(`trainer: done: ${b.step} steps, reward ${this.metrics[0]?.reward_mean.toFixed(3)} → ${m.reward_mean.toFixed(3)}, weight version ${this.trainer.version}, ${this.out}`);
      if (this.cfg.stopWhenDone) setImmediate(() => void this.stopJob());
    }
  }

  /**
   * A run resumed at or past its last step (its process was killed or stopped after the final
   * checkpoint) has nothing to train: it ends the job at once. Without this a resumed fully_async
   * run waited forever (found by test/property/job-process-schedules).
   */
  finishIfDone(): void {
    if (this.done || this.step < this.env.train.steps) return;
    this.done = true;
    this.log(`trainer: done: resumed at step ${this.step} of ${this.env.train.steps}, nothing left to train (${this.out})`);
    if (this.cfg.stopWhenDone) setImmediate(() => void this.stopJob());
  }

  /** Checkpoints the last trained step unless it is checkpointed already. */
  async checkpointLast(): Promise<void> {
    if (this.last) await this.checkpoint(this.last);
  }

  private async checkpoint(state: RunState): Promise<void> {
    if (state.step === this.checkpointStep) return;
    const dir = checkpointDir(this.out, state.step);
    await this.trainer.saveTo(dir);
    // the model's tokenizer and chat template go with the weights, as `ooze sft` does it: without
    // them a checkpoint of a model with its own tokenizer (a Qwen3-shaped one) is served with the
    // byte tokenizer and the built-in template, and answers garbage
    if (this.env.train.model !== undefined) copyTokenizerFiles(resolve(this.env.baseDir, this.env.train.model), dir);
    commitCheckpoint(this.out, dir, state);
    pruneCheckpoints(this.out, this.env.train.keepCheckpoints);
    this.checkpointStep = state.step;
  }

  /** Tells every node of the job (this one last) to drain and stop. */
  private async stopJob(): Promise<void> {
    const others = this.env.hosts.filter((h) => h !== this.env.host);
    await Promise.all(others.map((h) => nodeDown(this.env.bus, this.env.job, h).catch((e) => this.log(`trainer: could not stop node ${h}: ${(e as Error).message}`))));
    await nodeDown(this.env.bus, this.env.job, this.env.host).catch((e) => this.log(`trainer: could not stop node ${this.env.host}: ${(e as Error).message}`));
  }
}

/** Each policy's figures of a step (several policies): its samples' rewards and its update's metrics. */
function policyFields(samples: readonly TrainSample[], trained: Record<string, TrainStepMetrics> | null): Record<`policy_${string}`, number> {
  const names = [...new Set(samples.map((s) => s.policy).filter((p): p is string => p !== undefined))];
  const out: Record<`policy_${string}`, number> = {};
  for (const name of names) {
    const mine = samples.filter((s) => s.policy === name);
    const r = rewardStats(mine);
    Object.assign(out, { [`policy_${name}_reward_mean`]: r.reward_mean, [`policy_${name}_success_rate`]: r.success_rate, [`policy_${name}_samples`]: mine.length });
    const m = trained?.[name];
    if (m) Object.assign(out, { [`policy_${name}_loss`]: m.loss, [`policy_${name}_entropy`]: m.entropy, [`policy_${name}_grad_norm`]: m.gradNorm, [`policy_${name}_clipfrac`]: m.clipfrac });
  }
  return out;
}
