// Delta weight sync: for each new version N the trainer saved as a model directory, a lossless delta
// against version N−1 (actors/weight-sync/delta.ts) is put in a DeltaStore (delta-store.ts: a
// directory, or the job's JetStream object store) and every engine is walked through pause →
// update_weights_from_disk (load_format "ooze-delta") → continue by the target (a Fleet, the loop's
// Generator, or the fleet actor, which fetches an object store delta first). An engine whose weights
// are not N−1 (restarted, or the delta arrived corrupt) refuses the delta without changing anything
// and loads the full checkpoint instead: the fleet reports it per engine; when the whole delta update
// fails (e.g. the object cannot be fetched), the sync falls back to a full update of every engine.
// Every fallback is logged and recorded in `history`. With the bf16 wire, the engines hold the
// trainer's weights rounded to bf16 (fp32 containers whose low 16 bits are zero): each version is
// also written as such a model directory, the full fallback. Each version's full checkpoint is put
// in a FullStore (full-store.ts: the directory itself, or the job's object store) before the update.
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { loadNative } from "../../native/load.ts";
import { encodeDelta, isBf16Exact, roundToBf16, tensorLayout, type DeltaWire, type EncodeOptions, type TensorSlot } from "./delta.ts";
import { DirDeltaStore, type DeltaStore } from "./delta-store.ts";
import { DELTA_LOAD_FORMAT } from "./engine-loader.ts";
import { assertIncreasing, loadFull, type PushOptions, type WeightTarget } from "./full.ts";
import { directFullStore, type FullStore } from "./full-store.ts";

/** Options of DeltaWeightSync. */
export interface DeltaSyncOptions {
  /** Directory for the bf16 wire's model directories and, without `store`, the delta files (created when first needed). */
  dir: string;
  /** Where the deltas go (default: files in `dir`, DirDeltaStore). */
  store?: DeltaStore;
  /** Where each version's full checkpoint goes (the fallback and what engines join with; default: the directory itself). */
  fullStore?: FullStore;
  /** The model directory the engines serve at the initial version (the first delta's base); without it the first push is full. */
  baseModelDir?: string;
  /** "fp32" (default): engines get the trainer's weights bit for bit; "bf16": rounded to bf16. */
  wire?: DeltaWire;
  /** Deflate level (default: encodeDelta's per wire). */
  level?: number;
  /** Candidate encodings (default: delta.ts's per wire); e.g. ["sub-exp", "overwrite"] for the fastest apply. */
  encodings?: EncodeOptions["encodings"];
  /** Versions whose deltas (and bf16 directories) are kept (default 2, at least 1). */
  keep?: number;
  log?: (line: string) => void;
}

/** One push, as recorded in `history`. */
export interface PushRecord {
  version: number;
  /** "delta": the delta update went through (engines in `fallbacks` loaded the full checkpoint); "full": every engine loaded it. */
  kind: "delta" | "full";
  /** Size of the delta file (null: none was made). */
  deltaBytes: number | null;
  /** Size of the full checkpoint's weights file. */
  fullBytes: number;
  /** Engines that did not take the delta, with why ("*": the whole delta update failed). */
  fallbacks: { engine: string; reason: string }[];
  /** Time to load, round and encode, ms. */
  encodeMs: number;
}

interface Base {
  version: number;
  params: Float32Array;
  layout: TensorSlot[];
}

const sameLayout = (a: TensorSlot[], b: TensorSlot[]) =>
  a.length === b.length && a.every((s, i) => s.name === b[i]!.name && s.offset === b[i]!.offset && s.numel === b[i]!.numel);

/** Pushes each new version to the engines as a delta against the previous one, falling back to full loads. */
export class DeltaWeightSync {
  private last: number;
  private base: Base | null = null;
  private readonly wire: DeltaWire;
  private readonly store: DeltaStore;
  private readonly fullStore: FullStore;
  private readonly keep: number;
  private readonly log: (line: string) => void;
  /** Every push, oldest first (the newest 1000). */
  readonly history: PushRecord[] = [];

  constructor(private readonly target: WeightTarget, initialVersion: number, private readonly opts: DeltaSyncOptions) {
    this.last = initialVersion;
    this.wire = opts.wire ?? "fp32";
    this.keep = Math.max(1, opts.keep ?? 2);
    this.log = opts.log ?? (() => undefined);
    this.store = opts.store ?? new DirDeltaStore(opts.dir);
    this.fullStore = opts.fullStore ?? directFullStore;
    if (opts.baseModelDir !== undefined) {
      const m = loadNative().loadModelDir(opts.baseModelDir);
      // With the bf16 wire, engines that hold unrounded weights take a full (rounded) checkpoint first.
      if (this.wire === "fp32" || isBf16Exact(m.params)) this.base = { version: initialVersion, params: m.params, layout: tensorLayout(m.tensors) };
    }
  }

