// The weight-sync actor (kind `train.weight-sync`, one per job, beside the trainer: it reads the
// trainer's model directories): consumes WEIGHTS in order and, for each version above the engines'
// one, has the fleet actor walk every engine through pause → update_weights_from_disk → continue,
// then records {version, modelDir, step} in the job's versions KV bucket (compare-and-set, never
// backwards). The buffer feeds the next step once that record is there. With `train.weightSync:
// full` every version goes as a full checkpoint (FullWeightSync); with `delta`, as a lossless delta
// against the previous one (DeltaWeightSync) through the job's JetStream object store: this actor
// puts the delta object, the fleet actor fetches it and its engines apply it, and an engine that
// refuses it (other base, corrupt object) loads the full checkpoint instead, logged. Full
// checkpoints travel as objects `full-v{N}` of the same object store (config `transport: object`,
// the default; the fleet fetches them to a local directory of its own) or, with `transport:
// directory`, as the trainer's directory, which the fleet's engines must then read.
import { existsSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { z } from "zod";
import { remoteRef, type ActorSystem } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { askFleet, type FleetMsg, type FleetReply } from "../protocol/fleet-messages.ts";
import { defineLoopActor } from "../protocol/context.ts";
import { weightsRegistry, type VersionRecord } from "../protocol/messages.ts";
import { consumeStream, ensureTrainStreams, VersionsKv, type StreamConsumer } from "../protocol/streams.ts";
import { DeltaWeightSync, type PushRecord } from "./delta-sync.ts";
import { weightsBytes } from "../../native/model-dir.ts";
import { ObjectDeltaStore, parseObjectLocation } from "./delta-store.ts";
import { DELTA_LOAD_FORMAT } from "./engine-loader.ts";
import { FullWeightSync, type WeightTarget } from "./full.ts";
import { directFullStore, ObjectFullStore } from "./full-store.ts";

/** The weight-sync actor's `config`. */
export const weightSyncActorConfig = z.object({
  /** Path of the fleet actor that owns the engines. */
  fleet: z.string().min(1).default("fleet"),
  /** Deadline of one fleet update (all engines). */
  updateTimeoutMs: z.number().int().min(1000).default(120_000),
  /**
   * A weights message comes back after this long without a heartbeat: a killed weight-sync's, or one
   * whose ack a crashed nats-server forgot (it takes one at a time: nothing else arrives meanwhile,
   * and the trainer waits for the version). The handler beats every third of it; a redelivered
   * version the engines already serve is only recorded.
   */
  ackWaitMs: z.number().int().min(500).default(10_000),
  /**
   * How full checkpoints (version 0, weightSync full, fallbacks, engines that join later) reach the
   * fleet: `object` (default) as objects `full-v{N}` of the job's object store, which the fleet fetches
   * to a local directory of its own; `directory` as the trainer's model directory, a path the fleet's
   * engines must read.
   */
  transport: z.enum(["object", "directory"]).default("object"),
  /** transport object: full checkpoint objects kept in the job's object store (the newest ones, and always the one the engines serve). */
  keepFull: z.number().int().min(1).default(2),
  /** weightSync delta: versions whose delta objects stay in the job's object store (the newest ones). */
  keepDeltas: z.number().int().min(1).default(2),
  /**
   * weightSync delta with weightSyncWire bf16: where each version rounded to bf16 is written (the full
   * checkpoint engines fall back to or join with; with transport directory, a path the fleet's host
   * sees). Relative to the
   * topology file; `{job}` becomes the job id. Default: OS temp dir/ooze-{job}-weight-sync.
   */
  dir: z.string().min(1).optional(),
});

interface WeightSyncState {
  consumer: StreamConsumer;
  /** Aborted when the actor stops: a push in flight makes no further try (its version comes back to the next consumer). */
  stopping: AbortController;
}

/**
 * The fleet actor as a WeightTarget: a full checkpoint is a model directory (loaded as is) or an
 * object store location (`full`: the fleet fetches it); a delta (load_format "ooze-delta") must be an
 * object store location, which the fleet fetches (its reply lists the engines that loaded the full
 * checkpoint, `fullModelDir`, instead). An update that failed after the fleet applied it (e.g.
 * recording it in KV while NATS restarted: the fleet then refuses the same version again) counts as
 * done when the fleet and its healthy engines report the version.
 */
export function fleetTarget(
  ask: (msg: FleetMsg) => Promise<Extract<FleetReply, { ok: true }>>, opts: { keepCache?: boolean; pause?: "abort" | "in_place" } = {},
): WeightTarget {
  // how every update is applied: the caches kept, the running requests paused in place
  const how = { ...(opts.keepCache ? { flushCache: false } : {}), ...(opts.pause === "in_place" ? { mode: "in_place" as const } : {}) };
  /** A full checkpoint's location as the ask's field: an object store object, or a directory. */
  const fullOf = (location: string) => {
    const full = parseObjectLocation(location);
    return full ? { full } : { modelDir: location };
  };
  return {
    async updateWeights(path, version, opts = {}) {
      let msg: FleetMsg = { op: "updateWeights", version, ...fullOf(path), ...how };
      if (opts.loadFormat !== undefined) {
        const delta = opts.loadFormat === DELTA_LOAD_FORMAT ? parseObjectLocation(path) : null;
        if (!delta || opts.fullModelDir === undefined)
          throw new OozeError("INTERNAL", `weight-sync: the fleet actor takes '${DELTA_LOAD_FORMAT}' updates from the object store with a full checkpoint; got '${opts.loadFormat}' at ${path}`);
        msg = { op: "updateWeights", version, delta, ...fullOf(opts.fullModelDir), ...how };
      }
      try {
        return { fullFallbacks: (await ask(msg)).fullFallbacks ?? [] };
      } catch (e) {
        const r = await ask({ op: "list" });
        const healthy = r.engines.filter((x) => x.healthy);
        if (r.weightVersion === version && healthy.length > 0 && healthy.every((x) => x.weightVersion === version)) return { fullFallbacks: [] };
        throw e;
      }
    },
  };
}

/** A delta push in a log line: how it went, its size, and the engines that loaded the full checkpoint. */
function describe(rec: PushRecord): string {
  const size = rec.deltaBytes === null ? "" : `, delta ${rec.deltaBytes} of ${rec.fullBytes} bytes`;
  const fallbacks = rec.fallbacks.length > 0 ? `, full fallbacks: ${rec.fallbacks.map((f) => f.engine).join(", ")}` : "";
  return `${rec.kind}${size}${fallbacks}`;
}

/** What a push sent, for the versions record (dashboards): a delta's size, or the full checkpoint's. */
function syncOf(rec: PushRecord | void, modelDir: string): VersionRecord["sync"] {
  if (rec) return { kind: rec.kind, bytes: rec.kind === "delta" ? (rec.deltaBytes ?? rec.fullBytes) : rec.fullBytes, fullBytes: rec.fullBytes };
  const bytes = weightsBytes(modelDir);
  return { kind: "full", bytes, fullBytes: bytes };
}

/** The weight-sync actor definition for a node's system and topology. */
export function weightSyncActor(system: ActorSystem, topology: Topology) {
  return defineLoopActor(system, topology, {
    role: "weight-sync",
    config: weightSyncActorConfig,
    async init(env, cfg, ctx): Promise<WeightSyncState> {
      await ensureTrainStreams(env.bus, env.names, env.train);
      const versions = await VersionsKv.open(env.bus, env.names);
      const fleet = remoteRef<FleetMsg>(system, cfg.fleet);
      const record = await versions.get();
      const start = record?.version ?? -1;
      const target = fleetTarget((m) => askFleet(fleet, m, cfg.updateTimeoutMs), { keepCache: env.train.keepCacheOnUpdate, pause: env.train.pauseOnUpdate });
      const log = (l: string) => ctx.log.warn(l);
      const fullStore = cfg.transport === "object" ? await ObjectFullStore.open(env.bus, env.names.objWeights, cfg.keepFull) : directFullStore;
      let sync: FullWeightSync | DeltaWeightSync;
      if (env.train.weightSync === "delta") {
        // The engines serve the recorded version's checkpoint: the first delta's base (the first push
        // is full when it is gone; an engine on other weights refuses the delta and loads in full).
        const base = record && existsSync(join(record.modelDir, "model.safetensors")) ? { baseModelDir: record.modelDir } : {};
        sync = new DeltaWeightSync(target, start, {
          dir: cfg.dir === undefined ? join(tmpdir(), `ooze-${env.job}-weight-sync`) : resolve(env.baseDir, cfg.dir.replaceAll("{job}", env.job)),
          store: await ObjectDeltaStore.open(env.bus, env.names.objWeights),
          fullStore,
          wire: env.train.weightSyncWire,
          keep: cfg.keepDeltas,
          log,
          ...base,
        });
      } else sync = new FullWeightSync(target, start, log, fullStore);
      const stopping = new AbortController();
      const consumer = consumeStream({
        bus: env.bus, names: env.names, stream: env.names.streamWeights, subject: env.names.trainWeights, durable: env.names.consumer("train_weight_sync"),
        registry: weightsRegistry, actor: ctx.path, ackWaitMs: cfg.ackWaitMs, log: (l) => ctx.log.warn(l),
        async handle(msg) {
          const w = msg.body;
          let sent: VersionRecord["sync"];
          if (w.version > sync.version) {
            const rec = await sync.push(w.modelDir, w.version, { signal: stopping.signal });
            ctx.log.info(`weight-sync: engines serve version ${w.version} (step ${w.step}${rec ? `; ${describe(rec)}` : ""})`);
            sent = syncOf(rec, w.modelDir);
          }
          if (w.version >= sync.version) await versions.advance({ version: w.version, modelDir: w.modelDir, step: w.step, at: Date.now(), ...(sent ? { sync: sent } : {}) });
        },
      });
      return { consumer, stopping };
    },
    async onStop(state) {
      // Before the consumer's grace: a push retrying against engines or a bus that are going away
      // (the job's end) gives up now, instead of retrying for an hour after its job (Dec 1).
      state.stopping.abort();
      await state.consumer.stop();
    },
  });
}
