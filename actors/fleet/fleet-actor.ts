// The fleet actor (kind "fleet"): hosts a Fleet for its job. Engines come from its topology config —
// `engines: [{url}]` (external servers, attached as "topology" engines, joining when reachable) and
// `embedded: {count, preset | modelDir, …}` (child processes running `ooze serve`, attached once they
// listen, killed when the actor stops) — and from runtime asks: {op:"attach", url}, {op:"detach", url},
// {op:"list"}, {op:"updateWeights", modelDir | full, version, mode, delta?}. A full checkpoint is a
// model directory the engines read (`modelDir`) or an object of the job's object store (`full`) that
// the fleet fetches into a local directory of its own (local-weights.ts), keeping the copy of the
// version it serves for engines that join later; with `delta`, an object the fleet fetches to a
// temp file and has its engines load as "ooze-delta", the full checkpoint being the fallback. The
// engine set lives in the job's KV bucket, so a restarted actor recovers runtime-attached engines
// (and fetches the served version's full checkpoint again when its local copy is gone). Actors in
// the same process use the Fleet itself through `localFleet(job)` for generation.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { remoteLayer, defineActor, type ActorSystem } from "../../src/actor/index.ts";
import { Fleet, type FleetOptions } from "../../src/engine/fleet/fleet.ts";
import { OozeError, toOozeError } from "../../src/errors.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { FleetRegistry } from "../../src/engine/fleet/registry.ts";
import { withDeltaObject } from "../weight-sync/delta-store.ts";
import { DELTA_LOAD_FORMAT } from "../weight-sync/engine-loader.ts";
import { fullObjectName } from "../weight-sync/full-store.ts";
import { EmbeddedEngine, killOrphan } from "./embedded.ts";
import { LocalWeights } from "./local-weights.ts";
import { hasWeights } from "../../native/model-dir.ts";
import { fleetMsg, type FleetMsg, type FleetReply } from "../protocol/fleet-messages.ts";
import { watchFleet } from "../protocol/loop-metrics.ts";
import { eachLimit } from "../../src/each-limit.ts";

/** The fleet actor's `config` in a topology. */
export const fleetConfig = z.looseObject({
  routing: z.enum(["round_robin", "least_load", "cache_aware"]).optional(),
  healthIntervalMs: z.number().int().min(0).optional(),
  healthTimeoutMs: z.number().int().positive().optional(),
  /** Deadline of one control request to an engine (weight update, pause, continue), ms (default 30 000). */
  controlTimeoutMs: z.number().int().positive().optional(),
  unhealthyAfter: z.number().int().positive().optional(),
  /** Stream generations (keeps tokens across an engine's death; costs more). */
  stream: z.boolean().optional(),
  requestTimeoutMs: z.number().int().positive().optional(),
  maxRedispatches: z.number().int().min(0).optional(),
  /** An external SGLang router to register engines with. */
  router: z.string().url().optional(),
  /** The model every engine must serve (an HF config or part of one). */
  expectModel: z.record(z.string(), z.unknown()).optional(),
  engines: z.array(z.union([z.string().min(1), z.object({ url: z.string().min(1) })])).default([]),
  embedded: z
    .object({
      count: z.number().int().min(0).default(1),
      preset: z.string().optional(),
      modelDir: z.string().optional(),
      seed: z.number().int().min(0).optional(),
      weightVersion: z.string().optional(),
      maxRunning: z.number().int().positive().optional(),
      cacheTokens: z.number().int().positive().optional(),
      /**
       * The engines' bind address (default 127.0.0.1, loopback only). Rollouts on other hosts call
       * the engines directly: give this host's own address there (the engines' API has no auth).
       */
      host: z.string().min(1).optional(),
    })
    .strict()
    .refine((e) => (e.preset === undefined) !== (e.modelDir === undefined), "embedded engines need exactly one of 'preset' or 'modelDir'")
    .optional(),
});

/** The fleet actor's config after validation. */
export type FleetConfig = z.infer<typeof fleetConfig>;

interface FleetState {
  fleet: Fleet;
  bus: Bus | null;
  embedded: EmbeddedEngine[];
  job: string;
  registry: FleetRegistry | null;
  /** Local copies of full checkpoints fetched from the object store. */
  weights: LocalWeights;
  /** Stops reporting this fleet's engines to Prometheus. */
  unwatch: () => void;
}

type UpdateMsg = Extract<FleetMsg, { op: "updateWeights" }>;
type Fallbacks = { engine: string; reason: string }[];

/**
 * A restarted fleet whose recorded weights (KV) are a directory that is gone (a local copy of an
 * earlier incarnation, or a trainer path this host cannot read): fetches the version's full
 * checkpoint object from the job's object store as the served copy and records it, so that engines
 * that join are brought to that version. When the object is not there either, it says so.
 */
