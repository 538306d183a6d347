// A simulated trainer for scale benchmarks (`train.simulate: {tokensPerSecond}`): no native worker and
// no compute; a step waits (a timer) as long as training its batch's tokens takes at the given rate,
// plus a fixed overhead, and then counts as the next weight version. Its weights stay the starting
// model directory, so the engines' update path and the whole loop run unchanged; the simulated engines
// (src/engine/sim/) accept any weights.
import { cpSync } from "node:fs";
import type { TrainStepResult } from "./policy-trainer.ts";

/** `train.simulate`: the simulated trainer's speed. */
export interface SimTrainerConfig {
  /** Tokens (prompt + response) trained per second. */
  tokensPerSecond: number;
  /** Fixed time of every step (optimizer, saving the version), ms. */
  stepOverheadMs: number;
}

/** What the trainer actor uses of a trainer: PolicyTrainer and SimTrainer both have it. */
export interface StepTrainer {
  readonly pid: number | null;
  readonly restarts: number;
  readonly version: number;
  readonly modelDir: string;
  step(samples: readonly { tokens: ArrayLike<number> }[]): Promise<TrainStepResult>;
  /** The learning rate of the update that makes version `version` + 1. */
  lrAt(version: number): number;
  saveTo(dir: string): Promise<void>;
  close(): Promise<void>;
}

/** The simulated trainer. */
export class SimTrainer implements StepTrainer {
  readonly pid = null;
  readonly restarts = 0;
  private current: number;

  constructor(
    readonly modelDir: string,
    version: number,
    private readonly cfg: SimTrainerConfig,
  ) {
    this.current = version;
  }

  get version(): number {
    return this.current;
  }

  async step(samples: readonly { tokens: ArrayLike<number> }[]): Promise<TrainStepResult> {
    const tokens = samples.reduce((n, s) => n + s.tokens.length, 0);
    const ms = this.cfg.stepOverheadMs + (tokens * 1000) / this.cfg.tokensPerSecond;
    await new Promise((r) => setTimeout(r, ms));
    this.current++;
    const metrics = { loss: 0, ppoKl: 0, entropy: 0, clipfrac: 0, gradNorm: 0 } as unknown as TrainStepResult["metrics"];
    return { metrics, modelDir: this.modelDir, version: this.current, restarts: 0, critic: null, entropyCoef: 0, entropyTarget: null };
  }

  /** No optimizer: 0. */
  lrAt(): number {
    return 0;
  }

  async saveTo(dir: string): Promise<void> {
    cpSync(this.modelDir, dir, { recursive: true });
  }

  async close(): Promise<void> {}
}
