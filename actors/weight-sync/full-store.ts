// Full checkpoints through the job's JetStream object store: version N's model directory (its files
// except the optimizer state) travels as one object `full-v{N}` — a manifest of its files with the
// size and CRC32 of each, then the files' bytes — streamed in and out in chunks, so neither side holds
// the checkpoint in memory. The object store checks the object's SHA-256 digest on read and the
// reader checks every file's CRC32, writing into a fresh directory that appears only once all of it
// is verified. `FullStore` is what the weight syncs put each version's checkpoint in: the directory
// itself (engines read the trainer's path) or this object store (bounded retention: the newest
// `keep` objects and the one the engines serve).
// LoRA adapters travel without their base: a version whose adapters name a base model directory
// carries the base's object name and identity (its files' sizes and CRC32s) in its manifest, and the
// base itself is stored once per job as the object `base-{hash of its path}` (never pruned). A
// fetching host uses the directory the adapters name when it holds that very base (same files), and
// otherwise fetches the base object once into its bases directory; the fetched adapters then name
// the base where it is on that host.
import { createHash } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { adapterBaseDir, isAdapterDir, policySetOf } from "../../native/model-dir.ts";
import { crc32 } from "node:zlib";
import { StorageType } from "@nats-io/jetstream";
import type { ObjectStore } from "@nats-io/obj";
import { OozeError } from "../../src/errors.ts";
import { toTransportError, type Bus } from "../../src/transport/bus.ts";
import { CorruptObjectError, listObjects, readObject } from "../../src/transport/stored.ts";
import { CHUNK_ACK_TIMEOUT_MS, objectLocation, type ObjectRef } from "./delta-store.ts";

/** Where the weight syncs put each version's full checkpoint; returns the location the target loads. */
export interface FullStore {
  /** Stores version `version`'s model directory `dir`; returns its location (a path, or `nats-obj://BUCKET/NAME`). */
  put(dir: string, version: number): Promise<string>;
  /** Removes old checkpoints, never the one of `served` (the version the engines serve). */
  prune(served: number): Promise<void>;
}

/** The directory itself: engines load the trainer's path (they must be able to read it). */
export const directFullStore: FullStore = {
  put: async (dir) => dir,
  prune: async () => undefined,
};

/** Files of a model directory that never travel: the trainer's AdamW state and the critic's value head (engines serve the policy only). */
const SKIPPED = new Set(["optimizer.bin", "value_head.bin"]);
/** The weights file a checkpoint object must hold: a model directory's, or a LoRA policy's adapter directory's. */
const WEIGHT_FILES = new Set(["model.safetensors", "adapter_model.safetensors"]);
const MAGIC = new TextEncoder().encode("OOZEFULL");
const HEADER = MAGIC.length + 4;
const CHUNK = 1 << 20;

/** The object name of version `version`'s full checkpoint. */
export function fullObjectName(version: number | string): string {
  return `full-v${version}`;
}

/** The version a full checkpoint object's name carries, or null for other objects. */
function versionOfName(name: string): number | null {
  const m = /^full-v(\d+)$/.exec(name);
  return m ? Number(m[1]) : null;
}

/** One file of a full checkpoint object. */
interface ManifestFile {
  name: string;
  size: number;
  crc32: number;
}

/** The manifest at the head of a full checkpoint object (after the magic and its own length). */
interface Manifest {
  format: "ooze-full";
  v: 1;
  version: string;
  files: ManifestFile[];
  /** LoRA adapters: the base they are over, as stored (its object) and as it is (its files). */
  base?: { object: string; files: ManifestFile[] };
}

/** The object name of a base model directory's copy (one per directory). */
export function baseObjectName(dir: string): string {
  return `base-${createHash("sha256").update(resolve(dir)).digest("hex").slice(0, 16)}`;
}

/** The adapter directories of a version directory (itself, or its policies' that are adapters). */
function adapterDirsOf(dir: string): string[] {
  return isAdapterDir(dir) ? [dir] : (policySetOf(dir) ?? []).filter((d) => isAdapterDir(d));
}

