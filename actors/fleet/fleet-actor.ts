// The fleet actor (kind "fleet"): hosts a Fleet for its job. Engines come from its topology config —
// `engines: [{url}]` (external servers, attached as "topology" engines, joining when reachable) and
// `embedded: {count, preset | modelDir, …}` (child processes running `ooze serve`, attached once they
// listen, killed when the actor stops) — and from runtime asks: {op:"attach", url}, {op:"detach", url},
// {op:"list"}, {op:"updateWeights", modelDir, version, mode, delta?} (with `delta`: an object of the
// job's object store that the fleet fetches to a temp file and has its engines load as "ooze-delta",
// modelDir being the full fallback). The engine set lives in the job's KV bucket, so a restarted
// actor recovers runtime-attached engines. Actors in the same process use the Fleet itself through
// `localFleet(job)` for generation.
import { z } from "zod";
import { remoteLayer, defineActor, type ActorSystem } from "../../src/actor/index.ts";
import { Fleet, type FleetOptions } from "../../src/engine/fleet.ts";
import { OozeError, toOozeError } from "../../src/errors.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { FleetRegistry } from "../../src/engine/fleet-registry.ts";
import { withDeltaObject } from "../weight-sync/delta-store.ts";
import { DELTA_LOAD_FORMAT } from "../weight-sync/engine-loader.ts";
import { EmbeddedEngine, killOrphan } from "./embedded.ts";
import { fleetMsg, type FleetMsg, type FleetReply } from "./messages.ts";

/** The fleet actor's `config` in a topology. */
export const fleetConfig = z.looseObject({
  routing: z.enum(["round_robin", "least_load", "cache_aware"]).optional(),
  healthIntervalMs: z.number().int().min(0).optional(),
  healthTimeoutMs: z.number().int().positive().optional(),
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
      const fleet = await Fleet.open(opts);
      const embedded: EmbeddedEngine[] = [];
      const record = (url: string, pid: number) => void registry?.putProcess({ url, pid, startedAt: Date.now() }).catch(() => {});
      try {
        const e = cfg.embedded;
        if (e && e.count > 0) {
          for (let i = 0; i < e.count; i++) embedded.push(new EmbeddedEngine(e, i, (l) => ctx.log.info(l), record));
          const urls = await Promise.all(embedded.map((x) => x.start()));
          for (const url of urls) await fleet.attach(url, { source: "topology" });
        }
        for (const spec of cfg.engines) {
          const url = typeof spec === "string" ? spec : spec.url;
          const entry = await fleet.attach(url, { source: "topology", allowUnreachable: true });
          if (!entry.healthy) ctx.log.warn(`fleet: engine ${entry.url} is not reachable yet (${entry.lastError ?? "no answer"}); it joins when healthy`);
        }
      } catch (err) {
        await Promise.all(embedded.map((x) => x.stop()));
        for (const x of embedded) if (x.url) await registry?.removeProcess(x.url).catch(() => {});
        await fleet.close();
        throw err;
      }
      local.set(job, fleet);
      ctx.log.info(`fleet: ${fleet.list().length} engines (${embedded.length} embedded)`);
      return { fleet, bus, embedded, job, registry };
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
            const mode = msg.mode ? { mode: msg.mode } : {};
            if (!msg.delta) {
              await fleet.updateWeights(msg.modelDir, msg.version, mode);
              ctx.reply(ok());
              break;
            }
            if (!state.bus) throw new OozeError("CONFIG_INVALID", `fleet actor '${ctx.path}': a weight delta in the object store needs the job's NATS connection (run the fleet under ooze up / ooze node)`);
            // Fetched to a local temp file for this update; engines that refuse it load modelDir (reported).
            const report = await withDeltaObject(state.bus, msg.delta, (file) =>
              fleet.updateWeights(file, msg.version, { ...mode, loadFormat: DELTA_LOAD_FORMAT, fullModelDir: msg.modelDir }),
            );
            ctx.reply(ok({ fullFallbacks: report.fullFallbacks }));
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
      if (local.get(state.job) === state.fleet) local.delete(state.job);
      for (const e of state.embedded) if (e.url) await state.fleet.detach(e.url).catch(() => {});
      await Promise.all(state.embedded.map((e) => e.stop()));
      for (const e of state.embedded) if (e.url) await state.registry?.removeProcess(e.url).catch(() => {});
      await state.fleet.close();
    },
  });
}
