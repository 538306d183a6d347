// Where DeltaWeightSync puts each delta file (the bytes of delta.ts's format, unchanged) and how the
// side that owns the engines gets it back: a directory (trainer and engines share a filesystem; the
// location is the file's path) or the job's JetStream object store (one object per version,
// `delta-v{N-1}-v{N}`; the location is `nats-obj://BUCKET/NAME`, which the fleet actor, possibly on
// another host, fetches to a local temp file before the engines load it). Both keep only the
// deltas of the newest versions.
import { mkdirSync, mkdtempSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { StorageType } from "@nats-io/jetstream";
import type { ObjectStore } from "@nats-io/obj";
import { OozeError } from "../../src/errors.ts";
import { toTransportError, type Bus } from "../../src/transport/bus.ts";
import { listObjects, readObjectBytes } from "../../src/transport/stored.ts";

/** Where the deltas of one sync go. */
export interface DeltaStore {
  /** Stores the delta from version `base` to `version`; returns its location (what the target's updateWeights gets as the path). */
  put(base: number, version: number, bytes: Uint8Array): Promise<string>;
  /** Removes the deltas to versions below `floor`. */
  prune(floor: number): Promise<void>;
}

/** Deltas as files `DIR/v{N-1}-v{N}.ooze-delta` (written through a temp file and a rename). */
export class DirDeltaStore implements DeltaStore {
  constructor(private readonly dir: string) {
    mkdirSync(dir, { recursive: true });
  }

  async put(base: number, version: number, bytes: Uint8Array): Promise<string> {
    const file = join(this.dir, `v${base}-v${version}.ooze-delta`);
    writeFileSync(`${file}.tmp`, bytes);
    renameSync(`${file}.tmp`, file);
    return file;
  }

  async prune(floor: number): Promise<void> {
    for (const name of readdirSync(this.dir)) {
      const m = /^v\d+-v(\d+)\.ooze-delta$/.exec(name);
      if (m && Number(m[1]) < floor) rmSync(join(this.dir, name), { force: true });
    }
  }
}

/** One object of an object store bucket. */
export interface ObjectRef {
  bucket: string;
  name: string;
}

const SCHEME = "nats-obj://";

/** The location string of an object (what ObjectDeltaStore.put returns). */
export function objectLocation(ref: ObjectRef): string {
  return `${SCHEME}${ref.bucket}/${ref.name}`;
}

/** The object a location string names, or null when it is not an object store location (e.g. a path). */
export function parseObjectLocation(location: string): ObjectRef | null {
  if (!location.startsWith(SCHEME)) return null;
  const rest = location.slice(SCHEME.length);
  const slash = rest.indexOf("/");
  if (slash <= 0 || slash === rest.length - 1) return null;
  return { bucket: rest.slice(0, slash), name: rest.slice(slash + 1) };
}

/**
 * How long a stored chunk's ack may take before the put fails (and the sync retries it): 2 s, not
 * nats.js's 5 s, so a put that began while the bucket's stream had no leader (a cluster's server
 * just died) is retried within 2 s of the new leader's election (bench failover).
 */
export const CHUNK_ACK_TIMEOUT_MS = 2_000;

/** Opens (creating if needed) a bucket of weight deltas; both sides open it the same way. */
function deltaBucket(bus: Bus, bucket: string): Promise<ObjectStore> {
  return bus.obj(bucket, { storage: StorageType.File });
}

/** Deltas as objects `delta-v{N-1}-v{N}` of one object store bucket (the job's `names.objWeights`). */
export class ObjectDeltaStore implements DeltaStore {
  private constructor(private readonly bus: Bus, private readonly bucket: string, private readonly store: ObjectStore) {}

  /** Opens (creating if needed) `bucket` on `bus`. */
  static async open(bus: Bus, bucket: string): Promise<ObjectDeltaStore> {
    return new ObjectDeltaStore(bus, bucket, await deltaBucket(bus, bucket));
  }

  async put(base: number, version: number, bytes: Uint8Array): Promise<string> {
    const name = `delta-v${base}-v${version}`;
    try {
      // Chunks as large as the server allows (the bus does the same for large payloads); a put of an
      // existing name (a retried push) replaces it.
      await this.store.putBlob({ name, options: { max_chunk_size: Math.max(64 * 1024, this.bus.maxPayload - 8 * 1024) } }, bytes, { timeout: CHUNK_ACK_TIMEOUT_MS });
    } catch (e) {
      throw toTransportError(e, `storing weight delta '${name}' (${bytes.length} bytes) in object store '${this.bucket}'`);
    }
    return objectLocation({ bucket: this.bucket, name });
  }

  async prune(floor: number): Promise<void> {
    try {
      for (const info of await listObjects(this.bus, this.bucket)) {
        const m = /^delta-v\d+-v(\d+)$/.exec(info.name);
        if (m && Number(m[1]) < floor) await this.store.delete(info.name);
      }
    } catch (e) {
      throw toTransportError(e, `pruning weight deltas of object store '${this.bucket}'`);
    }
  }
}

/**
 * Fetches the delta object `ref` into a local temp file, calls `use` with the file's path and removes
 * the file when `use` is done. A missing object is CHECKPOINT_INVALID; one the object store cannot
 * read back whole (its SHA-256 digest does not match: corrupt) or a NATS failure is a TransportError.
 */
export async function withDeltaObject<T>(bus: Bus, ref: ObjectRef, use: (file: string) => Promise<T>): Promise<T> {
  const where = `weight delta object '${ref.bucket}/${ref.name}'`;
  let bytes: Uint8Array | null;
  try {
    // without a consumer (src/transport/stored.ts), as fetchFullObject
    bytes = await readObjectBytes(bus, ref.bucket, ref.name, where);
  } catch (e) {
    throw toTransportError(e, `fetching ${where}`);
  }
  if (bytes === null) throw new OozeError("CHECKPOINT_INVALID", `${where} is not in the object store (pruned, or never stored)`);
  const dir = mkdtempSync(join(tmpdir(), "ooze-delta-fetch-"));
  try {
    const file = join(dir, `${ref.name}.ooze-delta`);
    writeFileSync(file, bytes);
    return await use(file);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