  /** The version the engines serve. */
  get version(): number {
    return this.last;
  }

  /** Totals over `history`. */
  get stats(): { deltas: number; fulls: number; engineFallbacks: number; deltaBytes: number; fullBytes: number } {
    const s = { deltas: 0, fulls: 0, engineFallbacks: 0, deltaBytes: 0, fullBytes: 0 };
    for (const r of this.history) {
      if (r.kind === "delta") s.deltas++;
      else s.fulls++;
      s.engineFallbacks += r.fallbacks.length;
      s.deltaBytes += r.deltaBytes ?? 0;
      s.fullBytes += r.fullBytes;
    }
    return s;
  }

  /** Loads `modelDir` (the trainer's checkpoint of `version`) on every engine; full updates are retried (see PushOptions). */
  async push(modelDir: string, version: number, opts: PushOptions = {}): Promise<PushRecord> {
    assertIncreasing(version, this.last);
    const t0 = performance.now();
    const native = loadNative();
    const m = native.loadModelDir(modelDir);
    const layout = tensorLayout(m.tensors);
    let params = m.params;
    let fullDir = modelDir;
    if (this.wire === "bf16") {
      params = roundToBf16(m.params);
      fullDir = join(this.opts.dir, `v${version}-bf16`);
      mkdirSync(this.opts.dir, { recursive: true });
      native.saveModelDir(fullDir, m.config, params, String(version));
    }
    const fullBytes = statSync(join(fullDir, "model.safetensors")).size;
    const base = this.base && sameLayout(this.base.layout, layout) ? this.base : null;
    let bytes: Uint8Array | null = null;
    if (base) {
      const enc: EncodeOptions = { wire: this.wire, ...(this.opts.level ? { level: this.opts.level } : {}), ...(this.opts.encodings ? { encodings: this.opts.encodings } : {}) };
      bytes = encodeDelta(layout, base.params, params, String(base.version), String(version), enc);
    }
    const rec: PushRecord = { version, kind: "full", deltaBytes: bytes?.length ?? null, fullBytes, fallbacks: [], encodeMs: performance.now() - t0 };
    let done = false;
    let fullLocation: string | null = null;
    if (base && bytes) {
      try {
        // Stored inside the try: a store that fails (NATS away) means a full update, like a refused delta.
        const location = await this.store.put(base.version, version, bytes);
        fullLocation = await this.fullStore.put(fullDir, version);
        const r = await this.target.updateWeights(location, String(version), { loadFormat: DELTA_LOAD_FORMAT, fullModelDir: fullLocation });
        rec.kind = "delta";
        rec.fallbacks = fullFallbacksOf(r);
        for (const f of rec.fallbacks) this.log(`weight sync: ${f.engine} loaded version ${version} in full (delta refused: ${f.reason})`);
        done = true;
      } catch (e) {
        if (opts.signal?.aborted) throw e;
        const reason = (e as Error).message;
        rec.fallbacks = [{ engine: "*", reason }];
        this.log(`weight sync: delta update to version ${version} failed (${reason}); loading the full checkpoint ${fullLocation ?? fullDir} on every engine`);
      }
    } else if (this.base) rec.fallbacks = [{ engine: "*", reason: "the model's tensor layout changed" }];
    if (!done) await loadFull(this.target, this.fullStore, fullDir, version, this.log, { ...opts, location: fullLocation });
    this.base = { version, params, layout };
    this.last = version;
    this.history.push(rec);
    if (this.history.length > 1000) this.history.shift();
    await this.prune();
    return rec;
  }

  /** Removes the deltas and bf16 directories of versions older than the newest `keep`, and the full store's old checkpoints (a failure is logged: the next push prunes again). */
  private async prune(): Promise<void> {
    const floor = this.last - this.keep + 1;
    for (const name of existsSync(this.opts.dir) ? readdirSync(this.opts.dir) : []) {
      const m = /^v(\d+)-bf16$/.exec(name);
      if (m && Number(m[1]) < floor) rmSync(join(this.opts.dir, name), { recursive: true, force: true });
    }
    await this.store.prune(floor).catch((e: unknown) => this.log(`weight sync: pruning old deltas failed (${(e as Error).message})`));
    await this.fullStore.prune(this.last).catch((e: unknown) => this.log(`weight sync: pruning old full checkpoints failed (${(e as Error).message})`));
  }
}

/** The per-engine fallbacks of a Fleet's WeightUpdateReport (none for targets that return nothing). */
function fullFallbacksOf(r: unknown): { engine: string; reason: string }[] {
  const f = (r as { fullFallbacks?: unknown } | null | undefined)?.fullFallbacks;
  if (!Array.isArray(f)) return [];
  return f.filter((x): x is { engine: string; reason: string } => typeof x?.engine === "string" && typeof x?.reason === "string");
}