/** The base model directory a version's adapters are over, or null when it has no adapters. */
function adapterBaseOf(dir: string): string | null {
  const bases = [...new Set(adapterDirsOf(dir).map((d) => adapterBaseDir(d)))];
  if (bases.length > 1) throw new OozeError("CHECKPOINT_INVALID", `weight sync: the adapters of ${dir} are over different bases (${bases.join(", ")})`);
  return bases[0] ?? null;
}

/** Points every adapter of version directory `dir` at the base model directory `base`. */
function rebase(dir: string, base: string): void {
  for (const a of adapterDirsOf(dir)) {
    const file = join(a, "adapter_config.json");
    const cfg = JSON.parse(readFileSync(file, "utf8")) as Record<string, unknown>;
    writeFileSync(file, `${JSON.stringify({ ...cfg, base_model_name_or_path: base }, null, 2)}\n`);
  }
}

/** Whether two manifests' files are the same (names, sizes, CRC32s). */
function sameFiles(a: readonly ManifestFile[], b: readonly ManifestFile[]): boolean {
  return a.length === b.length && a.every((f, i) => f.name === b[i]!.name && f.size === b[i]!.size && f.crc32 >>> 0 === b[i]!.crc32 >>> 0);
}

/** Manifests of base directories computed in this process, by path (a base never changes during a job). */
const baseManifests = new Map<string, ManifestFile[]>();

/** The files of base model directory `dir` (cached per process). */
function baseFiles(dir: string): ManifestFile[] {
  const key = resolve(dir);
  let files = baseManifests.get(key);
  if (!files) baseManifests.set(key, (files = manifestOf(dir, "base").files));
  return files;
}

/** Calls `each` with successive chunks of `file` (CHUNK bytes at most, a reused buffer). */
function readChunks(file: string, each: (chunk: Uint8Array) => void): void {
  const fd = openSync(file, "r");
  try {
    const buf = new Uint8Array(CHUNK);
    for (let n; (n = readSync(fd, buf, 0, CHUNK, null)) > 0; ) each(buf.subarray(0, n));
  } finally {
    closeSync(fd);
  }
}

/**
 * The manifest of model directory `dir` (its regular files, optimizer state left out, CRC32 of each;
 * with several policies, the files of each policy's subdirectory as `POLICY/FILE`).
 */
function manifestOf(dir: string, version: number | string): Manifest {
  const files: ManifestFile[] = [];
  const add = (sub: string) => {
    for (const name of readdirSync(join(dir, sub)).sort()) {
      const path = join(dir, sub, name);
      if (SKIPPED.has(name) || !statSync(path).isFile()) continue;
      let crc = 0;
      readChunks(path, (c) => (crc = crc32(c, crc)));
      files.push({ name: sub ? `${sub}/${name}` : name, size: statSync(path).size, crc32: crc });
    }
  };
  add("");
  if (files.length === 0) for (const sub of (policySetOf(dir) ?? []).map((d) => basename(d))) add(sub);
  if (!files.some((f) => WEIGHT_FILES.has(basename(f.name))))
    throw new OozeError("CHECKPOINT_INVALID", `weight sync: ${dir} has no model.safetensors (nor adapter_model.safetensors); it is not the model (or adapter) directory of version ${version}`);
  return { format: "ooze-full", v: 1, version: String(version), files };
}

/** The object's bytes as a stream: magic, manifest length (u32 LE), manifest JSON, then each file. */
function objectStream(dir: string, manifest: Manifest): ReadableStream<Uint8Array> {
  const json = new TextEncoder().encode(JSON.stringify(manifest));
  const head = new Uint8Array(HEADER + json.length);
  head.set(MAGIC, 0);
  new DataView(head.buffer).setUint32(MAGIC.length, json.length, true);
  head.set(json, HEADER);
  let file = -1;
  let fd: number | null = null;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (file < 0) {
        file = 0;
        controller.enqueue(head);
        return;
      }
      for (;;) {
        const f = manifest.files[file];
        if (!f) return controller.close();
        fd ??= openSync(join(dir, f.name), "r");
        const buf = new Uint8Array(CHUNK);
        const n = readSync(fd, buf, 0, CHUNK, null);
        if (n > 0) return controller.enqueue(buf.subarray(0, n));
        closeSync(fd);
        fd = null;
        file++;
      }
    },
    cancel() {
      if (fd !== null) closeSync(fd);
    },
  });
}

