// The engines a training run generates with: embedded ones started as `ooze serve` child processes
// (a native crash there kills an engine, not the run), external URLs, and the small Generator
// interface the rollout side uses — round-robin with session affinity over EngineClients, and the
// pause → update_weights_from_disk → continue walk with a version check. (When src/engine/fleet.ts
// lands, a Fleet implements Generator and replaces EnginePool in one line of the loop.)
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { EngineClient, type GenerateResult } from "../engine/client.ts";
import type { WireSamplingParams } from "../engine/protocol.ts";
import { OozeError } from "../errors.ts";

const OOZE_BIN = fileURLToPath(new URL("../../bin/ooze.mjs", import.meta.url));

/** What the rollout side needs of the engines. */
export interface Generator {
  /** One generation, token-in/token-out, with logprobs; `sessionId` keeps an episode on one engine. */
  generate(req: { inputIds: ArrayLike<number>; sampling: WireSamplingParams; sessionId: string }): Promise<GenerateResult>;
  /** Loads `modelDir` as weight version `version` on every engine; resolves when all report it. */
  updateWeights(modelDir: string, version: string): Promise<void>;
  /** Prefix-cache hits / prompt tokens since the last call (0 when nothing was generated). */
  takeCacheStats(): { promptTokens: number; cachedTokens: number };
}

/** An engine child process (`ooze serve --model DIR --port 0`). */
export interface EngineProcess {
  url: string;
  pid: number;
  stop(): Promise<void>;
}

/** Starts `ooze serve` on a free loopback port and waits for its URL line. */
export async function startEngineProcess(opts: { modelDir: string; maxRunning: number; cacheTokens: number; weightVersion: string }): Promise<EngineProcess> {
  const args = [OOZE_BIN, "serve", "--model", opts.modelDir, "--port", "0", "--max-running", String(opts.maxRunning),
    "--cache-tokens", String(opts.cacheTokens), "--weight-version", opts.weightVersion];
  const child: ChildProcess = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
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

  async generate(req: { inputIds: ArrayLike<number>; sampling: WireSamplingParams; sessionId: string }): Promise<GenerateResult> {
    let i = this.affinity.get(req.sessionId);
    if (i === undefined) {
      i = this.next++ % this.clients.length;
      this.affinity.set(req.sessionId, i);
    }
    const res = await this.clients[i]!.generate({ inputIds: req.inputIds, sampling: req.sampling, returnLogprob: true, routingKey: req.sessionId });
    this.promptTokens += res.meta.promptTokens;
    this.cachedTokens += res.meta.cachedTokens;
    return res;
  }

  /** Ends a session's affinity (the episode is over). */
  endSession(sessionId: string): void {
    this.affinity.delete(sessionId);
  }

  async updateWeights(modelDir: string, version: string): Promise<void> {
    await Promise.all(
      this.clients.map(async (c) => {
        await c.pauseGeneration("in_place");
        try {
          const r = await c.updateWeightsFromDisk({ modelPath: modelDir, weightVersion: version });
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
