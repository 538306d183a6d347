// The engines a training run generates with: embedded ones started as `ooze serve` child processes
// (a native crash there kills an engine, not the run), external URLs, and the small Generator
// interface the rollout side uses, implemented over the Fleet (cache-aware routing, partial-rollout
// re-dispatch, retries of failed dispatches and progress deadlines). Weight updates are the
// weight-sync actor's (through the fleet actor), not the Generator's.
import { spawn, type ChildProcess } from "node:child_process";
import { Fleet, type FaultStats, type FleetGenerateRequest, type FleetOptions } from "../../src/engine/fleet/fleet.ts";
import type { LengthLimits } from "../../src/engine/limits.ts";
import type { WireSamplingParams } from "../../src/engine/protocol.ts";
import { OozeError } from "../../src/errors.ts";
import { oozeBin } from "../../src/package-root.ts";

/** One generation's result: ids and logprobs exactly as sampled, the weight version of each run of ids. */
export interface GenOutput {
  outputIds: Int32Array;
  logprobs: Float32Array;
  status: "completed" | "truncated" | "aborted";
  /** `[start, end)` over outputIds with the weight version that sampled them. */
  weightVersions: { start: number; end: number; version: string }[];
}

/** One generation request of the rollout side. */
export interface GenRequest {
  inputIds: Int32Array;
  sampling: WireSamplingParams;
  sessionId: string;
  /** The LoRA adapter to generate with (a role's policy); absent: the generator's default (FleetGenerator.lora). */
  lora?: string | null;
  signal?: AbortSignal;
}

/** What the rollout side needs of the engines. */
export interface Generator {
  /**
   * One generation, token-in/token-out, with logprobs; `sessionId` keeps an episode on one engine.
   * An aborted `signal` ends it early with status "aborted" (or rejects), never re-dispatched.
   */
  generate(req: GenRequest): Promise<GenOutput>;
  /** Prefix-cache hits / prompt tokens since the last call (0 when nothing was generated). */
  takeCacheStats(): { promptTokens: number; cachedTokens: number };
  /** The engines' length limits (src/engine/limits.ts), null when unknown: episodes size their requests to them. */
  lengthLimits?(): LengthLimits | null;
}

/** An engine child process (`ooze serve --model DIR --port 0`). */
export interface EngineProcess {
  url: string;
  pid: number;
  /** Resolves when the process has exited (for whatever reason). */
  exited: Promise<void>;
  stop(): Promise<void>;
}

/** Starts `ooze serve` on a free loopback port and waits for its URL line. */
export async function startEngineProcess(opts: { modelDir: string; maxRunning: number; cacheTokens: number; weightVersion: string }): Promise<EngineProcess> {
  const args = [oozeBin(), "serve", "--model", opts.modelDir, "--port", "0", "--max-running", String(opts.maxRunning),
    "--cache-tokens", String(opts.cacheTokens), "--weight-version", opts.weightVersion, "--parent-pid", String(process.pid)];
  // Its own process group: a Ctrl-C in the terminal reaches `ooze train`, which stops it in order.
  const child: ChildProcess = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"], detached: true });
  let stderr = "";
  child.stderr!.on("data", (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-4000);
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    const onData = (c: Buffer) => {
      out += c.toString();
      const m = /serving .* at (http:\/\/\S+)/.exec(out);
      if (m) {
        child.stdout!.off("data", onData);
        child.stdout!.resume();
        resolve(m[1]!);
      }
    };
    child.stdout!.on("data", onData);
    child.once("exit", (code, signal) =>
      reject(new OozeError("ENGINE_UNAVAILABLE", `engine process for ${opts.modelDir} exited (${signal ?? code}) before serving: ${stderr.trim()}`)),
    );
  });
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  return {
    url,
    pid: child.pid!,
    exited,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(t);
    },
  };
}

/** Generator over a Fleet (src/engine/fleet/fleet.ts): cache-aware routing, partial rollout across engines. */
export class FleetGenerator implements Generator {
  private promptTokens = 0;
  private cachedTokens = 0;
  /** The LoRA adapter (the job's LoRA policy) every request generates with; null: the base model. */
  lora: string | null = null;

  private constructor(readonly fleet: Fleet) {}

  /**
   * A fleet with the given engines attached. `opts` tunes its retries and progress deadlines
   * (FleetOptions: progressTimeoutMs, maxRetries, …); routing is cache-aware unless given.
   */
  static async create(urls: readonly string[], log?: (line: string) => void, opts: FleetOptions = {}): Promise<FleetGenerator> {
    const fleet = new Fleet({ routing: "cache_aware", ...opts, ...(log ? { log } : {}) });
    try {
      for (const u of urls) await fleet.attach(u);
    } catch (e) {
      await fleet.close();
      throw e;
    }
    return new FleetGenerator(fleet);
  }

  // (not an async function: a rollout process holds thousands of these calls in flight, and a
  // suspended frame of its own for each would be a dozen more objects for its collector to trace)
  generate(req: GenRequest): Promise<GenOutput> {
    const prompt = req.inputIds.length;
    const fleetReq: FleetGenerateRequest = { inputIds: req.inputIds, sampling: req.sampling, sessionId: req.sessionId, lora: req.lora !== undefined ? req.lora : this.lora };
    if (req.signal) fleetReq.signal = req.signal;
    return this.fleet.generate(fleetReq).then((r) => {
      this.count(prompt, r.cachedTokens);
      return { outputIds: r.outputIds, logprobs: r.logprobs, status: r.status, weightVersions: r.weightVersions };
    });
  }

  lengthLimits(): LengthLimits | null {
    return this.fleet.lengthLimits();
  }

  /** The fleet's generate and endSession as they are (the agent gateway's view), counted in takeCacheStats like generate(). */
  countingFleet(): Pick<Fleet, "generate" | "endSession"> {
    return {
      generate: async (req) => {
        const r = await this.fleet.generate(req.lora === undefined && this.lora ? { ...req, lora: this.lora } : req);
        this.count(req.inputIds.length, r.cachedTokens);
        return r;
      },
      endSession: (id) => this.fleet.endSession(id),
    };
  }

  private count(promptTokens: number, cachedTokens: number): void {
    this.promptTokens += promptTokens;
    this.cachedTokens += Math.min(cachedTokens, promptTokens);
  }

  takeCacheStats(): { promptTokens: number; cachedTokens: number } {
    const s = { promptTokens: this.promptTokens, cachedTokens: this.cachedTokens };
    this.promptTokens = 0;
    this.cachedTokens = 0;
    return s;
  }

  /** Engine faults the fleet recovered from (and those that exhausted a request's retries) since the last call. */
  takeFaultStats(): FaultStats {
    return this.fleet.takeFaultStats();
  }

  async close(): Promise<void> {
    await this.fleet.close();
  }
}
