// TrainerWorker: supervises a trainer worker child process (native/worker/main.ts) and forwards Trainer
// calls to it. When the child dies (SIGKILL, SIGSEGV, any exit), every call in flight rejects with a
// retryable WORKER_DIED OozeError and a fresh child is started from the last restore point: the last
// checkpoint directory it saved or loaded, or the last params it was given or snapshotted.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { OozeError, type WireError } from "../../src/errors.ts";
import { freshDist, packageRoot } from "../../src/package-root.ts";
import type { LlamaHfConfig, LoraConfig, TensorLayout } from "../index.d.ts";
import type {
  NativeForward,
  NativeLossConfig,
  NativeLossMetrics,
  NativeOptimConfig,
  NativeOptimResult,
  NativePackedBatch,
  NativeTrainBatch,
  TrainerLora,
  TrainerSource,
  TrainStepMetrics,
} from "../trainer.ts";
import { encodeFrame, FrameDecoder, type WorkerOp, type WorkerReply } from "./protocol.ts";

const here = dirname(fileURLToPath(import.meta.url));

/**
 * How to start the worker: the compiled main.js with plain node in an installed package
 * (dist/native/worker/) and in a checkout whose dist/ is fresh; else main.ts under tsx.
 */
function workerCommand(): string[] {
  const source = join(here, "main.ts");
  if (!existsSync(source)) return [join(here, "main.js")];
  const dist = freshDist(); // the checkout's compiled twin, when built from these very sources
  if (dist !== null) return [join(dist, "native", "worker", "main.js")];
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
  return ["--import", tsx, source];
}

/** Options of TrainerWorker.start. */
export interface TrainerWorkerOptions {
  /** What the first worker loads; later restarts use the latest restore point. */
  source: TrainerSource;
  /** Restarts allowed over the worker's life before it gives up (default 10). */
  maxRestarts?: number;
  /** Called after each restart completes (or fails: error is set). */
  onRestart?: (event: { restarts: number; pid: number | null; reason: string; error: OozeError | null }) => void;
  /** Extra environment for the child. */
  env?: Record<string, string>;
  /**
   * The worker process to run instead of the native one: a program speaking the same protocol (the
   * PyTorch worker: torch-env.ts torchWorkerCommand). Absent: the native worker.
   */
  command?: { file: string; args: string[]; env: Record<string, string> } | null;
  /**
   * Give the trainer the critic's value head: every (re)started worker that loads no value head
   * from its restore point gets a zero one (default false).
   */
  valueHead?: boolean;
  /**
   * A separate value model (PPO, `critic: separate`): a second Trainer in the same worker process,
   * loaded from this source, with a value head. It is saved to and restored from `critic/` inside
   * the policy's checkpoint directories.
   */
  critic?: TrainerSource | null;
  /**
   * Train a LoRA adapter over the frozen base: every (re)started worker whose restore point carries
   * no adapter (a checkpoint directory's adapter/, see Trainer.save) gets a fresh one, PEFT's
   * initialisation from `seed`. Absent or null: the whole model trains.
   */
  lora?: (Partial<LoraConfig> & { seed?: number }) | null;
}

/** The critic's directory inside a checkpoint directory (HF loaders and weight sync ignore subdirectories). */
export const CRITIC_DIR = "critic";

/** The separate value model's calls (they go to the worker's second Trainer). */
export interface CriticCalls {
  /** Per-token values (and the critic model's own logprobs). */
  logprobs(batch: NativePackedBatch, temperature?: number): Promise<NativeForward>;
  /** One update of the critic (value loss with valueCoef; its policy terms vanish with zero advantages). */
  trainStep(
    batch: NativeTrainBatch, loss: Partial<NativeLossConfig>, optim: Partial<NativeOptimConfig> & { lr: number },
    opts?: { microBatchTokens: number | null },
  ): Promise<TrainStepMetrics>;
  getValueHead(): Promise<{ params: Float32Array; grads: Float32Array; step: number } | null>;
  getParams(): Promise<Float32Array>;
  info(): Promise<WorkerModelInfo>;
}

interface Pending {
  op: WorkerOp;
  resolve: (v: unknown) => void;
  reject: (e: OozeError) => void;
}

/** Model info as the worker reports it. */
export type WorkerModelInfo = {
  config: LlamaHfConfig;
  numParams: number;
  step: number;
  valueHead: boolean;
  tensors: TensorLayout[];
  /** The adapter being trained (absent from workers that do not implement LoRA). */
  lora?: (LoraConfig & { numParams: number }) | null;
};