/** Opens (creating if needed) a bucket of weights; both sides open it the same way (as the deltas' bucket). */
function weightsBucket(bus: Bus, bucket: string): Promise<ObjectStore> {
  return bus.obj(bucket, { storage: StorageType.File });
}

/** Full checkpoints as objects `full-v{N}` of one object store bucket (the job's `names.objWeights`), keeping the newest `keep`. */
export class ObjectFullStore implements FullStore {
  /** Base objects known to be stored. */
  private readonly storedBases = new Set<string>();

  private constructor(private readonly bus: Bus, private readonly bucket: string, private readonly store: ObjectStore, private readonly keep: number) {}

  /** Opens (creating if needed) `bucket` on `bus`; `keep` (at least 1) full checkpoints stay in it. */
  static async open(bus: Bus, bucket: string, keep = 2): Promise<ObjectFullStore> {
    return new ObjectFullStore(bus, bucket, await weightsBucket(bus, bucket), Math.max(1, keep));
  }

  async put(dir: string, version: number): Promise<string> {
    const name = fullObjectName(version);
    const manifest = manifestOf(dir, version);
    const base = adapterBaseOf(dir);
    if (base !== null) manifest.base = { object: await this.putBase(base), files: baseFiles(base) };
    await this.putObject(name, `ooze full checkpoint, weight version ${version}`, dir, manifest);
    return objectLocation({ bucket: this.bucket, name });
  }

  /** Stores base model directory `dir` as its object unless the store has it already; returns the object's name. */
  private async putBase(dir: string): Promise<string> {
    const name = baseObjectName(dir);
    if (this.storedBases.has(name)) return name;
    let info;
    try {
      info = await this.store.info(name);
    } catch (e) {
      throw toTransportError(e, `looking up base model object '${name}' in object store '${this.bucket}'`);
    }
    if (!info || info.deleted) await this.putObject(name, `ooze base model ${resolve(dir)} (of LoRA adapters)`, dir, { format: "ooze-full", v: 1, version: "base", files: baseFiles(dir) });
    this.storedBases.add(name);
    return name;
  }

  private async putObject(name: string, description: string, dir: string, manifest: Manifest): Promise<void> {
    const bytes = manifest.files.reduce((a, f) => a + f.size, 0);
    try {
      // A put of an existing name (a retried push, or storing a corrupt object again) replaces it.
      const meta = { name, description, options: { max_chunk_size: Math.max(64 * 1024, this.bus.maxPayload - 8 * 1024) } };
      await this.store.put(meta, objectStream(dir, manifest), { timeout: CHUNK_ACK_TIMEOUT_MS });
    } catch (e) {
      throw toTransportError(e, `storing '${name}' (${dir}, ${bytes} bytes) in object store '${this.bucket}'`);
    }
  }

  async prune(served: number): Promise<void> {
    try {
      const versions = (await listObjects(this.bus, this.bucket)).map((o) => versionOfName(o.name)).filter((v): v is number => v !== null);
      const kept = new Set([...versions.sort((a, b) => b - a).slice(0, this.keep), served]);
      for (const v of versions) if (!kept.has(v)) await this.store.delete(fullObjectName(v));
    } catch (e) {
      throw toTransportError(e, `pruning full checkpoints of object store '${this.bucket}'`);
    }
  }
}

/** Reads a full checkpoint object's stream into `dir` (created), checking its layout and every file's size and CRC32. */
class ObjectReader {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;
  private manifest: Manifest | null = null;
  private file = 0;
  private fd: number | null = null;
  private written = 0;
  private crc = 0;

  constructor(private readonly dir: string, private readonly where: string) {}