async function restoreServed(registry: FleetRegistry, bus: Bus, weights: LocalWeights, job: string, log: { info(l: string): void; warn(l: string): void }): Promise<void> {
  const v = await registry.version();
  if (!v) return;
  if (hasWeights(v.modelDir)) {
    weights.adopt(v.version, v.modelDir);
    return;
  }
  const ref = { bucket: jobNames(job).objWeights, name: fullObjectName(v.version) };
  try {
    const dir = await weights.restore(bus, ref, v.version);
    await registry.putVersion({ version: v.version, modelDir: dir });
    log.info(`fleet: fetched weight version ${v.version} from '${ref.bucket}/${ref.name}' (its recorded copy ${v.modelDir} is gone)`);
  } catch (e) {
    log.warn(`fleet: weight version ${v.version} was recorded at ${v.modelDir}, which is gone, and cannot be fetched (${(e as Error).message}); engines that join cannot be brought to it until the next weight update`);
  }
}

/** Handles an updateWeights ask; returns the engines that refused a delta and loaded the full checkpoint. */
async function updateWeights(state: FleetState, msg: UpdateMsg, path: string, log: (l: string) => void): Promise<Fallbacks | undefined> {
  const { fleet, weights, bus } = state;
  const how = { ...(msg.mode ? { mode: msg.mode } : {}), ...(msg.flushCache === false ? { flushCache: false } : {}) };
  if ((msg.modelDir === undefined) === (msg.full === undefined))
    throw new OozeError("BAD_REQUEST", `fleet actor '${path}': updateWeights to '${msg.version}' needs exactly one of 'modelDir' (a directory the engines read) and 'full' (an object of the job's object store)`);
  if (!bus && (msg.full || msg.delta))
    throw new OozeError("CONFIG_INVALID", `fleet actor '${path}': weights in the object store need the job's NATS connection (run the fleet under ooze up / ooze node)`);
  const delta = msg.delta;
  if (msg.modelDir !== undefined) {
    if (!delta) return void (await fleet.updateWeights(msg.modelDir, msg.version, how));
    // Fetched to a local temp file for this update; engines that refuse it load modelDir (reported).
    const fullModelDir = msg.modelDir;
    return (await withDeltaObject(bus!, delta, (file) => fleet.updateWeights(file, msg.version, { ...how, loadFormat: DELTA_LOAD_FORMAT, fullModelDir }))).fullFallbacks;
  }
  const full = msg.full!;
  /** Runs the update from the local copy `dir` of the version, then keeps the copy the fleet serves. */
  const settled = async <T>(dir: string, run: () => Promise<T>): Promise<T> => {
    try {
      return await run();
    } finally {
      weights.settle(fleet.weightVersion, msg.version, dir);
    }
  };
  if (!delta) {
    const dir = await weights.fetch(bus!, full, msg.version);
    return void (await settled(dir, () => fleet.updateWeights(dir, msg.version, how)));
  }
  return withDeltaObject(bus!, delta, async (file) => {
    let dir: string;
    try {
      dir = weights.fromDelta(file, msg.version);
    } catch (e) {
      log(`fleet: cannot make weight version ${msg.version} from the served copy and the delta (${(e as Error).message}); fetching '${full.bucket}/${full.name}'`);
      dir = await weights.fetch(bus!, full, msg.version);
    }
    const fullModelDir = dir;
    return (await settled(dir, () => fleet.updateWeights(file, msg.version, { ...how, loadFormat: DELTA_LOAD_FORMAT, fullModelDir }))).fullFallbacks;
  });
}

const local = new Map<string, Fleet>();

/** The Fleet hosted by a fleet actor of `job` in this process, or null. */
export function localFleet(job: string): Fleet | null {
  return local.get(job) ?? null;
}

function busOf(system: ActorSystem): Bus | null {
  try {
    return remoteLayer(system).bus;
  } catch {
    return null;
  }
}

