// The trainer side of the loop: feeds batches to the native trainer worker (a supervised child
// process), with the rollout logprobs as the old policy's (one PPO epoch per batch), and saves each
// new version (weights + AdamW state) to its own directory, which becomes the worker's restore point.
// A train step and its save are one unit: if the worker dies anywhere in it, the worker comes back
// at the previous version and the unit is redone, so a batch is applied exactly once.
import { rmSync } from "node:fs";
import { join } from "node:path";
import { TrainerWorker } from "../../native/worker/client.ts";
import { packSamples, type TrainStepMetrics } from "../../native/trainer.ts";
import { OozeError } from "../../src/errors.ts";
import type { TrainSample } from "../buffer/groups.ts";

/** The learning rate of the step that produces weight version `version` (1-based) under `c`'s schedule. */
export function learningRate(c: Pick<PolicyTrainerConfig, "lr" | "lrWarmupSteps" | "lrDecay" | "lrDecaySteps" | "lrMinRatio">, version: number): number {
  const w = c.lrWarmupSteps ?? 0;
  if (w > 0 && version < w) return c.lr * (version / w);
  const decay = c.lrDecay ?? "constant";
  if (decay === "constant" || c.lrDecaySteps === undefined || c.lrDecaySteps <= w) return c.lr;
  const progress = Math.min(1, Math.max(0, (version - w) / (c.lrDecaySteps - w)));
  const min = c.lrMinRatio ?? 0.1;
  const f = decay === "linear" ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  return c.lr * (min + (1 - min) * f);
}

/** Loss and optimizer settings of the trainer. */
export interface PolicyTrainerConfig {
  lr: number;
  /** Linear warmup: step k (1-based, counted in weight versions) uses lr * min(1, k / lrWarmupSteps). */
  lrWarmupSteps?: number;
  /**
   * After the warmup the rate stays (constant, the default) or falls, linearly or along a half
   * cosine, to lr * lrMinRatio at step lrDecaySteps, and stays there.
   */
  lrDecay?: "constant" | "linear" | "cosine";
  lrDecaySteps?: number;
  lrMinRatio?: number;
  weightDecay: number;
  maxGradNorm: number;
  beta2: number;
  /** AdamW epsilon (default 1e-8). */
  adamEps?: number;
  epsClip: number;
  epsClipHigh: number;
  entropyCoef: number;
  /** Adaptive entropy control: target mean token entropy (nats), or null/absent for a fixed coefficient. */
  entropyTarget?: number | null;
  /** How much the coefficient moves per step under adaptive control (default 0.005). */
  entropyCoefStep?: number;
  /** Sampling temperature: the loss's logprobs are taken at the same temperature. */
  temperature: number;
  microBatchTokens: number | null;
  /** Optimizer steps per batch: the batch is split by group into this many mini-batches (PPO-style). */
  updatesPerStep: number;
}

/** Result of one training step. */
export interface TrainStepResult {
  metrics: TrainStepMetrics;
  /** Directory of the new version's weights. */
  modelDir: string;
  version: number;
  /** Worker restarts that happened during this step. */
  restarts: number;
}

/** The policy trainer: a TrainerWorker plus the version directories. */
export class PolicyTrainer {
  private constructor(
    private readonly worker: TrainerWorker,
    private readonly weightsRoot: string,
    private readonly config: PolicyTrainerConfig,
    private current: { dir: string; version: number },
  ) {
    this.entropyCoef = config.entropyCoef;
  }

  /** The entropy coefficient in use (moves each step under adaptive entropy control). */
  entropyCoef: number;

  /** Starts a worker loaded from `modelDir` (with its optimizer.bin, if any) at `version`. */
  static async start(opts: { modelDir: string; version: number; weightsRoot: string; config: PolicyTrainerConfig; onRestart?: (reason: string) => void }): Promise<PolicyTrainer> {
    const worker = await TrainerWorker.start({
      source: { modelDir: opts.modelDir },
      maxRestarts: 20,
      onRestart: (e) => opts.onRestart?.(e.reason),
    });
    return new PolicyTrainer(worker, opts.weightsRoot, opts.config, { dir: opts.modelDir, version: opts.version });
  }

  /** The worker's process id (for fault-injection tests). */
  get pid(): number | null {
    return this.worker.pid;
  }