  private corrupt(what: string): OozeError {
    return new OozeError("CHECKPOINT_INVALID", `${this.where} is corrupt: ${what}; store the checkpoint again (the weight-sync actor does when a fleet reports this)`);
  }

  /** Takes `n` bytes from the front of the pending chunks (null until that many arrived). */
  private take(n: number): Uint8Array | null {
    if (this.pendingBytes < n) return null;
    const out = new Uint8Array(n);
    let at = 0;
    while (at < n) {
      const c = this.pending[0]!;
      const k = Math.min(c.length, n - at);
      out.set(c.subarray(0, k), at);
      at += k;
      if (k === c.length) this.pending.shift();
      else this.pending[0] = c.subarray(k);
    }
    this.pendingBytes -= n;
    return out;
  }

  /** The first `n` pending bytes, left pending (null until that many arrived). */
  private peek(n: number): Uint8Array | null {
    if (this.pendingBytes < n) return null;
    const out = this.take(n)!;
    this.pending.unshift(out);
    this.pendingBytes += n;
    return out;
  }

  private parseManifest(json: Uint8Array): Manifest {
    let m: Manifest;
    try {
      m = JSON.parse(new TextDecoder().decode(json)) as Manifest;
    } catch (e) {
      throw this.corrupt(`its manifest is not JSON (${(e as Error).message})`);
    }
    if (m?.format !== "ooze-full" || m.v !== 1 || typeof m.version !== "string" || !Array.isArray(m.files)) throw this.corrupt("its manifest is not an ooze-full v1 manifest");
    if (m.base !== undefined && (typeof m.base?.object !== "string" || !/^base-[0-9a-f]{16}$/.test(m.base.object) || !Array.isArray(m.base.files)))
      throw this.corrupt(`its manifest names an invalid base ${JSON.stringify(m.base)}`);
    for (const f of [...m.files, ...(m.base?.files ?? [])])
      if (typeof f?.name !== "string" || !/^(?:[^/\\]+\/)?[^/\\]+$/.test(f.name) || f.name.split("/").some((p) => p === "." || p === "..") || !Number.isInteger(f.size) || f.size < 0 || !Number.isInteger(f.crc32))
        throw this.corrupt(`its manifest lists an invalid file ${JSON.stringify(f)}`);
    return m;
  }

  /** Consumes one chunk of the stream. */
  push(chunk: Uint8Array): void {
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    if (this.manifest === null) {
      // The manifest may span chunks: wait for its whole length.
      const head = this.peek(HEADER);
      if (head === null) return;
      if (!MAGIC.every((b, i) => head[i] === b)) throw this.corrupt("it does not start with the ooze full checkpoint magic");
      const len = new DataView(head.buffer, head.byteOffset).getUint32(MAGIC.length, true);
      if (this.pendingBytes < HEADER + len) return;
      this.take(HEADER);
      this.manifest = this.parseManifest(this.take(len)!);
    }
    this.drain();
  }

  /** Creates a file of the manifest (a policy's subdirectory first, for `POLICY/FILE`). */
  private create(name: string): number {
    const path = join(this.dir, name);
    if (name.includes("/")) mkdirSync(dirname(path), { recursive: true });
    return openSync(path, "wx");
  }

  /** Writes pending bytes into the current files. */
  private drain(): void {
    const files = this.manifest!.files;
    while (this.pending.length > 0) {
      const f = files[this.file];
      if (!f) throw this.corrupt(`${this.pendingBytes} bytes follow its last file`);
      this.fd ??= this.create(f.name);
      const c = this.pending[0]!;
      const k = Math.min(c.length, f.size - this.written);
      const part = c.subarray(0, k);
      writeSync(this.fd, part);
      this.crc = crc32(part, this.crc);
      this.written += k;
      if (k === c.length) this.pending.shift();
      else this.pending[0] = c.subarray(k);
      this.pendingBytes -= k;
      if (this.written === f.size) this.closeFile();
    }
    while (this.manifest && this.file < files.length && files[this.file]!.size === 0) {
      this.fd ??= this.create(files[this.file]!.name);
      this.closeFile();
    }
  }