/** The fleet actor definition for a system (the bus, when attached, holds the KV registry). */
export function fleetActor(system: ActorSystem) {
  return defineActor<FleetState, FleetMsg>({
    name: "fleet",
    messages: fleetMsg,
    async init(ctx) {
      const parsed = fleetConfig.safeParse(ctx.config);
      if (!parsed.success) {
        const i = parsed.error.issues[0];
        throw new OozeError("TOPOLOGY_INVALID", `fleet actor '${ctx.path}': config field '${i?.path.join(".") || "(root)"}': ${i?.message ?? "invalid"}`);
      }
      const cfg = parsed.data;
      const job = typeof ctx.config.job === "string" ? ctx.config.job : system.name;
      const bus = busOf(system);
      const opts: FleetOptions = { job, log: (l) => ctx.log.info(l) };
      if (bus) opts.bus = bus;
      if (cfg.routing) opts.routing = cfg.routing;
      if (cfg.healthIntervalMs !== undefined) opts.healthIntervalMs = cfg.healthIntervalMs;
      if (cfg.healthTimeoutMs !== undefined) opts.healthTimeoutMs = cfg.healthTimeoutMs;
      if (cfg.controlTimeoutMs !== undefined) opts.controlTimeoutMs = cfg.controlTimeoutMs;
      if (cfg.unhealthyAfter !== undefined) opts.unhealthyAfter = cfg.unhealthyAfter;
      if (cfg.stream !== undefined) opts.stream = cfg.stream;
      if (cfg.requestTimeoutMs !== undefined) opts.requestTimeoutMs = cfg.requestTimeoutMs;
      if (cfg.maxRedispatches !== undefined) opts.maxRedispatches = cfg.maxRedispatches;
      if (cfg.router) opts.externalRouter = cfg.router;
      if (cfg.expectModel) opts.expectModel = cfg.expectModel;
      const registry = bus ? await FleetRegistry.open(bus, job) : null;
      if (registry) {
        // Engines an earlier incarnation started and never stopped (its process was killed).
        for (const p of await registry.processes()) {
          if (killOrphan(p.pid)) ctx.log.warn(`fleet: stopped orphaned embedded engine ${p.url} (pid ${p.pid}) of an earlier run`);
          await registry.remove(p.url);
          await registry.removeProcess(p.url);
        }
      }
      const weights = new LocalWeights(job);
      if (registry && bus) await restoreServed(registry, bus, weights, job, ctx.log);
      let fleet: Fleet;
      try {
        fleet = await Fleet.open(opts);
      } catch (err) {
        weights.close();
        throw err;
      }
      const embedded: EmbeddedEngine[] = [];
      const record = (url: string, pid: number) => void registry?.putProcess({ url, pid, startedAt: Date.now() }).catch(() => {});
      try {
        const e = cfg.embedded;
        if (e && e.count > 0) {
          for (let i = 0; i < e.count; i++) embedded.push(new EmbeddedEngine(e, i, (l) => ctx.log.info(l), record));
          const urls = await Promise.all(embedded.map((x) => x.start()));
          for (const url of urls) await fleet.attach(url, { source: "topology" });
        }
        const attach = async (spec: (typeof cfg.engines)[number]) => {
          const url = typeof spec === "string" ? spec : spec.url;
          const entry = await fleet.attach(url, { source: "topology", allowUnreachable: true });
          if (!entry.healthy) ctx.log.warn(`fleet: engine ${entry.url} is not reachable yet (${entry.lastError ?? "no answer"}); it joins when healthy`);
        };
        // The first alone (the model it serves is the one the others must serve), then 16 at once: a
        // topology may list a thousand engines, each asked two questions as it joins.
        if (cfg.engines.length > 0) await attach(cfg.engines[0]!);
        await eachLimit(cfg.engines.slice(1), 16, attach);
      } catch (err) {
        await Promise.all(embedded.map((x) => x.stop()));
        for (const x of embedded) if (x.url) await registry?.removeProcess(x.url).catch(() => {});
        await fleet.close();
        weights.close();
        throw err;
      }
      local.set(job, fleet);
      ctx.log.info(`fleet: ${fleet.list().length} engines (${embedded.length} embedded)`);
      const unwatch = watchFleet(job, ctx.path, () => {
        const es = fleet.list();
        return { healthy: es.filter((e) => e.healthy).length, total: es.length, requests: es.reduce((n, e) => n + e.inFlight, 0) };
      });
      return { fleet, bus, embedded, job, registry, weights, unwatch };
    },
    async handle(state, msg, ctx) {
      const { fleet } = state;
      const ok = (extra: Partial<Extract<FleetReply, { ok: true }>> = {}): FleetReply => ({ ok: true, engines: fleet.list(), weightVersion: fleet.weightVersion, ...extra });
      try {
        switch (msg.op) {
          case "attach": {
            const engine = await fleet.attach(msg.url, { source: msg.source ?? "runtime" });
            ctx.reply(ok({ engine }));
            break;
          }
          case "detach":
            await fleet.detach(msg.url);
            ctx.reply(ok());
            break;
          case "list":
            ctx.reply(ok());
            break;
          case "updateWeights": {
            const fullFallbacks = await updateWeights(state, msg, ctx.path, (l) => ctx.log.warn(l));
            ctx.reply(ok(fullFallbacks ? { fullFallbacks } : {}));
            break;
          }
        }
      } catch (e) {
        // A refused request is an answer, not a crash: the fleet and its engines stay as they are.
        ctx.reply({ ok: false, error: { ...toOozeError(e).toWire(), actor: ctx.path } } satisfies FleetReply);
      }
      return state;
    },
    async onStop(state) {
      state.unwatch();
      if (local.get(state.job) === state.fleet) local.delete(state.job);
      for (const e of state.embedded) if (e.url) await state.fleet.detach(e.url).catch(() => {});
      await Promise.all(state.embedded.map((e) => e.stop()));
      for (const e of state.embedded) if (e.url) await state.registry?.removeProcess(e.url).catch(() => {});
      await state.fleet.close();
      state.weights.close();
    },
  });
}
