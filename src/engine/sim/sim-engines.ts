// Many simulated engines in one process: each an SGLang-compatible HTTP server (src/engine/server.ts,
// the same server as `ooze serve`) on its own port over its own SimBackend. Timers, not compute, so a
// process holds 128 of them. `ooze sim-engine --count N` runs this.
import { readFileSync } from "node:fs";
import { OozeError } from "../../errors.ts";
import { type EngineServer, startEngineServer } from "../server.ts";
import { H100_LLAMA_8B, parsePerfTable, type PerfTable } from "./perf-model.ts";
import { SimBackend, type SimStats } from "./sim-backend.ts";

/** Options of startSimEngines. */
export interface SimEnginesOptions {
  /** How many engines (default 1). */
  count?: number;
  /** Bind address (default 127.0.0.1). */
  host?: string;
  /** Port of the first engine, the others on the next ports; 0 (default) = free ports chosen by the OS. */
  port?: number;
  /** Serving model (default: Llama-3.1-8B on an H100). */
  table?: PerfTable;
  /** Seed of the sampled ids; engine i uses seed + i (default 0). */
  seed?: number;
  stopProbability?: number;
  maxRunning?: number;
  kvTokens?: number;
  /** How far behind its clock an engine still makes up time, ms (default 50). */
  catchUpMs?: number;
  /** Initial weight_version (default "default"). */
  weightVersion?: string;
  /** Idle keep-alive connections' lifetime, ms (default the engine server's, 30 s); a slowed clock slows it too. */
  keepAliveMs?: number;
}

/** Running simulated engines. */
export interface SimEngines {
  readonly urls: string[];
  readonly backends: SimBackend[];
  /** Each engine's counters. */
  stats(): SimStats[];
  close(): Promise<void>;
}

/** Reads a serving-model table from a JSON file (the shape of perf-model.ts's PerfTable). */
export function readPerfTable(file: string): PerfTable {
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(file, "utf8"));
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `cannot read the serving-model table ${file}: ${(e as Error).message}`, { cause: e });
  }
  return parsePerfTable(value, file);
}

/** Starts `count` simulated engines; resolves when all listen. */
export async function startSimEngines(opts: SimEnginesOptions = {}): Promise<SimEngines> {
  const count = opts.count ?? 1;
  const table = opts.table ?? H100_LLAMA_8B;
  const backends: SimBackend[] = [];
  const servers: EngineServer[] = [];
  try {
    for (let i = 0; i < count; i++) {
      const backend = new SimBackend({
        table,
        seed: (opts.seed ?? 0) + i,
        ...(opts.stopProbability !== undefined ? { stopProbability: opts.stopProbability } : {}),
        ...(opts.maxRunning !== undefined ? { maxRunning: opts.maxRunning } : {}),
        ...(opts.kvTokens !== undefined ? { kvTokens: opts.kvTokens } : {}),
        ...(opts.catchUpMs !== undefined ? { catchUpMs: opts.catchUpMs } : {}),
      });
      backends.push(backend);
      servers.push(
        await startEngineServer({
          backend,
          host: opts.host ?? "127.0.0.1",
          port: opts.port ? opts.port + i : 0,
          weightVersion: opts.weightVersion ?? "default",
          maxRunning: opts.maxRunning ?? table.maxRunning,
          // Any format (a checkpoint directory, an ooze delta) loads in the table's update time.
          loadWeights: ({ keepCache }) => backend.loadWeights("", { keepCache: keepCache ?? false }),
          ...(opts.keepAliveMs !== undefined ? { keepAliveMs: opts.keepAliveMs } : {}),
        }),
      );
    }
  } catch (e) {
    await Promise.all(servers.map((s) => s.close()));
    throw e;
  }
  return {
    urls: servers.map((s) => s.url),
    backends,
    stats: () => backends.map((b) => b.cacheStats()),
    async close() {
      await Promise.all(servers.map((s) => s.close()));
      for (const b of backends) b.close();
    },
  };
}
