// The fleet's engine registry in a JetStream KV bucket (names.kvEngines of the job): one JSON entry
// per attached engine {url, source, attachedAt}, written on attach and deleted on detach, so a new
// fleet on the same job recovers the set; the fleet's current weight version; and the engine
// processes a fleet host started, so a restarted host can stop the ones its crash orphaned.
import type { KV } from "@nats-io/kv";
import { toTransportError, type Bus } from "../../transport/bus.ts";
import { jobNames } from "../../transport/names.ts";
import { kvChangedAfter, kvJsonValues } from "../../transport/stored.ts";

/** Where an engine came from: the topology (started or listed by it) or a runtime attach. */
export type EngineSource = "topology" | "runtime";

/** One registry entry. */
export interface RegistryEntry {
  url: string;
  source: EngineSource;
  /** ms since epoch */
  attachedAt: number;
}

/** The fleet's last weight update, so a recovered fleet keeps versions increasing. */
export interface RegistryVersion {
  version: string;
  modelDir: string;
}

const ENGINE_PREFIX = "engine.";
const PROCESS_PREFIX = "process.";
const VERSION_KEY = "fleet.version";

/** An engine process a fleet host started (so a later incarnation can stop it if it was orphaned). */
export interface ProcessEntry {
  url: string;
  pid: number;
  /** ms since epoch */
  startedAt: number;
}

/** KV key of an engine URL (base64url keeps it inside KV's key alphabet). */
export function engineKey(url: string): string {
  return ENGINE_PREFIX + Buffer.from(url, "utf8").toString("base64url");
}

const text = new TextEncoder();
const untext = new TextDecoder();

/** The engine registry of one job. */
export class FleetRegistry {
  private constructor(
    readonly bucket: string,
    private readonly kv: KV,
    private readonly bus: Bus,
  ) {}

  /** Opens (creating if needed) the job's engines bucket. */
  static async open(bus: Bus, job: string): Promise<FleetRegistry> {
    const bucket = jobNames(job).kvEngines;
    return new FleetRegistry(bucket, await bus.kv(bucket, { history: 1 }), bus);
  }

  /** Writes an engine's entry. */
  async put(entry: RegistryEntry): Promise<void> {
    try {
      await this.kv.put(engineKey(entry.url), text.encode(JSON.stringify(entry)));
    } catch (e) {
      throw toTransportError(e, `writing engine ${entry.url} to KV bucket '${this.bucket}'`);
    }
  }

  /** Deletes an engine's entry (no-op when absent). */
  async remove(url: string): Promise<void> {
    try {
      await this.kv.delete(engineKey(url));
    } catch (e) {
      throw toTransportError(e, `deleting engine ${url} from KV bucket '${this.bucket}'`);
    }
  }

  /**
   * The JSON values of the live keys under `prefix` (a value that is not JSON is left out). Keys from
   * the bucket's stream info, not kv.keys(): that makes a consumer per call, and with a cluster's
   * server down a third of them land on it and time out (src/transport/stored.ts). Deleted keys come
   * too; get() tells them apart.
   */
  private async values(prefix: string): Promise<unknown[]> {
    try {
      return await kvJsonValues(this.bus, this.kv, this.bucket, prefix);
    } catch (e) {
      throw toTransportError(e, `reading KV bucket '${this.bucket}'`);
    }
  }

  /**
   * Whether an engine's entry was written or deleted after the bucket's sequence `seq` (one request;
   * the weight version and the process entries, which share the bucket, do not count).
   */
  async enginesChangedAfter(seq: number): Promise<boolean> {
    try {
      return await kvChangedAfter(this.bus, this.bucket, ENGINE_PREFIX, seq);
    } catch (e) {
      throw toTransportError(e, `reading KV bucket '${this.bucket}'`);
    }
  }

  /** The bucket's last sequence: it moves with every put and delete, so an unchanged one means nothing changed. */
  async lastSeq(): Promise<number> {
    try {
      return (await (await this.bus.jsm()).streams.info(`KV_${this.bucket}`)).state.last_seq;
    } catch (e) {
      throw toTransportError(e, `reading KV bucket '${this.bucket}'`);
    }
  }

  /** Every registered engine, oldest attach first. Unreadable entries are skipped. */
  async entries(): Promise<RegistryEntry[]> {
    const out: RegistryEntry[] = [];
    for (const v of (await this.values(ENGINE_PREFIX)) as (Partial<RegistryEntry> | null)[])
      if (typeof v?.url === "string") out.push({ url: v.url, source: v.source === "topology" ? "topology" : "runtime", attachedAt: Number(v.attachedAt) || 0 });
    return out.sort((a, b) => a.attachedAt - b.attachedAt);
  }

  /** Records an engine process started by the fleet's host. */
  async putProcess(p: ProcessEntry): Promise<void> {
    try {
      await this.kv.put(PROCESS_PREFIX + Buffer.from(p.url, "utf8").toString("base64url"), text.encode(JSON.stringify(p)));
    } catch (e) {
      throw toTransportError(e, `writing process ${p.pid} to KV bucket '${this.bucket}'`);
    }
  }

  /** Forgets an engine process record. */
  async removeProcess(url: string): Promise<void> {
    try {
      await this.kv.delete(PROCESS_PREFIX + Buffer.from(url, "utf8").toString("base64url"));
    } catch (e) {
      throw toTransportError(e, `deleting process ${url} from KV bucket '${this.bucket}'`);
    }
  }

  /** Engine processes recorded by earlier incarnations of the fleet's host. */
  async processes(): Promise<ProcessEntry[]> {
    return ((await this.values(PROCESS_PREFIX)) as (Partial<ProcessEntry> | null)[]).filter((v): v is ProcessEntry => typeof v?.url === "string" && Number.isInteger(v.pid));
  }

  /** Records the fleet's current weight version. */
  async putVersion(v: RegistryVersion): Promise<void> {
    try {
      await this.kv.put(VERSION_KEY, text.encode(JSON.stringify(v)));
    } catch (e) {
      throw toTransportError(e, `writing the weight version to KV bucket '${this.bucket}'`);
    }
  }

  /** The fleet's recorded weight version, or null. */
  async version(): Promise<RegistryVersion | null> {
    try {
      const e = await this.kv.get(VERSION_KEY);
      if (!e || e.operation !== "PUT" || e.value.length === 0) return null;
      const v = JSON.parse(untext.decode(e.value)) as RegistryVersion;
      return typeof v.version === "string" && typeof v.modelDir === "string" ? v : null;
    } catch (e) {
      throw toTransportError(e, `reading the weight version from KV bucket '${this.bucket}'`);
    }
  }
}
