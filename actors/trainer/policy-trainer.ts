// The trainer side of the loop: feeds batches to the native trainer worker (a supervised child
// process), with the rollout logprobs as the old policy's (one PPO epoch per batch), and saves each
// new version (weights + AdamW state) to its own directory, which becomes the worker's restore point.
// With PPO (config.ppo), the worker also holds the critic (a value head on the policy's trunk): one
// forward gives the batch's values, GAE turns them and the rewards (per turn and final) into token
// advantages and returns, and each update trains policy and critic together.
// A train step and its save are one unit: if the worker dies anywhere in it, the worker comes back
// at the previous version and the unit is redone, so a batch is applied exactly once.
import { existsSync, readdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { initModelDir } from "../../native/model-dir.ts";
import { CRITIC_DIR, TrainerWorker } from "../../native/worker/client.ts";
import { ensureTorchEnv, torchWorkerCommand } from "../../native/worker/torch-env.ts";
import { packSamples, type TrainerSource, type TrainStepMetrics } from "../../native/trainer.ts";
import { computeGae, explainedVariance, type AdvantageWhitening, type GaeSample } from "../../src/algorithms/gae.ts";
import { OozeError } from "../../src/errors.ts";
import type { TrainSample } from "../protocol/messages.ts";
import type { TrainConfig } from "../protocol/config.ts";
import { singlePolicy, writePolicyFile } from "../protocol/policies.ts";
import { adapterBaseDir, isAdapterDir } from "../../native/model-dir.ts";
import type { LoraConfig } from "../../native/index.d.ts";
import type { StepMetrics } from "../protocol/metrics.ts";

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

/** PPO with a critic: GAE and value-loss settings (see `ppo:` in actors/protocol/config.ts). */
export interface PpoConfig {
  gamma: number;
  lambda: number;
  valueCoef: number;
  valueClip: number | null;
  whitening: AdvantageWhitening;
  /** shared: a value head on the policy's trunk; separate: a value model of its own in the same worker. */
  critic?: "shared" | "separate";
  /** critic: separate: the value model's preset (null: a copy of the policy's starting weights). */
  criticPreset?: string | null;
}

/** Loss and optimizer settings of the trainer. */
export interface PolicyTrainerConfig {
  /** Which worker trains (absent: the native one). */
  worker?: TrainConfig["trainer"];
  /** PPO with a critic (values, GAE, value loss); null: the samples' own (group) advantages. */
  ppo?: PpoConfig | null;
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
  /** Weight of the uniform distribution's cross-entropy against the policy (0/absent: off). */
  uniformCoef?: number;
  /** Adaptive entropy control: target mean token entropy (nats), or null/absent for a fixed coefficient. */
  entropyTarget?: number | null;
  /** How much the coefficient moves per step under adaptive control (default 0.005). */
  entropyCoefStep?: number;
  /** Upper bound of the adaptive coefficient (null/absent: none). */
  entropyCoefMax?: number | null;
  /** The target moves linearly to this value at step entropyTargetSteps (null/absent: constant). */
  entropyTargetFinal?: number | null;
  entropyTargetSteps?: number;
  /** Sampling temperature: the loss's logprobs are taken at the same temperature. */
  temperature: number;
  microBatchTokens: number | null;
  /** Optimizer steps per batch: the batch is split by group into this many mini-batches (PPO-style). */
  updatesPerStep: number;
  /** The LoRA adapter that trains over the frozen base (null/absent: the whole model trains). */
  lora?: LoraConfig | null;
  /** The policy's name: what engines serve its adapter under (POLICY_FILE in each version's directory). */
  policy?: string;
  /**
   * One of several policies: its versions are the subdirectory `subdir` of each version directory
   * (weightsRoot/vN/POLICY), beside the other policies'.
   */
  subdir?: string;
  /** Seed of a fresh adapter's initialisation. */
  seed?: number;
}

/** The directory (under the weights root) of version 0 of a LoRA policy's adapter, or of several policies' weights. */
export const V0_POLICIES = "v0-policies";

/** The entropy target of adaptive entropy control at a step (null: no control). */
export function entropyTargetAt(c: Pick<PolicyTrainerConfig, "entropyTarget" | "entropyTargetFinal" | "entropyTargetSteps">, step: number): number | null {
  if (c.entropyTarget == null) return null;
  if (c.entropyTargetFinal == null) return c.entropyTarget;
  const progress = Math.min(1, Math.max(0, step / (c.entropyTargetSteps ?? 1000)));
  return c.entropyTarget + (c.entropyTargetFinal - c.entropyTarget) * progress;
}

/**
 * The entropy coefficient after a step that measured `entropy` (mean token entropy, nats): one
 * entropyCoefStep up while below the step's target, one down above it, within [0, entropyCoefMax].
 */
export function nextEntropyCoef(
  c: Pick<PolicyTrainerConfig, "entropyTarget" | "entropyTargetFinal" | "entropyTargetSteps" | "entropyCoefStep" | "entropyCoefMax">,
  coef: number, entropy: number, step: number,
): number {
  const target = entropyTargetAt(c, step);
  if (target == null) return coef;
  const delta = c.entropyCoefStep ?? 0.005;
  const next = Math.max(0, coef + (entropy < target ? delta : -delta));
  return c.entropyCoefMax == null ? next : Math.min(c.entropyCoefMax, next);
}

/** The trainer config of a topology's `train:` section (lrDecaySteps: the run's steps unless given). */
export function policyTrainerConfig(t: TrainConfig): PolicyTrainerConfig {
  const policy = singlePolicy(t.policies);
  return {
    lr: t.lr, lrWarmupSteps: t.lrWarmupSteps, lrDecay: t.lrDecay, lrDecaySteps: t.lrDecaySteps ?? t.steps, lrMinRatio: t.lrMinRatio, adamEps: t.adamEps,
    weightDecay: t.weightDecay, maxGradNorm: t.maxGradNorm, beta2: t.beta2, epsClip: t.epsClip, epsClipHigh: t.epsClipHigh ?? t.epsClip,
    entropyCoef: t.entropyCoef, uniformCoef: t.uniformCoef, entropyTarget: t.entropyTarget, entropyCoefStep: t.entropyCoefStep, entropyCoefMax: t.entropyCoefMax,
    entropyTargetFinal: t.entropyTargetFinal, entropyTargetSteps: t.entropyTargetSteps, temperature: t.temperature,
    microBatchTokens: t.microBatchTokens, updatesPerStep: t.updatesPerStep, ppo: t.algorithm === "ppo" ? t.ppo : null,
    worker: t.trainer, lora: policy.lora, policy: policy.name, seed: t.seed,
  };
}

/** Critic figures of a PPO step (over the batch's model tokens, before the update). */
export interface CriticMetrics {
  /** Value loss of the update (mean over mini-batches). */
  valueLoss: number;
  /** 1 − Var(returns − values) / Var(returns): how much of the returns the critic predicted (NaN if the returns are constant). */
  explainedVariance: number;
  valueMean: number;
  returnMean: number;
  /** Share of tokens where the value clip bound the loss. */
  valueClipfrac: number;
}

/** metrics.jsonl fields of a PPO step's critic. */
export function criticFields(c: CriticMetrics): Partial<StepMetrics> {
  return { value_loss: c.valueLoss, explained_variance: c.explainedVariance, value_mean: c.valueMean, return_mean: c.returnMean, value_clipfrac: c.valueClipfrac };
}

/** A sample with token advantages, the values they came from, and the returns (PPO). */
type GaeTrainSample = Omit<TrainSample, "advantage"> & { advantage: Float32Array; oldValues: Float32Array; returns: Float32Array };

/** Result of one training step. */
export interface TrainStepResult {
  metrics: TrainStepMetrics;
  /** PPO only: the critic's figures; null for the group estimators. */
  critic: CriticMetrics | null;
  /** Directory of the new version's weights. */
  modelDir: string;
  version: number;
  /** Worker restarts that happened during this step. */
  restarts: number;
  /** Entropy-bonus coefficient this step trained with (it moves under `entropyTarget`). */
  entropyCoef: number;
  /** The entropy target the coefficient moved toward after this step (null: no adaptive control). */
  entropyTarget: number | null;
  /** Several policies: each trained policy's own metrics (the step's are merged over them). */
  policies?: Record<string, TrainStepMetrics>;
}

/** The policy trainer: a TrainerWorker plus the version directories. */
export class PolicyTrainer {
  private constructor(
    private readonly worker: TrainerWorker,
    private readonly weightsRoot: string,
    private readonly config: PolicyTrainerConfig,
    private current: { dir: string; version: number },
    /** The base model's directory (a LoRA policy's versions name it; never pruned). */
    private readonly baseDir: string,
  ) {
    this.entropyCoef = config.entropyCoef;
  }

  /** The entropy coefficient in use (moves each step under adaptive entropy control). */
  entropyCoef: number;

  /**
   * Starts a worker loaded from `modelDir` (with its optimizer.bin, if any) at `version`. PPO: the
   * critic is a value head on the policy (shared), or a second model in the same worker (separate)
   * loaded from modelDir/critic when there is one (a resumed run), else started fresh.
   */
  static async start(opts: {
    modelDir: string; version: number; weightsRoot: string; config: PolicyTrainerConfig;
    /** One of several policies (config.subdir), starting from the base at modelDir rather than its own saved version. */
    fresh?: boolean;
    /** After each restart of the worker: why, and the new worker's pid (null when it gave up). */
    onRestart?: (reason: string, pid: number | null) => void; log?: (line: string) => void;
  }): Promise<PolicyTrainer> {
    const ppo = opts.config.ppo ?? null;
    const separate = ppo?.critic === "separate";
    const w = opts.config.worker;
    const command = w?.backend === "torch"
      ? torchWorkerCommand(await ensureTorchEnv(opts.log), { device: w.device, dtype: w.dtype, gpus: w.gpus, gradientCheckpointing: w.gradientCheckpointing, threads: w.threads ?? 0 })
      : null;
    const worker = await TrainerWorker.start({
      command,
      source: { modelDir: opts.modelDir },
      maxRestarts: 20,
      onRestart: (e) => opts.onRestart?.(e.reason, e.pid),
      valueHead: ppo !== null && !separate,
      critic: separate ? await criticSource(opts.modelDir, opts.weightsRoot, ppo.criticPreset ?? null) : null,
      lora: opts.config.lora ? { ...opts.config.lora, seed: opts.config.seed ?? 0 } : null,
    });
    if (separate) {
      const [p, c] = [(await worker.info()).config.vocab_size, (await worker.critic!.info()).config.vocab_size];
      if (p !== c) {
        await worker.close();
        throw new OozeError("CONFIG_INVALID", `train: ppo.criticPreset: the value model's vocabulary (${c}) differs from the policy's (${p}); it reads the same tokens`);
      }
    }
    const base = isAdapterDir(opts.modelDir) ? adapterBaseDir(opts.modelDir) : resolve(opts.modelDir);
    const t = new PolicyTrainer(worker, opts.weightsRoot, opts.config, { dir: opts.modelDir, version: opts.version }, base);
    // A fresh adapter (PEFT's init: a no-op over the base), or a fresh full policy beside others (a
    // copy of the base, under its name), is version 0: the engines load it first.
    const fresh = opts.config.lora ? !isAdapterDir(opts.modelDir) : opts.config.subdir !== undefined && (opts.fresh ?? false);
    if (fresh) {
      const dir = join(opts.weightsRoot, V0_POLICIES, opts.config.subdir ?? "");
      await t.saveTo(dir);
      t.current = { dir, version: opts.version };
    }
    return t;
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
    return join(this.weightsRoot, `v${v}`, this.config.subdir ?? "");
  }

  /**
   * Makes the next version without an update (a policy with no samples in a step, beside policies
   * that trained): the current weights and optimizer state saved as version + 1.
   */
  async advance(): Promise<{ modelDir: string; version: number }> {
    const version = this.current.version + 1;
    const dir = this.dirOf(version);
    await this.saveTo(dir);
    this.current = { dir, version };
    this.prune(version);
    return { modelDir: dir, version };
  }

  /** Trains on one batch and saves the next version. */
  async step(samples: readonly TrainSample[]): Promise<TrainStepResult> {
    const c = this.config;
    const ppo = c.ppo ?? null;
    const version = this.current.version + 1;
    const dir = this.dirOf(version);
    const before = this.worker.restarts;
    for (let attempt = 0; ; attempt++) {
      try {
        // PPO: the critic's values of this batch (before any update) give advantages and returns
        const prepared: { samples: readonly (TrainSample | GaeTrainSample)[]; critic: Omit<CriticMetrics, "valueLoss" | "valueClipfrac"> | null } =
          ppo ? await this.withGae(samples, ppo) : { samples, critic: null };
        const parts = miniBatches(prepared.samples, c.updatesPerStep).map((p) => packSamples(p));
        const critic = this.worker.critic;
        const optim = { lr: this.lrAt(version), weightDecay: c.weightDecay, maxGradNorm: c.maxGradNorm, beta2: c.beta2, eps: c.adamEps ?? 1e-8 };
        const value = ppo ? { valueCoef: ppo.valueCoef, valueClip: ppo.valueClip } : {};
        const all: TrainStepMetrics[] = [];
        for (const packed of parts) {
          const m = await this.worker.trainStep(
            packed,
            { epsClip: c.epsClip, epsClipHigh: c.epsClipHigh, entropyCoef: this.entropyCoef, uniformCoef: c.uniformCoef ?? 0, temperature: c.temperature, ...(critic ? {} : value) },
            optim, { microBatchTokens: c.microBatchTokens },
          );
          if (critic) {
            // the separate value model: its value loss only (zero advantages: no policy-gradient term)
            const v = await critic.trainStep({ ...packed, advantages: new Float32Array(packed.advantages.length) }, { temperature: c.temperature, ...value }, optim, { microBatchTokens: c.microBatchTokens });
            Object.assign(m, { valueLoss: v.valueLoss, valueMean: v.valueMean, valueClipfrac: v.valueClipfrac });
          }
          all.push(m);
        }
        const metrics = mergeMetrics(all);
        await this.saveOrRollBack(dir, version);
        this.current = { dir, version };
        const entropyCoef = this.entropyCoef;
        this.entropyCoef = nextEntropyCoef(c, entropyCoef, metrics.entropy, version);
        this.prune(version);
        const criticMetrics = prepared.critic ? { ...prepared.critic, valueLoss: metrics.valueLoss, valueClipfrac: metrics.valueClipfrac } : null;
        return { metrics, critic: criticMetrics, modelDir: dir, version, restarts: this.worker.restarts - before, entropyCoef, entropyTarget: entropyTargetAt(c, version) };
      } catch (e) {
        const retry = e instanceof OozeError && e.code === "WORKER_DIED" && e.retryable && attempt < 10;
        if (!retry) throw e;
        // the worker restarts from its restore point: the previous version (weights and optimizer)
      }
    }
  }

  /**
   * Saves the new version. A save that fails with the worker alive (disk full, a read-only disk)
   * leaves the update applied in the worker but not saved: the worker is loaded back at the previous
   * version before the error goes on, so a retry of the batch applies it once (without this, a
   * checkpoint write failing on a full disk trained the batch twice; found by ooze/testing's
   * disk-full fault). A worker that died is restarted at its restore point by step's retry.
   */
  private async saveOrRollBack(dir: string, version: number): Promise<void> {
    try {
      await this.worker.save(dir, String(version), { optimizer: true });
      this.markPolicy(dir);
    } catch (e) {
      if (e instanceof OozeError && e.code === "WORKER_DIED") throw e;
      await this.worker.load(this.current.dir).catch((le: unknown) => {
        throw new OozeError("NATIVE_FAILED", `saving version ${version} to ${dir} failed (${(e as Error).message}), and reloading version ${this.current.version} from ${this.current.dir} failed too: ${(le as Error).message}`, { cause: e });
      });
      throw e;
    }
  }

  /**
   * One forward over the batch for the critic's values, then GAE over each sample's response: token
   * advantages (whitened over the batch) and returns, with the values as the value clip's reference.
   */
  private async withGae(samples: readonly TrainSample[], ppo: PpoConfig): Promise<{ samples: GaeTrainSample[]; critic: Omit<CriticMetrics, "valueLoss" | "valueClipfrac"> }> {
    const packed = packSamples(samples);
    const fwd = await (this.worker.critic ?? this.worker).logprobs(packed, this.config.temperature);
    if (!fwd.values) throw new OozeError("NATIVE_FAILED", "PPO: the trainer worker has no value head (it should have been created at start)");
    const gae: GaeSample[] = [], values: Float32Array[] = [];
    samples.forEach((s, i) => {
      const p = packed.cuSeqlens[i + 1]! - s.responseLength;
      const v = fwd.values!.slice(p, p + s.responseLength);
      values.push(v);
      gae.push(gaeSampleOf(s, v));
    });
    const { advantages, returns } = computeGae(gae, { gamma: ppo.gamma, lambda: ppo.lambda, whitening: ppo.whitening });
    let n = 0, vSum = 0, rSum = 0;
    samples.forEach((s, i) => {
      for (let t = 0; t < s.responseLength; t++) if (s.lossMask[t]) n++, (vSum += values[i]![t]!), (rSum += returns[i]![t]!);
    });
    return {
      samples: samples.map((s, i) => ({ ...s, advantage: advantages[i]!, oldValues: values[i]!, returns: returns[i]! })),
      critic: {
        explainedVariance: explainedVariance(samples.map((s) => s.lossMask), values, returns),
        valueMean: n ? vSum / n : 0, returnMean: n ? rSum / n : 0,
      },
    };
  }

  /** The learning rate of the step that produces `version`. */
  lrAt(version: number): number {
    return learningRate(this.config, version);
  }

  /** Keeps the two newest version directories (the engines may still read the previous one). */
  private prune(version: number): void {
    const old = version - 2;
    if (old < 0 || resolve(this.dirOf(old)) === this.baseDir) return;
    rmSync(this.dirOf(old), { recursive: true, force: true });
    // the version directory of several policies goes with the last of them
    if (this.config.subdir) rmEmptyDir(join(this.weightsRoot, `v${old}`));
  }

  /**
   * A LoRA policy's version directory, or a full policy's beside others, names the policy, so that
   * engines load it under that name.
   */
  private markPolicy(dir: string): void {
    if (this.config.lora || this.config.subdir !== undefined) writePolicyFile(dir, this.config.policy ?? "default");
  }

  /** Saves the current version (weights + optimizer) to `dir`, e.g. a checkpoint. */
  async saveTo(dir: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.worker.save(dir, String(this.current.version), { optimizer: true });
        this.markPolicy(dir);
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

/** Removes `dir` if it exists and is empty. */
function rmEmptyDir(dir: string): void {
  try {
    if (readdirSync(dir).length === 0) rmSync(dir, { recursive: true, force: true });
  } catch {
    // gone already
  }
}

/**
 * Metrics of several updates (a step's mini-batches, or several policies'): means, except clipfrac
 * (max) and ppoKl (the last, most off-policy).
 */
export function mergeMetrics(ms: TrainStepMetrics[]): TrainStepMetrics {
  const mean = (f: (m: TrainStepMetrics) => number) => ms.reduce((a, m) => a + f(m), 0) / ms.length;
  const last = ms[ms.length - 1]!;
  return {
    ...last,
    loss: mean((m) => m.loss), pgLoss: mean((m) => m.pgLoss), entropy: mean((m) => m.entropy), gradNorm: mean((m) => m.gradNorm),
    valueLoss: mean((m) => m.valueLoss), valueMean: mean((m) => m.valueMean), valueClipfrac: mean((m) => m.valueClipfrac),
    clipfrac: Math.max(...ms.map((m) => m.clipfrac)), numTokens: ms.reduce((a, m) => a + m.numTokens, 0), numSamples: ms.reduce((a, m) => a + m.numSamples, 0),
  };
}

/**
 * What GAE takes of a sample, given its values over the response: the turns' rewards at their ends,
 * and at the end what the turns did not already get of the episode's reward (its total).
 */
export function gaeSampleOf(s: Pick<TrainSample, "lossMask" | "reward" | "metadata" | "index">, values: Float32Array): GaeSample {
  const turns = turnRewardsOf(s);
  const early = turns ? turns.rewards.reduce((a, r) => a + r, 0) : 0;
  return { lossMask: s.lossMask, values, reward: (s.reward ?? 0) - early, turnRewards: turns };
}

/**
 * A sample's per-turn rewards as the rollout records them (metadata.turnRewards: {ends, rewards}, ends
 * being response positions where each turn's model tokens end); null when the task gave none.
 */
export function turnRewardsOf(s: { metadata: Record<string, unknown>; index: number }): GaeSample["turnRewards"] {
  const tr = s.metadata["turnRewards"];
  if (tr === undefined || tr === null) return null;
  const ok = typeof tr === "object" && Array.isArray((tr as { ends?: unknown }).ends) && Array.isArray((tr as { rewards?: unknown }).rewards);
  if (!ok) throw new OozeError("CONFIG_INVALID", `sample ${s.index}: metadata.turnRewards must be {ends: number[], rewards: number[]}`);
  return tr as { ends: number[]; rewards: number[] };
}

/**
 * Where a separate value model starts: modelDir/critic (a checkpoint of a run that had one), else a
 * fresh model of `preset` (in weightsRoot/critic-init), else a copy of the policy's weights.
 */
async function criticSource(modelDir: string, weightsRoot: string, preset: string | null): Promise<TrainerSource> {
  const saved = join(modelDir, CRITIC_DIR);
  if (existsSync(join(saved, "model.safetensors"))) return { modelDir: saved };
  if (preset === null) return { modelDir };
  const dir = join(weightsRoot, "critic-init");
  await initModelDir(preset, dir, 0);
  return { modelDir: dir };
}