/** A Trainer in a supervised child process; same methods as native/trainer.ts's Trainer. */
export class TrainerWorker {
  private child: ChildProcess | null = null;
  private ready: Promise<void> = Promise.resolve();
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private restorePoint: TrainerSource;
  private criticRestorePoint: TrainerSource | null;
  private restartCount = 0;
  private closed = false;
  private fatal: OozeError | null = null;
  private readonly maxRestarts: number;

  private constructor(private readonly opts: TrainerWorkerOptions) {
    this.restorePoint = TrainerWorker.absolute(opts.source);
    this.criticRestorePoint = opts.critic ? TrainerWorker.absolute(opts.critic) : null;
    this.maxRestarts = opts.maxRestarts ?? 10;
  }

  /** Spawns the worker and loads `source` into it. */
  static async start(opts: TrainerWorkerOptions): Promise<TrainerWorker> {
    const w = new TrainerWorker(opts);
    w.ready = w.boot();
    try {
      await w.ready;
    } catch (e) {
      w.closed = true;
      w.child?.kill("SIGKILL");
      throw e;
    }
    return w;
  }

  /** The child's pid (null while none runs). */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  /** How many times the worker was restarted. */
  get restarts(): number {
    return this.restartCount;
  }

  /** What a restart would load now. */
  get restoreSource(): TrainerSource {
    return this.restorePoint;
  }

  /** Sets what the next restart loads (a checkpoint dir, or a config with params). */
  setRestorePoint(source: TrainerSource): void {
    this.restorePoint = TrainerWorker.absolute(source);
  }

  private static absolute(s: TrainerSource): TrainerSource {
    return "modelDir" in s ? { modelDir: resolve(s.modelDir) } : s;
  }

  private async boot(): Promise<void> {
    const cmd = this.opts.command ?? null;
    const child = spawn(cmd ? cmd.file : process.execPath, cmd ? cmd.args : workerCommand(), {
      cwd: packageRoot(),
      stdio: ["pipe", "pipe", "inherit"],
      env: { ...process.env, ...cmd?.env, ...this.opts.env },
    });
    this.child = child;
    const decoder = new FrameDecoder();
    child.stdout!.on("data", (chunk: Buffer) => {
      let msgs: unknown[];
      try {
        msgs = decoder.push(chunk);
      } catch {
        child.kill("SIGKILL"); // a corrupt stream: treat as a dead worker
        return;
      }
      for (const m of msgs) this.onReply(m as WorkerReply);
    });
    child.stdin!.on("error", () => undefined); // EPIPE when it died; 'exit' handles it
    child.on("exit", (code, signal) => this.onExit(child, code, signal));
    child.on("error", (e) => this.onExit(child, null, null, e));
    const info = (await this.send("init", [this.restorePoint], child)) as WorkerModelInfo;
    if (this.opts.lora && !info.lora) await this.send("setLora", [this.opts.lora], child);
    if (this.opts.valueHead) await this.send("ensureValueHead", [], child);
    if (this.criticRestorePoint) {
      await this.send("init", [this.criticRestorePoint], child, "critic");
      await this.send("ensureValueHead", [], child, "critic");
    }
  }

  private onReply(r: WorkerReply): void {
    const p = this.pending.get(r.id);
    if (!p) return;
    this.pending.delete(r.id);
    if (r.ok) p.resolve(r.result);
    else p.reject(OozeError.fromWire(r.error as WireError));
  }

  private onExit(child: ChildProcess, code: number | null, signal: NodeJS.Signals | null, err?: Error): void {
    if (this.child !== child) return;
    this.child = null;
    const how = err ? `failed to spawn: ${err.message}` : signal ? `was killed by ${signal}` : `exited with code ${code}`;
    const reason = `trainer worker pid ${child.pid ?? "?"} ${how}`;
    for (const [id, p] of this.pending) {
      this.pending.delete(id);
      p.reject(new OozeError("WORKER_DIED", `${reason} during ${p.op}; it restarts from its last restore point, retry the call`, { retryable: true }));
    }
    if (this.closed) return;
    if (this.restartCount >= this.maxRestarts) {
      this.fatal = new OozeError("WORKER_DIED", `${reason}; gave up after ${this.restartCount} restarts (maxRestarts ${this.maxRestarts})`, { retryable: false });
      this.opts.onRestart?.({ restarts: this.restartCount, pid: null, reason, error: this.fatal });
      return;
    }
    this.restartCount++;
    this.ready = this.boot().then(
      () => this.opts.onRestart?.({ restarts: this.restartCount, pid: this.pid, reason, error: null }),
      (e: unknown) => {
        // Died again while loading: onExit has already started the next restart (or given up).
        if (e instanceof OozeError && e.code === "WORKER_DIED" && e.retryable) return;
        const cause = e instanceof OozeError ? e : new OozeError("WORKER_DIED", String(e));
        this.fatal = new OozeError("WORKER_DIED", `${reason}; restart failed: ${cause.message}`, { retryable: false, cause });
        this.child?.kill("SIGKILL");
        this.opts.onRestart?.({ restarts: this.restartCount, pid: null, reason, error: this.fatal });
        throw this.fatal;
      },
    );
    this.ready.catch(() => undefined);
  }

