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

/** Loss and optimizer settings of the trainer. */
export interface PolicyTrainerConfig {
  lr: number;
  weightDecay: number;
  maxGradNorm: number;
  beta2: number;
  epsClip: number;
  epsClipHigh: number;
  entropyCoef: number;
  /** Sampling temperature: the loss's logprobs are taken at the same temperature. */
  temperature: number;
  microBatchTokens: number | null;
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
  ) {}

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
    const packed = packSamples(samples);
    const c = this.config;
    const version = this.current.version + 1;
    const dir = this.dirOf(version);
    const before = this.worker.restarts;
    for (let attempt = 0; ; attempt++) {
      try {
        const metrics = await this.worker.trainStep(
          packed,
          { epsClip: c.epsClip, epsClipHigh: c.epsClipHigh, entropyCoef: c.entropyCoef, temperature: c.temperature },
          { lr: c.lr, weightDecay: c.weightDecay, maxGradNorm: c.maxGradNorm, beta2: c.beta2 },
          { microBatchTokens: c.microBatchTokens },
        );
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