  get restarts(): number {
    return this.worker.restarts;
  }

  get version(): number {
    return this.current.version;
  }

  get modelDir(): string {
    return this.current.dir;
  }

  /** Directory of version `v`'s weights. */
  dirOf(v: number): string {
    return join(this.weightsRoot, `v${v}`);
  }

  /** Trains on one batch and saves the next version. */
  async step(samples: readonly TrainSample[]): Promise<TrainStepResult> {
    const parts = miniBatches(samples, this.config.updatesPerStep).map((p) => packSamples(p));
    const c = this.config;
    const version = this.current.version + 1;
    const dir = this.dirOf(version);
    const before = this.worker.restarts;
    for (let attempt = 0; ; attempt++) {
      try {
        const all: TrainStepMetrics[] = [];
        for (const packed of parts) {
          const m = await this.worker.trainStep(
            packed,
            { epsClip: c.epsClip, epsClipHigh: c.epsClipHigh, entropyCoef: this.entropyCoef, temperature: c.temperature },
            { lr: this.lrAt(version), weightDecay: c.weightDecay, maxGradNorm: c.maxGradNorm, beta2: c.beta2, eps: c.adamEps ?? 1e-8 },
            { microBatchTokens: c.microBatchTokens },
          );
          all.push(m);
        }
        const metrics = mergeMetrics(all);
        if (c.entropyTarget != null) {
          const delta = c.entropyCoefStep ?? 0.005;
          this.entropyCoef = Math.max(0, this.entropyCoef + (metrics.entropy < c.entropyTarget ? delta : -delta));
        }
        await this.worker.save(dir, String(version), { optimizer: true });
        this.current = { dir, version };
        this.prune(version);
        return { metrics, modelDir: dir, version, restarts: this.worker.restarts - before };
      } catch (e) {
        const retry = e instanceof OozeError && e.code === "WORKER_DIED" && e.retryable && attempt < 10;
        if (!retry) throw e;
        // the worker restarts from its restore point: the previous version (weights and optimizer)
      }
    }
  }

  /** The learning rate of the step that produces `version`. */
  lrAt(version: number): number {
    return learningRate(this.config, version);
  }

  /** Keeps the two newest version directories (the engines may still read the previous one). */
  private prune(version: number): void {
    const old = version - 2;
    if (old >= 0) rmSync(this.dirOf(old), { recursive: true, force: true });
  }

  /** Saves the current version (weights + optimizer) to `dir`, e.g. a checkpoint. */
  async saveTo(dir: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.worker.save(dir, String(this.current.version), { optimizer: true });
        return;
      } catch (e) {
        if (!(e instanceof OozeError && e.code === "WORKER_DIED" && e.retryable && attempt < 10)) throw e;
      }
    }
  }

  async close(): Promise<void> {
    await this.worker.close();
  }
}

/** Splits samples into `k` mini-batches of whole groups (as even as the groups allow, order kept). */
export function miniBatches<T extends { groupIndex: number }>(samples: readonly T[], k: number): T[][] {
  const groups: T[][] = [];
  for (const s of samples) {
    const last = groups[groups.length - 1];
    if (last && last[0]!.groupIndex === s.groupIndex) last.push(s);
    else groups.push([s]);
  }
  const n = Math.max(1, Math.min(k, groups.length));
  const out: T[][] = Array.from({ length: n }, () => []);
  groups.forEach((g, i) => out[Math.floor((i * n) / groups.length)]!.push(...g));
  return out.filter((b) => b.length > 0);
}

/** Metrics of several mini-batch updates: means, except clipfrac (max) and ppoKl (the last, most off-policy). */
function mergeMetrics(ms: TrainStepMetrics[]): TrainStepMetrics {
  const mean = (f: (m: TrainStepMetrics) => number) => ms.reduce((a, m) => a + f(m), 0) / ms.length;
  const last = ms[ms.length - 1]!;
  return {
    ...last,
    loss: mean((m) => m.loss), pgLoss: mean((m) => m.pgLoss), entropy: mean((m) => m.entropy), gradNorm: mean((m) => m.gradNorm),
    clipfrac: Math.max(...ms.map((m) => m.clipfrac)), numTokens: ms.reduce((a, m) => a + m.numTokens, 0), numSamples: ms.reduce((a, m) => a + m.numSamples, 0),
  };
}