  private send(op: WorkerOp, args: unknown[], child: ChildProcess, target: "policy" | "critic" = "policy"): Promise<unknown> {
    return new Promise((res, rej) => {
      const id = this.nextId++;
      this.pending.set(id, { op, resolve: res, reject: rej });
      child.stdin!.write(encodeFrame(target === "critic" ? { id, op, args, target } : { id, op, args }));
    });
  }

  /** Waits for a running worker, then sends one request (to the policy, or to the separate critic). */
  private async call<T>(op: WorkerOp, args: unknown[], target: "policy" | "critic" = "policy"): Promise<T> {
    if (this.closed) throw new OozeError("WORKER_DIED", `trainer worker is closed; ${op} was not sent`);
    for (;;) {
      const r = this.ready;
      await r.catch(() => undefined);
      if (r === this.ready) break; // no restart began while waiting
    }
    if (this.fatal) throw this.fatal;
    if (!this.child) throw new OozeError("WORKER_DIED", `trainer worker is not running; ${op} was not sent`, { retryable: true });
    if (target === "critic" && !this.criticRestorePoint) throw new OozeError("CONFIG_INVALID", `trainer worker has no separate critic; ${op} was not sent`);
    return (await this.send(op, args, this.child, target)) as T;
  }

  /** The separate value model, or null when the worker has none. */
  get critic(): CriticCalls | null {
    if (!this.criticRestorePoint) return null;
    return {
      logprobs: (batch, temperature = 1) => this.call("logprobs", [batch, temperature], "critic"),
      trainStep: (batch, loss, optim, opts = { microBatchTokens: null }) => this.call("trainStep", [batch, loss, optim, opts], "critic"),
      getValueHead: () => this.call("getValueHead", [], "critic"),
      getParams: () => this.call("getParams", [], "critic"),
      info: () => this.call("info", [], "critic"),
    };
  }

  /** Per-token logprobs, entropies and (with a value head) values (see Trainer.logprobs). */
  logprobs(batch: NativePackedBatch, temperature = 1): Promise<NativeForward> {
    return this.call("logprobs", [batch, temperature]);
  }
  /** Replaces (or creates) the value head: hidden_size + 1 floats, weight then bias. Not part of the restore point. */
  setValueHead(params: Float32Array): Promise<void> {
    return this.call("setValueHead", [params]);
  }
  /** The value head's params, grads and AdamW step, or null (see Trainer.getValueHead). */
  getValueHead(): Promise<{ params: Float32Array; grads: Float32Array; step: number } | null> {
    return this.call("getValueHead", []);
  }
  /** Adds the gradient of Σ dLogprobs·logprobs + dEntropy·entropy into the grads. */
  backward(batch: NativePackedBatch, temperature: number, dLogprobs: Float32Array, dEntropy: Float32Array): Promise<void> {
    return this.call("backward", [batch, temperature, dLogprobs, dEntropy]);
  }
  /** Forward + loss + backward of one micro-batch. */
  accumulate(batch: NativeTrainBatch, loss: Partial<NativeLossConfig> = {}): Promise<NativeLossMetrics> {
    return this.call("accumulate", [batch, loss]);
  }
  /** Clip + AdamW step, then zero the grads. */
  applyGrads(optim: Partial<NativeOptimConfig> & { lr: number }): Promise<NativeOptimResult> {
    return this.call("applyGrads", [optim]);
  }
  /** zeroGrads + accumulate + applyGrads, optionally in micro-batches (see Trainer.trainStep). */
  trainStep(
    batch: NativeTrainBatch, loss: Partial<NativeLossConfig>, optim: Partial<NativeOptimConfig> & { lr: number },
    opts: { microBatchTokens: number | null } = { microBatchTokens: null },
  ): Promise<TrainStepMetrics> {
    return this.call("trainStep", [batch, loss, optim, opts]);
  }
  zeroGrads(): Promise<void> {
    return this.call("zeroGrads", []);
  }
  getParams(): Promise<Float32Array> {
    return this.call("getParams", []);
  }
  getGrads(): Promise<Float32Array> {
    return this.call("getGrads", []);
  }
  resetOptimizer(): Promise<void> {
    return this.call("resetOptimizer", []);
  }
  info(): Promise<WorkerModelInfo> {
    return this.call("info", []);
  }
  /** The adapter being trained: config, params, grads, step, PEFT layout; null when the whole model trains. */
  getLora(): Promise<TrainerLora | null> {
    return this.call("getLora", []);
  }
  /** Writes the adapter in PEFT's format (adapter_config.json + adapter_model.safetensors). */
  saveLora(dir: string, weightVersion = "", baseModel = ""): Promise<void> {
    return this.call("saveLora", [resolve(dir), weightVersion, baseModel]);
  }
  /**
   * Trains a new adapter over the frozen base (PEFT's initialisation from `seed`, or `params` in its
   * layout), or the whole model with null (see Trainer.setLora). Not part of the restore point.
   */
  setLora(opts: (Partial<LoraConfig> & { seed?: number; params?: Float32Array }) | null): Promise<void> {
    return this.call("setLora", [opts]);
  }
  /** Trains the PEFT adapter in `dir` over the frozen base (fresh optimizer state). Not part of the restore point. */
  loadLora(dir: string): Promise<{ weightVersion: string }> {
    return this.call("loadLora", [resolve(dir)]);
  }
  /** The worker's pid as it reports it. */
  ping(): Promise<{ pid: number }> {
    return this.call("ping", []);
  }

