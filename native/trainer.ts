// Typed wrapper of the native Trainer: fills config defaults, queues calls so they never overlap, turns
// native failures into OozeError, and packs samples (prompt + response, response-aligned arrays) into
// the packed per-token batch the native trainer takes.
import { existsSync, mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { OozeError } from "../src/errors.ts";
import { loadNative } from "./load.ts";
import { adapterBaseDir, isAdapterDir } from "./model-dir.ts";
import type {
  LlamaHfConfig,
  LoraConfig,
  NativeForward,
  NativeLossConfig,
  NativeLossMetrics,
  NativeOptimConfig,
  NativeOptimResult,
  NativePackedBatch,
  NativeTrainBatch,
  NativeTrainer,
} from "./index.d.ts";

export type { NativeForward, NativeLossConfig, NativeLossMetrics, NativeOptimConfig, NativeOptimResult, NativePackedBatch, NativeTrainBatch };

/** Loss defaults: PPO clip 0.2 both sides, no dual clip, no KL, no entropy bonus, no uniform cross-entropy, no TIS, per-token mean, temperature 1, no critic loss (value clip 0.2 when on). */
export const defaultLossConfig: NativeLossConfig = {
  epsClip: 0.2, epsClipHigh: 0.2, epsClipC: null, klCoef: 0, klType: "k3", entropyCoef: 0, uniformCoef: 0,
  tisCap: null, reduction: "token", normalizer: null, temperature: 1, valueCoef: 0, valueClip: 0.2,
};

/** AdamW defaults (lr has none). */
export const defaultOptimConfig: Omit<NativeOptimConfig, "lr"> = {
  beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, maxGradNorm: 1,
};

/** The file in a checkpoint directory that holds the AdamW state when saved with `optimizer: true`. */
export const OPTIMIZER_FILE = "optimizer.bin";

/**
 * The file in a checkpoint directory that holds the critic's value head and its AdamW state (beside
 * the HF files, which stay a plain Llama checkpoint that HF loaders and the engines read unchanged).
 */
export const VALUE_HEAD_FILE = "value_head.bin";

/**
 * The folder of an adapter checkpoint that holds its base model when the trainer has no base
 * directory to name (it was built from params, not loaded).
 */
export const BASE_DIR = "base";

/** What `info()` says about the trainer. */
export type TrainerInfo = NonNullable<ReturnType<NativeTrainer["info"]>>;

/** The adapter being trained, as getLora() returns it. */
export type TrainerLora = NonNullable<ReturnType<NativeTrainer["getLora"]>>;

/** How to build a trainer: a config with params (or a seed for random init), or a checkpoint dir. */
export type TrainerSource =
  | { config: Partial<LlamaHfConfig>; params: Float32Array | null; seed: number | null }
  | { modelDir: string };

/** Metrics of trainStep: the loss metrics and the optimizer step's result. */
export type TrainStepMetrics = NativeLossMetrics & NativeOptimResult;

function wrapError(e: unknown, what: string): OozeError {
  if (e instanceof OozeError) return e;
  const msg = e instanceof Error ? e.message : String(e);
  const code = e instanceof TypeError ? "CONFIG_INVALID" : "NATIVE_FAILED";
  return new OozeError(code, `Trainer.${what}: ${msg}`, { cause: e });
}

/** The native trainer with types, defaults and a call queue. */
export class Trainer {
  private queue: Promise<unknown> = Promise.resolve();
  /** The model directory the base was loaded from (null: built from a config and params). */
  private baseDir: string | null = null;

  private constructor(private readonly native: NativeTrainer) {}

  /** Builds a trainer from a config + params/seed, or loads a checkpoint directory. */
  static async create(source: TrainerSource): Promise<Trainer> {
    const addon = loadNative();
    try {
      if ("modelDir" in source) {
        const t = new Trainer(new addon.Trainer());
        await t.load(source.modelDir);
        return t;
      }
      return new Trainer(new addon.Trainer({ config: source.config, params: source.params, seed: source.seed }));
    } catch (e) {
      throw wrapError(e, "create");
    }
  }

  private enqueue<T>(what: string, fn: () => Promise<T> | T): Promise<T> {
    const run = this.queue.then(async () => {
      try {
        return await fn();
      } catch (e) {
        throw wrapError(e, what);
      }
    });
    this.queue = run.catch(() => undefined);
    return run;
  }

  /**
   * Per-token logprobs and entropies (entry i: of tokens[i] given its sequence's earlier tokens; 0 at
   * each sequence start), and with a value head the critic's values aligned the same way.
   */
  logprobs(batch: NativePackedBatch, temperature = 1): Promise<NativeForward> {
    return this.enqueue("logprobs", () => this.native.logprobs(batch, temperature));
  }

  /** Adds the gradient of Σ dLogprobs·logprobs + dEntropy·entropy (+ dValues·values) into the accumulated grads. */
  backward(batch: NativePackedBatch, temperature: number, dLogprobs: Float32Array, dEntropy: Float32Array, dValues: Float32Array | null = null): Promise<void> {
    return this.enqueue("backward", () =>
      dValues ? this.native.backward(batch, temperature, dLogprobs, dEntropy, dValues) : this.native.backward(batch, temperature, dLogprobs, dEntropy));
  }

  /**
   * Gives the trainer a value head if it has none: zeros (V = 0 until it learns), so the first value
   * gradient reaches the head alone. Returns whether one was created.
   */
  ensureValueHead(): Promise<boolean> {
    return this.enqueue("ensureValueHead", () => {
      const i = this.native.info();
      if (!i) throw new OozeError("NATIVE_FAILED", "Trainer.ensureValueHead: no model loaded");
      if (i.valueHead) return false;
      this.native.setValueHead(new Float32Array(i.config.hidden_size + 1));
      return true;
    });
  }

  /** Replaces the value head (hidden_size + 1 floats: weight, then bias). */
  setValueHead(params: Float32Array): Promise<void> {
    return this.enqueue("setValueHead", () => this.native.setValueHead(params));
  }

  /** The value head's params, accumulated grads and AdamW step; null without one. */
  getValueHead(): Promise<{ params: Float32Array; grads: Float32Array; step: number } | null> {
    return this.enqueue("getValueHead", () => this.native.getValueHead());
  }

  /** Forward + policy loss + backward of one micro-batch; grads add up until applyGrads. */
  accumulate(batch: NativeTrainBatch, loss: Partial<NativeLossConfig> = {}): Promise<NativeLossMetrics> {
    return this.enqueue("accumulate", () => this.native.accumulate(batch, { ...defaultLossConfig, ...loss }));
  }

  /** Clip + AdamW step with the accumulated grads, then zero them. */
  applyGrads(optim: Partial<NativeOptimConfig> & { lr: number }): Promise<NativeOptimResult> {
    return this.enqueue("applyGrads", () => this.native.applyGrads({ ...defaultOptimConfig, ...optim }));
  }

  /**
   * One whole step on one batch: zero grads, accumulate, applyGrads. With `microBatchTokens`, the
   * batch is split by whole sequences into micro-batches of at most that many tokens (a longer
   * sequence goes alone), accumulated with the whole batch's normalizer, so the result equals the
   * unsplit step while activations stay bounded by one micro-batch.
   */
  trainStep(
    batch: NativeTrainBatch, loss: Partial<NativeLossConfig>, optim: Partial<NativeOptimConfig> & { lr: number },
    opts: { microBatchTokens: number | null } = { microBatchTokens: null },
  ): Promise<TrainStepMetrics> {
    const lossCfg = { ...defaultLossConfig, ...loss }, optimCfg = { ...defaultOptimConfig, ...optim };
    const parts = opts.microBatchTokens === null ? [batch] : splitTrainBatch(batch, opts.microBatchTokens);
    if (parts.length <= 1) return this.enqueue("trainStep", () => this.native.trainStep(batch, lossCfg, optimCfg));
    return this.enqueue("trainStep", async () => {
      const counts = countMasked(batch);
      const normalizer = lossCfg.normalizer ?? (lossCfg.reduction === "token" ? counts.tokens : counts.samples);
      this.native.zeroGrads();
      const metrics: NativeLossMetrics[] = [];
      for (const part of parts) metrics.push(await this.native.accumulate(part, { ...lossCfg, normalizer }));
      const opt = await this.native.applyGrads(optimCfg);
      return { ...sumMetrics(metrics), ...opt };
    });
  }

  /** Drops accumulated gradients. */
  zeroGrads(): Promise<void> {
    return this.enqueue("zeroGrads", () => this.native.zeroGrads());
  }

  /** A copy of the params (flat, HF tensor order). */
  getParams(): Promise<Float32Array> {
    return this.enqueue("getParams", () => this.native.getParams());
  }

  /** Replaces the params; the optimizer state stays. */
  setParams(params: Float32Array): Promise<void> {
    return this.enqueue("setParams", () => this.native.setParams(params));
  }

  /** A copy of the accumulated gradients. */
  getGrads(): Promise<Float32Array> {
    return this.enqueue("getGrads", () => this.native.getGrads());
  }

  /** Forgets AdamW moments and the step count. */
  resetOptimizer(): Promise<void> {
    return this.enqueue("resetOptimizer", () => this.native.resetOptimizer());
  }

  /**
   * Writes a checkpoint: while the whole model trains, an HF model directory (config.json +
   * model.safetensors, F32) of the current params; while an adapter trains, a PEFT adapter directory
   * (adapter_config.json + adapter_model.safetensors) whose base_model_name_or_path is the base's
   * directory (the one it was loaded from, else a copy written to dir/base once). With `optimizer:
   * true` also the AdamW state of what trains as dir/optimizer.bin; with a value head, the head and
   * its moments as dir/value_head.bin. Those are written first, so a directory whose weights are
   * complete has its matching optimizer and critic state.
   */
  save(dir: string, weightVersion = "", opts: { optimizer: boolean } = { optimizer: false }): Promise<void> {
    return this.enqueue("save", async () => {
      mkdirSync(dir, { recursive: true });
      const info = this.native.info();
      if (opts.optimizer) await this.native.saveOptimizer(join(dir, OPTIMIZER_FILE));
      if (info?.valueHead) await this.native.saveValueHead(join(dir, VALUE_HEAD_FILE));
      if (!info?.lora) return this.native.save(dir, weightVersion);
      let base = this.baseDir;
      if (base === null) {
        base = resolve(dir, BASE_DIR);
        await this.native.save(base, "");
      }
      await this.native.saveLora(dir, weightVersion, base);
    });
  }

  /**
   * Replaces the model with a checkpoint's; grads zeroed; the optimizer state comes from
   * dir/optimizer.bin when there is one, else it is reset; the value head from dir/value_head.bin
   * when there is one, else the trainer has none. A PEFT adapter directory (see save) loads its base
   * model, then the adapter, which trains over the frozen base (the optimizer state is the
   * adapter's, the weight version the adapter's).
   */
  load(dir: string): Promise<{ weightVersion: string; optimizerStep: number | null; valueHead: boolean }> {
    return this.enqueue("load", async () => {
      const adapter = isAdapterDir(dir);
      const base = adapter ? adapterBaseDir(dir) : dir;
      let r = await this.native.load(base);
      this.baseDir = resolve(base);
      if (adapter) r = await this.native.loadLora(dir);
      const opt = join(dir, OPTIMIZER_FILE), head = join(dir, VALUE_HEAD_FILE);
      const optimizerStep = existsSync(opt) ? (await this.native.loadOptimizer(opt)).step : null;
      const valueHead = existsSync(head);
      if (valueHead) await this.native.loadValueHead(head);
      return { weightVersion: r.weightVersion, optimizerStep, valueHead };
    });
  }

  /** Writes the AdamW moments and step count to a file. */
  saveOptimizer(path: string): Promise<void> {
    return this.enqueue("saveOptimizer", () => this.native.saveOptimizer(path));
  }

  /** Replaces the AdamW state from a saveOptimizer file. */
  loadOptimizer(path: string): Promise<{ step: number }> {
    return this.enqueue("loadOptimizer", () => this.native.loadOptimizer(path));
  }

  /**
   * Trains a new LoRA adapter over the frozen base from now on (PEFT's initialisation from `seed`, or
   * `params`), or the whole model again with null; grads and optimizer state start empty.
   */
  setLora(opts: (Partial<LoraConfig> & { seed?: number; params?: Float32Array }) | null): Promise<void> {
    return this.enqueue("setLora", () => this.native.setLora(opts));
  }

  /** The adapter being trained (config, params, grads, step, PEFT tensor layout); null in full mode. */
  getLora(): Promise<TrainerLora | null> {
    return this.enqueue("getLora", () => this.native.getLora());
  }

  /** Replaces the adapter's values; its optimizer state stays. */
  setLoraParams(params: Float32Array): Promise<void> {
    return this.enqueue("setLoraParams", () => this.native.setLoraParams(params));
  }

  /** Writes the adapter in PEFT's format (adapter_config.json + adapter_model.safetensors). */
  saveLora(dir: string, weightVersion = "", baseModel = ""): Promise<void> {
    return this.enqueue("saveLora", () => this.native.saveLora(dir, weightVersion, baseModel));
  }

  /** Trains the PEFT adapter in `dir` over the frozen base from now on (fresh optimizer state). */
  loadLora(dir: string): Promise<{ weightVersion: string }> {
    return this.enqueue("loadLora", () => this.native.loadLora(dir));
  }

  /** Config, parameter count, optimizer step, whether a value head exists, tensor layout and the adapter's config. */
  info(): TrainerInfo {
    const i = this.native.info();
    if (!i) throw new OozeError("NATIVE_FAILED", "Trainer.info: no model loaded");
    return i;
  }
}

/** Masked tokens and samples with at least one masked token. */
function countMasked(b: NativeTrainBatch): { tokens: number; samples: number } {
  let tokens = 0, samples = 0;
  for (let s = 0; s + 1 < b.cuSeqlens.length; s++) {
    let n = 0;
    for (let i = b.cuSeqlens[s]!; i < b.cuSeqlens[s + 1]!; i++) n += b.lossMask[i] ? 1 : 0;
    tokens += n;
    if (n > 0) samples++;
  }
  return { tokens, samples };
}

/** Adds micro-batch metric shares (means were weighted by the global normalizer); min/max over parts with tokens. */
function sumMetrics(ms: NativeLossMetrics[]): NativeLossMetrics {
  const out = { ...ms[0]! };
  for (const m of ms.slice(1)) for (const k of Object.keys(out) as (keyof NativeLossMetrics)[]) out[k] += m[k];
  const withTokens = ms.filter((m) => m.numTokens > 0);
  out.ratioMin = withTokens.length ? Math.min(...withTokens.map((m) => m.ratioMin)) : 0;
  out.ratioMax = withTokens.length ? Math.max(...withTokens.map((m) => m.ratioMax)) : 0;
  return out;
}

/**
 * Splits a training batch by whole sequences into consecutive micro-batches of at most maxTokens
 * tokens each (a sequence longer than maxTokens forms its own micro-batch).
 */
export function splitTrainBatch(b: NativeTrainBatch, maxTokens: number): NativeTrainBatch[] {
  if (!(maxTokens >= 1)) throw new OozeError("CONFIG_INVALID", `microBatchTokens must be >= 1, got ${maxTokens}`);
  const parts: NativeTrainBatch[] = [];
  const nSeq = b.cuSeqlens.length - 1;
  let s0 = 0;
  while (s0 < nSeq) {
    let s1 = s0 + 1;
    while (s1 < nSeq && b.cuSeqlens[s1 + 1]! - b.cuSeqlens[s0]! <= maxTokens) s1++;
    const a = b.cuSeqlens[s0]!, e = b.cuSeqlens[s1]!;
    parts.push({
      tokens: b.tokens.slice(a, e),
      cuSeqlens: b.cuSeqlens.slice(s0, s1 + 1).map((v) => v - a),
      lossMask: b.lossMask.slice(a, e),
      advantages: b.advantages.slice(a, e),
      oldLogprobs: b.oldLogprobs.slice(a, e),
      rolloutLogprobs: b.rolloutLogprobs ? b.rolloutLogprobs.slice(a, e) : null,
      refLogprobs: b.refLogprobs ? b.refLogprobs.slice(a, e) : null,
      oldValues: b.oldValues ? b.oldValues.slice(a, e) : null,
      returns: b.returns ? b.returns.slice(a, e) : null,
    });
    s0 = s1;
  }
  return parts;
}

/** What packSamples needs of a sample (a subset of src/sample.ts's Sample). */
export interface SampleToPack {
  /** Prompt ids followed by response ids. */
  tokens: Int32Array;
  responseLength: number;
  /** Over the response: 1 = model token. */
  lossMask: Uint8Array;
  /** Over the response: the engine's logprobs, or null. */
  rolloutLogprobs: Float32Array | null;
  /** One advantage for the whole sample, or one per response token. */
  advantage: number | Float32Array;
  /** PPO: over the response, the critic's values the returns were computed with (value clip). */
  oldValues?: Float32Array | null;
  /** PPO: over the response, the value targets. */
  returns?: Float32Array | null;
}

/**
 * Packs samples into one training batch with per-token arrays aligned with the packed tokens; prompt
 * positions are masked out. oldValues and returns are packed when every sample has them (PPO). oldLogprobs starts as the rollout logprobs (or zeros): fill it with
 * Trainer.logprobs for a recomputed old policy. rolloutLogprobs is null when any sample lacks them.
 */
export function packSamples(samples: readonly SampleToPack[]): NativeTrainBatch {
  const total = samples.reduce((n, s) => n + s.tokens.length, 0);
  const tokens = new Int32Array(total), cuSeqlens = new Int32Array(samples.length + 1);
  const lossMask = new Uint8Array(total), advantages = new Float32Array(total);
  const rollout = new Float32Array(total);
  let haveRollout = samples.length > 0;
  const critic = samples.length > 0 && samples.every((s) => s.oldValues && s.returns);
  const oldValues = critic ? new Float32Array(total) : null, returns = critic ? new Float32Array(total) : null;
  let off = 0;
  samples.forEach((s, i) => {
    const n = s.tokens.length, p = n - s.responseLength;
    if (p < 1) throw new OozeError("CONFIG_INVALID", `packSamples: sample ${i} has no prompt token before its response (responseLength ${s.responseLength}, tokens ${n})`);
    if (s.lossMask.length !== s.responseLength) throw new OozeError("CONFIG_INVALID", `packSamples: sample ${i} lossMask has ${s.lossMask.length} entries, responseLength is ${s.responseLength}`);
    tokens.set(s.tokens, off);
    lossMask.set(s.lossMask, off + p);
    if (typeof s.advantage === "number") advantages.fill(s.advantage, off + p, off + n);
    else advantages.set(s.advantage, off + p);
    if (s.rolloutLogprobs) rollout.set(s.rolloutLogprobs, off + p);
    else haveRollout = false;
    if (oldValues && returns) oldValues.set(s.oldValues!, off + p), returns.set(s.returns!, off + p);
    off += n;
    cuSeqlens[i + 1] = off;
  });
  return {
    tokens, cuSeqlens, lossMask, advantages,
    oldLogprobs: haveRollout ? rollout.slice() : new Float32Array(total),
    rolloutLogprobs: haveRollout ? rollout : null,
    refLogprobs: null,
    oldValues,
    returns,
  };
}
