// The engines a training run generates with: embedded ones started as `ooze serve` child processes
// (a native crash there kills an engine, not the run), external URLs, and the small Generator
// interface the rollout side uses, implemented over the Fleet (cache-aware routing, partial-rollout
// re-dispatch, pause → update → continue) or, as a minimal fallback, round-robin over EngineClients.
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet } from "../../src/engine/fleet.ts";
import type { WireSamplingParams } from "../../src/engine/protocol.ts";
import { OozeError } from "../../src/errors.ts";

const OOZE_BIN = fileURLToPath(new URL("../../bin/ooze.mjs", import.meta.url));

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
  signal?: AbortSignal;
}

/** What the rollout side needs of the engines. */
export interface Generator {
  /**
   * One generation, token-in/token-out, with logprobs; `sessionId` keeps an episode on one engine.
   * An aborted `signal` ends it early with status "aborted" (or rejects), never re-dispatched.
   */
  generate(req: GenRequest): Promise<GenOutput>;
  /**
   * Loads `modelDir` as weight version `version` on every engine; resolves when all report it.
   * `opts.loadFormat` (e.g. "ooze-delta": modelDir is then a delta file) is sent as load_format;
   * `opts.fullModelDir` is the same version as a model directory, for engines that refuse it or join later.
   */
  updateWeights(modelDir: string, version: string, opts?: { loadFormat?: string; fullModelDir?: string }): Promise<void>;
  /** Replaces a dead engine by a new one (at the current weights). */
  replace(oldUrl: string, newUrl: string): Promise<void>;
  /** Prefix-cache hits / prompt tokens since the last call (0 when nothing was generated). */
  takeCacheStats(): { promptTokens: number; cachedTokens: number };
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
  const args = [OOZE_BIN, "serve", "--model", opts.modelDir, "--port", "0", "--max-running", String(opts.maxRunning),
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

/** Generator over a fixed list of engines: session affinity, otherwise round-robin. */
export class EnginePool implements Generator {
  private readonly clients: EngineClient[];
  private next = 0;
  private readonly affinity = new Map<string, number>();
  private promptTokens = 0;
  private cachedTokens = 0;

  constructor(urls: readonly string[]) {
    if (urls.length === 0) throw new OozeError("CONFIG_INVALID", "EnginePool needs at least one engine URL");
    this.clients = urls.map((u) => new EngineClient(u));
  }

  get urls(): string[] {
    return this.clients.map((c) => c.url);
  }

  async generate(req: GenRequest): Promise<GenOutput> {
    let i = this.affinity.get(req.sessionId);
    if (i === undefined) {
      i = this.next++ % this.clients.length;
      this.affinity.set(req.sessionId, i);
    }
    const res = await this.clients[i]!.generate({
      inputIds: req.inputIds, sampling: req.sampling, returnLogprob: true, routingKey: req.sessionId, ...(req.signal ? { signal: req.signal } : {}),
    });
    this.promptTokens += res.meta.promptTokens;
    this.cachedTokens += res.meta.cachedTokens;
    const n = res.outputIds.length;
    return {
      outputIds: res.outputIds, logprobs: res.logprobs, status: res.status,
      weightVersions: n > 0 ? [{ start: 0, end: n, version: res.meta.weightVersion ?? "0" }] : [],
    };
  }

  async replace(oldUrl: string, newUrl: string): Promise<void> {
    const i = this.clients.findIndex((c) => c.url === oldUrl.replace(/\/+$/, ""));
    if (i >= 0) this.clients[i] = new EngineClient(newUrl);
  }

  /** Ends a session's affinity (the episode is over). */
  endSession(sessionId: string): void {
    this.affinity.delete(sessionId);
  }

  async updateWeights(modelDir: string, version: string, opts: { loadFormat?: string; fullModelDir?: string } = {}): Promise<void> {
    await Promise.all(
      this.clients.map(async (c) => {
        await c.pauseGeneration("in_place");
        try {
          let r = await c.updateWeightsFromDisk({ modelPath: modelDir, weightVersion: version, ...(opts.loadFormat ? { loadFormat: opts.loadFormat } : {}) });
          // an engine that refuses a delta (other base version, corrupt file) loads the full checkpoint
          if (!r.success && opts.fullModelDir) r = await c.updateWeightsFromDisk({ modelPath: opts.fullModelDir, weightVersion: version });
          if (!r.success) throw new OozeError("ENGINE_REJECTED", `${c.url}: update_weights_from_disk(${modelDir}) failed: ${r.message}`);
        } finally {
          await c.continueGeneration();
        }
        const got = await c.weightVersion();
        if (got !== version) throw new OozeError("ENGINE_REJECTED", `${c.url}: reports weight_version ${got} after loading version ${version}`);
      }),
    );
  }

  takeCacheStats(): { promptTokens: number; cachedTokens: number } {
    const s = { promptTokens: this.promptTokens, cachedTokens: this.cachedTokens };
    this.promptTokens = 0;
    this.cachedTokens = 0;
    return s;
  }
}

/** Generator over a Fleet (src/engine/fleet.ts): cache-aware routing, partial rollout across engines. */
export class FleetGenerator implements Generator {
  private promptTokens = 0;
  private cachedTokens = 0;

  private constructor(readonly fleet: Fleet) {}

  /** A fleet with the given engines attached. */
  static async create(urls: readonly string[], log?: (line: string) => void): Promise<FleetGenerator> {
    const fleet = new Fleet({ routing: "cache_aware", ...(log ? { log } : {}) });
    try {
      for (const u of urls) await fleet.attach(u);
    } catch (e) {
      await fleet.close();
      throw e;
    }
    return new FleetGenerator(fleet);
  }

  async generate(req: GenRequest): Promise<GenOutput> {
    const r = await this.fleet.generate({ inputIds: req.inputIds, sampling: req.sampling, sessionId: req.sessionId, ...(req.signal ? { signal: req.signal } : {}) });
    this.count(req.inputIds.length, r.cachedTokens);
    return { outputIds: r.outputIds, logprobs: r.logprobs, status: r.status, weightVersions: r.weightVersions };
  }

  /** The fleet's generate and endSession as they are (the agent gateway's view), counted in takeCacheStats like generate(). */
  countingFleet(): Pick<Fleet, "generate" | "endSession"> {
    return {
      generate: async (req) => {
        const r = await this.fleet.generate(req);
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

  async updateWeights(modelDir: string, version: string, opts: { loadFormat?: string; fullModelDir?: string } = {}): Promise<void> {
    await this.fleet.updateWeights(modelDir, version, opts);
  }

  async replace(oldUrl: string, newUrl: string): Promise<void> {
    await this.fleet.detach(oldUrl).catch(() => undefined);
    await this.fleet.attach(newUrl);
  }

  takeCacheStats(): { promptTokens: number; cachedTokens: number } {
    const s = { promptTokens: this.promptTokens, cachedTokens: this.cachedTokens };
    this.promptTokens = 0;
    this.cachedTokens = 0;
    return s;
  }

  async close(): Promise<void> {
    await this.fleet.close();
  }
}