  /** Replaces the params; they become the restore point (this object keeps the copy). */
  async setParams(params: Float32Array): Promise<void> {
    await this.call("setParams", [params]);
    const info = await this.info();
    this.restorePoint = { config: info.config, params: params.slice(), seed: null };
  }

  /** Copies the current params out of the worker and makes them the restore point; returns them. */
  async snapshot(): Promise<Float32Array> {
    const info = await this.info();
    const params = await this.getParams();
    this.restorePoint = { config: info.config, params, seed: null };
    return params;
  }

  /**
   * Saves an HF checkpoint (with `optimizer: true` also the AdamW state, which a restart then loads
   * too); the directory becomes the restore point.
   */
  async save(dir: string, weightVersion = "", opts: { optimizer: boolean } = { optimizer: false }): Promise<void> {
    const abs = resolve(dir);
    // the separate critic first, into dir/critic: both restore points move together, after both are saved
    if (this.criticRestorePoint) await this.call("save", [join(abs, CRITIC_DIR), weightVersion, { optimizer: true }], "critic");
    await this.call("save", [abs, weightVersion, opts]);
    this.restorePoint = { modelDir: abs };
    if (this.criticRestorePoint) this.criticRestorePoint = { modelDir: join(abs, CRITIC_DIR) };
  }

  /** Loads a checkpoint (and its optimizer.bin and value_head.bin if any) into the worker; the directory becomes the restore point. */
  async load(dir: string): Promise<{ weightVersion: string; optimizerStep: number | null; valueHead: boolean }> {
    const abs = resolve(dir);
    const r = await this.call<{ weightVersion: string; optimizerStep: number | null; valueHead: boolean }>("load", [abs]);
    if (this.opts.valueHead && !r.valueHead) await this.call("ensureValueHead", []);
    if (this.criticRestorePoint && existsSync(join(abs, CRITIC_DIR, "model.safetensors"))) {
      await this.call("load", [join(abs, CRITIC_DIR)], "critic");
      await this.call("ensureValueHead", [], "critic");
      this.criticRestorePoint = { modelDir: join(abs, CRITIC_DIR) };
    }
    this.restorePoint = { modelDir: abs };
    return r;
  }

  /** Writes the worker's AdamW state to a file. */
  saveOptimizer(path: string): Promise<void> {
    return this.call("saveOptimizer", [resolve(path)]);
  }

  /** Replaces the worker's AdamW state from a file (not part of the restore point). */
  loadOptimizer(path: string): Promise<{ step: number }> {
    return this.call("loadOptimizer", [resolve(path)]);
  }

  /** Test-only fault injection: a call the worker never answers (it rejects when the worker dies). */
  hangForTest(): Promise<void> {
    return this.call("hang", []);
  }

  /** Stops the worker (closes its stdin, then kills it if it lingers) and rejects any call in flight. */
  async close(): Promise<void> {
    this.closed = true;
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((res) => child.once("exit", () => res()));
    child.stdin!.end();
    const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }
}
