// Full checkpoints through the job's JetStream object store: version N's model directory (its files
// except the optimizer state) travels as one object `full-v{N}` — a manifest of its files with the
// size and CRC32 of each, then the files' bytes — streamed in and out in chunks, so neither side holds
// the checkpoint in memory. The object store checks the object's SHA-256 digest on read and the
// reader checks every file's CRC32, writing into a fresh directory that appears only once all of it
// is verified. `FullStore` is what the weight syncs put each version's checkpoint in: the directory
// itself (engines read the trainer's path) or this object store (bounded retention: the newest
// `keep` objects and the one the engines serve).
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readSync, renameSync, rmSync, statSync, writeSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { policySetOf } from "../../native/model-dir.ts";
import { crc32 } from "node:zlib";
import { StorageType } from "@nats-io/jetstream";
import type { ObjectStore } from "@nats-io/obj";
import { OozeError } from "../../src/errors.ts";
import { toTransportError, type Bus } from "../../src/transport/bus.ts";
import { objectLocation, type ObjectRef } from "./delta-store.ts";

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
function manifestOf(dir: string, version: number): Manifest {
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
  private constructor(private readonly bus: Bus, private readonly bucket: string, private readonly store: ObjectStore, private readonly keep: number) {}

  /** Opens (creating if needed) `bucket` on `bus`; `keep` (at least 1) full checkpoints stay in it. */
  static async open(bus: Bus, bucket: string, keep = 2): Promise<ObjectFullStore> {
    return new ObjectFullStore(bus, bucket, await weightsBucket(bus, bucket), Math.max(1, keep));
  }

  async put(dir: string, version: number): Promise<string> {
    const name = fullObjectName(version);
    const manifest = manifestOf(dir, version);
    const bytes = manifest.files.reduce((a, f) => a + f.size, 0);
    try {
      // A put of an existing name (a retried push, or storing a corrupt object again) replaces it.
      const meta = { name, description: `ooze full checkpoint, weight version ${version}`, options: { max_chunk_size: Math.max(64 * 1024, this.bus.maxPayload - 8 * 1024) } };
      await this.store.put(meta, objectStream(dir, manifest));
    } catch (e) {
      throw toTransportError(e, `storing full checkpoint '${name}' (${dir}, ${bytes} bytes) in object store '${this.bucket}'`);
    }
    return objectLocation({ bucket: this.bucket, name });
  }

  async prune(served: number): Promise<void> {
    try {
      const versions = (await this.store.list()).map((o) => versionOfName(o.name)).filter((v): v is number => v !== null);
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
    for (const f of m.files)
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
 */
export async function fetchFullObject(bus: Bus, ref: ObjectRef, dir: string): Promise<string> {
  const where = `full checkpoint object '${ref.bucket}/${ref.name}'`;
  if (existsSync(dir)) throw new OozeError("INTERNAL", `fetching ${where}: ${dir} exists already`);
  const part = `${dir}.part`;
  rmSync(part, { recursive: true, force: true });
  mkdirSync(part, { recursive: true });
  const reader = new ObjectReader(part, where);
  try {
    let got;
    try {
      got = await (await weightsBucket(bus, ref.bucket)).get(ref.name);
    } catch (e) {
      throw toTransportError(e, `fetching ${where}`);
    }
    if (got === null) throw new OozeError("CHECKPOINT_INVALID", `${where} is not in the object store (pruned, or never stored); store the checkpoint again`);
    const stream = got.data.getReader();
    try {
      for (;;) {
        const { done, value } = await stream.read();
        if (done) break;
        if (value.length > 0) reader.push(value);
      }
      const failed = await got.error;
      if (failed) throw failed;
    } catch (e) {
      await stream.cancel().catch(() => undefined);
      if (e instanceof OozeError) throw e;
      const msg = (e as Error).message ?? String(e);
      if (/digests do not match/.test(msg)) throw new OozeError("CHECKPOINT_INVALID", `${where} is corrupt: ${msg}; store the checkpoint again`, { cause: e });
      throw toTransportError(e, `fetching ${where}`);
    }
    const manifest = reader.end();
    renameSync(part, dir);
    return manifest.version;
  } catch (e) {
    reader.abort();
    rmSync(part, { recursive: true, force: true });
    throw e;
  }
}
