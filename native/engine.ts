// The native InferenceBackend: src/engine/backend.ts's contract over the addon's Engine
// (continuous batching, KV slot pool, radix prefix cache, seeded sampling), for `ooze serve`.
import type {
  BackendAdmission,
  BackendCacheStats,
  BackendLora,
  BackendLoraAdapter,
  BackendModelInfo,
  BackendSampling,
  InferenceBackend,
  TokenEvent,
} from "../src/engine/backend.ts";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../src/errors.ts";
import type { NativeEngine } from "./index.d.ts";
import { loadNative } from "./load.ts";
import { weightsFileOf } from "./model-dir.ts";

/** Options of createNativeBackend. */
export interface NativeBackendOptions {
  /** A model directory (config.json + model.safetensors). */
  modelDir: string;
  /** KV pool size in tokens, also the prefix-cache budget (default 16384; at least the context). */
  cacheTokens?: number;
  /** Most requests decoding together; later ones wait in order (default 64). */
  maxRunning?: number;
}

class NativeBackend implements InferenceBackend {
  readonly info: BackendModelInfo;
  readonly lora: BackendLora;
  /** Where each loaded adapter was read from. */
  private readonly loraPaths = new Map<string, string>();
  private engine: NativeEngine | null;
  /** step() and loadWeights() run one at a time, in call order. */
  private chain: Promise<unknown> = Promise.resolve();

  constructor(opts: NativeBackendOptions) {
    const { Engine } = loadNative();
    try {
      this.engine = new Engine({
        modelDir: opts.modelDir,
        ...(opts.cacheTokens === undefined ? {} : { cacheTokens: opts.cacheTokens }),
        ...(opts.maxRunning === undefined ? {} : { maxRunning: opts.maxRunning }),
      });
    } catch (e) {
      throw new OozeError("CHECKPOINT_INVALID", `cannot load model ${opts.modelDir}: ${(e as Error).message}`, {
        cause: e,
      });
    }
    const config = this.engine.config();
    this.info = {
      modelPath: opts.modelDir,
      config: readConfigJson(opts.modelDir) ?? { ...config },
      eosTokenId: config.eos_token_id,
      maxContext: config.max_position_embeddings,
    };
    this.lora = {
      load: (name, path) => this.loadLora(name, path),
      unload: (name) => {
        this.loraPaths.delete(name);
        return this.native().unloadLoraAdapter(name);
      },
      list: () => this.listLora(),
    };
  }

  private async loadLora(name: string, path: string): Promise<BackendLoraAdapter> {
    // a model directory (not an adapter's) is a whole model served under the name
    const full = weightsFileOf(path) === "model.safetensors";
    try {
      if (full) await this.native().loadNamedModel(name, path);
      else await this.native().loadLoraAdapter(name, path);
    } catch (e) {
      if (e instanceof OozeError) throw e;
      throw new OozeError("CHECKPOINT_INVALID", `cannot load ${full ? "model" : "LoRA adapter"} '${name}' from ${path}: ${(e as Error).message}`, { cause: e });
    }
    this.loraPaths.set(name, path);
    return this.listLora().find((a) => a.name === name)!;
  }

  private listLora(): BackendLoraAdapter[] {
    return this.native()
      .loraAdapters()
      .map((a) => ({ name: a.name, path: this.loraPaths.get(a.name) ?? "", ...(a.full ? { full: true } : {}), rank: a.rank, alpha: a.alpha, targets: [...a.targets] }));
  }

  private native(): NativeEngine {
    if (!this.engine) throw new OozeError("INTERNAL", "the native backend is closed");
    return this.engine;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.chain.then(fn, fn);
    this.chain = run.catch(() => undefined);
    return run;
  }

  add(rid: string, inputIds: Int32Array, sampling: BackendSampling, lora: string | null = null): BackendAdmission {
    const engine = this.native();
    try {
      return { cachedTokens: engine.add(rid, inputIds, sampling, lora) };
    } catch (e) {
      throw new OozeError("BAD_REQUEST", (e as Error).message, { cause: e });
    }
  }

  step(): Promise<TokenEvent[]> {
    return this.serial(async () => {
      try {
        return await this.native().step();
      } catch (e) {
        if (e instanceof OozeError) throw e;
        throw new OozeError("NATIVE_FAILED", (e as Error).message, { cause: e });
      }
    });
  }

  abort(rid: string): void {
    this.engine?.abort(rid);
  }

  running(): number {
    return this.engine ? this.engine.running() : 0;
  }

  flushCache(): boolean {
    return this.native().flushCache();
  }

  cacheStats(): BackendCacheStats {
    return this.native().cacheStats();
  }

  loadWeights(dir: string, opts: { keepCache?: boolean } = {}): Promise<void> {
    return this.serial(async () => {
      try {
        await this.native().loadWeights(dir, opts.keepCache ?? false);
      } catch (e) {
        if (e instanceof OozeError) throw e;
        throw new OozeError("CHECKPOINT_INVALID", `cannot load weights from ${dir}: ${(e as Error).message}`, {
          cause: e,
        });
      }
    });
  }

  close(): void {
    this.engine?.close();
    this.engine = null;
  }
}

/** The directory's config.json as written (all its fields), or null if it cannot be read now. */
function readConfigJson(dir: string): Record<string, unknown> | null {
  try {
    const v: unknown = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    return typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** An InferenceBackend running the model in `opts.modelDir` on the native engine. */
export function createNativeBackend(opts: NativeBackendOptions): InferenceBackend {
  return new NativeBackend(opts);
}
