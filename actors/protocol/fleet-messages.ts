// The fleet actor's protocol: attach / detach / list / update-weights (the full checkpoint as a model
// directory or as an object of the job's object store, optionally with a delta object) asks, and
// their replies. A refused request is a reply `{ok: false, error}` (not a crash of the actor);
// `askFleet` turns it back into the OozeError the fleet raised.
import { z } from "zod";
import { attachBus, createSystem, remoteRef, type ActorRef } from "../../src/actor/index.ts";
import type { EngineEntry } from "../../src/engine/fleet/fleet.ts";
import { OozeError, type WireError } from "../../src/errors.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";

/** An object of an object store bucket. */
const objectRef = z.object({ bucket: z.string().min(1), name: z.string().min(1) });

/** Asks the fleet actor answers. */
export const fleetMsg = z.discriminatedUnion("op", [
  z.object({ op: z.literal("attach"), url: z.string().min(1), source: z.enum(["topology", "runtime"]).optional() }),
  z.object({ op: z.literal("detach"), url: z.string().min(1) }),
  z.object({ op: z.literal("list") }),
  z.object({
    op: z.literal("updateWeights"),
    /**
     * The version's full checkpoint as a model directory the engines read (with `delta`: for engines
     * that refuse the delta or join later). Exactly one of `modelDir` and `full`.
     */
    modelDir: z.string().min(1).optional(),
    /**
     * The version's full checkpoint as an object of the job's object store (`full-v{N}`,
     * actors/weight-sync/full-store.ts): the fleet fetches it to a local directory of its own.
     */
    full: objectRef.optional(),
    version: z.string().min(1),
    mode: z.enum(["abort", "in_place"]).optional(),
    /** false: the engines keep their prefix caches across the update (`train.keepCacheOnUpdate`). */
    flushCache: z.boolean().optional(),
    /** A weight delta (actors/weight-sync/delta.ts) in the job's object store: fetched by the fleet and loaded as "ooze-delta". */
    delta: objectRef.optional(),
  }),
]);

/** One ask to the fleet actor. */
export type FleetMsg = z.infer<typeof fleetMsg>;

/** The fleet actor's answer. */
export type FleetReply =
  | {
      ok: true;
      engine?: EngineEntry;
      engines: EngineEntry[];
      weightVersion: string | null;
      /** After a delta update: engines that refused the delta and loaded the full checkpoint, with why. */
      fullFallbacks?: { engine: string; reason: string }[];
    }
  | { ok: false; error: WireError };

/** Asks the fleet actor and unwraps its reply: the engines, or the fleet's OozeError. */
export async function askFleet(ref: ActorRef<FleetMsg>, msg: FleetMsg, timeoutMs = 60_000): Promise<Extract<FleetReply, { ok: true }>> {
  // A weight update is idempotent (the engines already at its version only record it), and so is a list.
  const r = await ref.ask<FleetReply>(msg, { timeoutMs, idempotent: msg.op === "updateWeights" || msg.op === "list" });
  if (!r || typeof r !== "object" || !("ok" in r)) throw new OozeError("MALFORMED_MESSAGE", `fleet actor '${ref.path}' sent a reply that is not a FleetReply`);
  if (!r.ok) throw OozeError.fromWire(r.error);
  return r;
}

/**
 * Asks the fleet actor `actor` of job `job` over a connected bus (what `ooze engines` and the
 * dashboard's attach/detach buttons do): first a short `list` probe, so a job without that fleet
 * actor gets ACTOR_NOT_FOUND naming the subject, then `msg`; the fleet's own refusals (a different
 * model, an unreachable URL) come back as its OozeError.
 */
export async function askJobFleet(bus: Bus, job: string, actor: string, msg: FleetMsg, timeoutMs: number) {
  const system = createSystem({ name: job, log: () => {} });
  try {
    await attachBus(system, bus, { job, serve: false, events: false });
    const ref = remoteRef<FleetMsg>(system, actor);
    try {
      await askFleet(ref, { op: "list" }, 3_000);
    } catch (e) {
      if (e instanceof OozeError && e.code === "TIMEOUT") {
        throw new OozeError(
          "ACTOR_NOT_FOUND",
          `job '${job}' has no fleet actor '${actor}' answering (asked on ${jobNames(job).actor(actor)}); add an actor of kind 'fleet' to the topology, or pass --actor NAME`,
        );
      }
      throw e;
    }
    return await askFleet(ref, msg, timeoutMs);
  } finally {
    await system.stop().catch(() => {});
  }
}
