// `ooze serve`: an SGLang-compatible HTTP server over the embedded native engine, for a model
// directory or a randomly initialised preset, with LoRA adapters loaded at start (--lora-paths).
// Binds to loopback unless --host says otherwise.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Command } from "commander";
import { OozeError } from "../../../src/errors.ts";
import { startEngineServer } from "../../../src/engine/server.ts";
import { watchParent } from "../parent.ts";

interface ServeOptions {
  model?: string;
  preset?: string;
  seed: string;
  host: string;
  port: string;
  maxRunning: string;
  cacheTokens: string;
  weightVersion: string;
  parentPid?: string;
  loraPaths?: string[];
}

/** SGLang's --lora-paths entries: NAME=PATH, PATH (named by itself), or {"lora_name": …, "lora_path": …}. */
export function parseLoraPaths(specs: readonly string[]): { name: string; path: string }[] {
  return specs.map((spec) => {
    if (spec.trim().startsWith("{")) {
      let o: unknown;
      try {
        o = JSON.parse(spec);
      } catch (e) {
        throw new OozeError("CONFIG_INVALID", `--lora-paths '${spec}': not valid JSON (${(e as Error).message})`);
      }
      const { lora_name: name, lora_path: path } = (o ?? {}) as Record<string, unknown>;
      if (typeof name !== "string" || name === "" || typeof path !== "string" || path === "")
        throw new OozeError("CONFIG_INVALID", `--lora-paths '${spec}': the JSON form needs string fields lora_name and lora_path`);
      return { name, path };
    }
    const eq = spec.indexOf("=");
    const [name, path] = eq < 0 ? [spec, spec] : [spec.slice(0, eq), spec.slice(eq + 1)];
    if (name === "" || path === "") throw new OozeError("CONFIG_INVALID", `--lora-paths '${spec}': give NAME=PATH (or PATH) with both non-empty`);
    return { name, path };
  });
}

function positiveInt(name: string, v: string, min = 0): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new OozeError("CONFIG_INVALID", `--${name} must be an integer ≥ ${min} (got '${v}')`);
  return n;
}

export function register(program: Command) {
  program
    .command("serve")
    .description("serve the native model over SGLang's HTTP API (/generate, /health, /update_weights_from_disk, …)")
    .option("--model <dir>", "model directory (config.json + model.safetensors)")
    .option("--preset <name>", "randomly initialised preset instead of --model (tiny, quickstart, small, base100m)")
    .option("--seed <n>", "initialisation seed for --preset", "0")
    .option("--host <addr>", "bind address", "127.0.0.1")
    .option("--port <n>", "port (0 = any free port)", "30000")
    .option("--max-running <n>", "requests decoding together; more wait in order", "64")
    .option("--cache-tokens <n>", "KV pool and prefix-cache budget in tokens", "16384")
    .option("--weight-version <v>", "initial weight_version", "default")
    .option("--parent-pid <pid>", "exit when this process is gone (set by ooze when it starts engines)")
    .option("--lora-paths <specs...>", "LoRA adapters (PEFT directories) to serve from the start: NAME=PATH, PATH, or SGLang's JSON form")
    .action(async (opts: ServeOptions) => {
      if ((opts.model === undefined) === (opts.preset === undefined))
        throw new OozeError("CONFIG_INVALID", "ooze serve needs exactly one of --model DIR or --preset NAME");
      const [{ createNativeBackend }, { initModelDir }, { engineWeightLoader }] = await Promise.all([
        import("../../../native/engine.ts"),
        import("../../../native/model-dir.ts"),
        import("../../../actors/weight-sync/engine-loader.ts"),
      ]);
      let tmp: string | null = null;
      let modelDir = opts.model;
      if (opts.preset !== undefined) {
        tmp = mkdtempSync(join(tmpdir(), "ooze-serve-"));
        modelDir = join(tmp, opts.preset);
        await initModelDir(opts.preset, modelDir, positiveInt("seed", opts.seed));
      }
      const adapters = parseLoraPaths(opts.loraPaths ?? []);
      const backend = createNativeBackend({
        modelDir: modelDir!,
        cacheTokens: positiveInt("cache-tokens", opts.cacheTokens, 1),
        maxRunning: positiveInt("max-running", opts.maxRunning, 1),
      });
      for (const { name, path } of adapters) {
        try {
          if (adapters.filter((a) => a.name === name).length > 1) throw new Error(`adapter '${name}' is named more than once`);
          await backend.lora!.load(name, path);
        } catch (e) {
          backend.close();
          if (tmp) rmSync(tmp, { recursive: true, force: true });
          throw new OozeError("CONFIG_INVALID", `--lora-paths ${name}=${path}: ${(e as Error).message}`, { cause: e });
        }
      }
      const server = await startEngineServer({
        backend,
        host: opts.host,
        port: positiveInt("port", opts.port),
        weightVersion: opts.weightVersion,
        modelPath: opts.model ?? `preset:${opts.preset}`,
        maxRunning: positiveInt("max-running", opts.maxRunning, 1),
        loadWeights: engineWeightLoader(backend, modelDir!),
      });
      console.log(`ooze engine serving ${opts.model ?? `preset ${opts.preset}`} at ${server.url}`);
      const stop = async () => {
        await server.close();
        backend.close();
        if (tmp) rmSync(tmp, { recursive: true, force: true });
        process.exit(0);
      };
      process.once("SIGINT", () => void stop());
      process.once("SIGTERM", () => void stop());
      if (opts.parentPid) watchParent(Number(opts.parentPid), () => void stop());
    });
}