  private closeFile(): void {
    const f = this.manifest!.files[this.file]!;
    closeSync(this.fd!);
    this.fd = null;
    if (this.crc >>> 0 !== f.crc32 >>> 0) throw this.corrupt(`the CRC32 of ${f.name} does not match its manifest`);
    this.file++;
    this.written = 0;
    this.crc = 0;
  }

  /** The stream ended: every file must be complete. Returns the manifest. */
  end(): Manifest {
    if (this.manifest === null) throw this.corrupt("it ends before its manifest");
    if (this.file < this.manifest.files.length) throw this.corrupt(`it ends inside ${this.manifest.files[this.file]!.name}`);
    if (!this.manifest.files.some((f) => WEIGHT_FILES.has(basename(f.name)))) throw this.corrupt("it has no model.safetensors (nor adapter_model.safetensors)");
    return this.manifest;
  }

  /** Closes an open file (after a failure). */
  abort(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/**
 * Fetches the full checkpoint object `ref` into the model directory `dir` (which must not exist; it
 * appears only once every file is verified). Returns the checkpoint's weight version. A missing
 * object, or one that is corrupt (its SHA-256 digest, layout or a file's CRC32 does not match), is
 * CHECKPOINT_INVALID naming the object, and nothing is left behind; a NATS failure is a TransportError.
 * A version of LoRA adapters comes with its base: the directory the adapters name when it holds that
 * base here, else the base's object fetched (once) into `basesDir`, which the adapters then name.
 */
export async function fetchFullObject(bus: Bus, ref: ObjectRef, dir: string, basesDir: string = dirname(dir)): Promise<string> {
  const where = `full checkpoint object '${ref.bucket}/${ref.name}'`;
  if (existsSync(dir)) throw new OozeError("INTERNAL", `fetching ${where}: ${dir} exists already`);
  const part = `${dir}.part`;
  rmSync(part, { recursive: true, force: true });
  mkdirSync(part, { recursive: true });
  const reader = new ObjectReader(part, where);
  try {
    // Read without a consumer (src/transport/stored.ts): nats.js's get makes one per call, and while
    // a cluster's server is down a third of those land on it and time out.
    let got;
    try {
      got = await readObject(bus, ref.bucket, ref.name, where);
    } catch (e) {
      throw toTransportError(e, `fetching ${where}`);
    }
    if (got === null) throw new OozeError("CHECKPOINT_INVALID", `${where} is not in the object store (pruned, or never stored); store the checkpoint again`);
    try {
      for await (const chunk of got.chunks) if (chunk.length > 0) reader.push(chunk);
    } catch (e) {
      if (e instanceof CorruptObjectError) throw new OozeError("CHECKPOINT_INVALID", `${e.message}; store the checkpoint again`, { cause: e });
      throw toTransportError(e, `fetching ${where}`);
    }
    const manifest = reader.end();
    if (manifest.base) rebase(part, await localBase(bus, ref.bucket, manifest.base, part, basesDir));
    renameSync(part, dir);
    return manifest.version;
  } catch (e) {
    reader.abort();
    rmSync(part, { recursive: true, force: true });
    throw e;
  }
}

/**
 * Where the base of the adapters just fetched into `part` is on this host: the directory they name,
 * when it holds the same files, else `basesDir/OBJECT`, fetched from the store the first time.
 */
async function localBase(bus: Bus, bucket: string, base: NonNullable<Manifest["base"]>, part: string, basesDir: string): Promise<string> {
  const named = adapterDirsOf(part).map((d) => {
    try {
      return adapterBaseDir(d);
    } catch {
      return null; // not on this host
    }
  })[0];
  const holds = (d: string) => {
    try {
      return sameFiles(baseFiles(d), base.files);
    } catch {
      return false; // not a model directory
    }
  };
  if (named && holds(named)) return named;
  const local = join(basesDir, base.object);
  if (existsSync(local) && holds(local)) return local;
  rmSync(local, { recursive: true, force: true });
  mkdirSync(basesDir, { recursive: true });
  await fetchFullObject(bus, { bucket, name: base.object }, local);
  return local;
}
