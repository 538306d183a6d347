// `ooze sim-engine [--count N]`: simulated GPU engines — SGLang-compatible servers (the same API and
// server as `ooze serve`) whose timing follows a serving model of an H100 (src/engine/sim/), with
// timers instead of compute, so one process hosts many. Prints one URL per line, then serves until
// SIGINT/SIGTERM or its parent is gone. Binds to loopback unless --host says otherwise.
import type { Command } from "commander";
import { OozeError } from "../../../src/errors.ts";
import { H100_LLAMA_8B } from "../../../src/engine/sim/perf-model.ts";
import { readPerfTable, startSimEngines } from "../../../src/engine/sim/sim-engines.ts";
import { watchParent } from "../parent.ts";

interface SimEngineOptions {
  count: string;
  host: string;
  port: string;
  seed: string;
  table?: string;
  maxRunning?: string;
  kvTokens?: string;
  stopProbability: string;
  updateWeightsMs?: string;
  catchUpMs: string;
  weightVersion: string;
  keepAliveMs: string;
  parentPid?: string;
}

function int(name: string, v: string, min: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new OozeError("CONFIG_INVALID", `--${name} must be an integer ≥ ${min} (got '${v}')`);
  return n;
}

export function register(program: Command) {
  program
    .command("sim-engine")
    .description("simulated GPU engines over SGLang's HTTP API: prefill/decode timing from a serving model of an H100, no compute")
    .option("--count <n>", "engines in this process, each on its own port", "1")
    .option("--host <addr>", "bind address", "127.0.0.1")
    .option("--port <n>", "port of the first engine, the others on the next ports (0 = free ports)", "0")
    .option("--seed <n>", "seed of the sampled token ids (engine i: seed + i)", "0")
    .option("--table <file>", "serving model as JSON (default: Llama-3.1-8B bf16 on an H100 with SGLang; see src/engine/sim/perf-model.ts)")
    .option("--max-running <n>", `requests decoding together (default the table's, ${H100_LLAMA_8B.maxRunning})`)
    .option("--kv-tokens <n>", `KV cache capacity in tokens (default the table's, ${H100_LLAMA_8B.kvTokens})`)
    .option("--stop-probability <p>", "chance that a sampled token is EOS (0: requests run to max_new_tokens)", "0")
    .option("--update-weights-ms <ms>", `time of one weight update (default the table's, ${H100_LLAMA_8B.updateWeightsMs})`)
    .option("--catch-up-ms <ms>", "how far behind its clock an engine still makes up time on a loaded host (beyond: counted as lag)", "50")
    .option("--weight-version <v>", "initial weight_version", "default")
    .option("--keep-alive-ms <ms>", "how long an idle keep-alive connection stays open (announced to clients)", "30000")
    .option("--parent-pid <pid>", "exit when this process is gone")
    .action(async (opts: SimEngineOptions) => {
      const p = Number(opts.stopProbability);
      if (!(p >= 0 && p < 1)) throw new OozeError("CONFIG_INVALID", `--stop-probability must be in [0, 1) (got '${opts.stopProbability}')`);
      let table = opts.table !== undefined ? readPerfTable(opts.table) : H100_LLAMA_8B;
      if (opts.updateWeightsMs !== undefined) table = { ...table, updateWeightsMs: int("update-weights-ms", opts.updateWeightsMs, 0) };
      const engines = await startSimEngines({
        table,
        count: int("count", opts.count, 1),
        host: opts.host,
        port: int("port", opts.port, 0),
        seed: int("seed", opts.seed, 0),
        stopProbability: p,
        weightVersion: opts.weightVersion,
        catchUpMs: int("catch-up-ms", opts.catchUpMs, 0),
        keepAliveMs: int("keep-alive-ms", opts.keepAliveMs, 1000),
        ...(opts.maxRunning !== undefined ? { maxRunning: int("max-running", opts.maxRunning, 1) } : {}),
        ...(opts.kvTokens !== undefined ? { kvTokens: int("kv-tokens", opts.kvTokens, 1) } : {}),
      });
      for (const u of engines.urls) console.log(u);
      process.stderr.write(`ooze sim-engine: ${engines.urls.length} simulated engine(s) (${engines.backends[0]!.table.name}) ready\n`);
      const stop = async () => {
        await engines.close();
        process.exit(0);
      };
      process.once("SIGINT", () => void stop());
      process.once("SIGTERM", () => void stop());
      if (opts.parentPid) watchParent(Number(opts.parentPid), () => void stop());
    });
}
