// Actor kinds a topology can name: the built-in ones by name, or a module path (relative to the
// topology file) whose default export is an actor definition or a function (system) → definition.
// This is the composition root that brings actors/ into the runtime.
import { isAbsolute, dirname, resolve } from "node:path";
import type { ActorDefinition, ActorSystem } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import { importUserModule } from "../../src/user-module.ts";
import type { KindResolver } from "../../src/topology/node.ts";
import type { ActorSpec, Topology } from "../../src/topology/schema.ts";

type AnyDef = ActorDefinition<unknown, unknown>;
type Factory = (system: ActorSystem, topology: Topology) => AnyDef | Promise<AnyDef>;

const BUILTIN: Record<string, () => Promise<Factory>> = {
  "echo.server": async () => {
    const m = await import("../../actors/echo/echo.ts");
    return () => m.echoServer as unknown as AnyDef;
  },
  "echo.pinger": async () => {
    const m = await import("../../actors/echo/echo.ts");
    return (system) => m.echoPinger(system) as unknown as AnyDef;
  },
  fleet: async () => {
    const m = await import("../../actors/fleet/fleet-actor.ts");
    return (system) => m.fleetActor(system) as unknown as AnyDef;
  },
  // The training loop as actors over JetStream streams (topologies/quickstart-actors.yaml).
  "train.rollout": async () => {
    const m = await import("../../actors/rollout/rollout-actor.ts");
    return (system, topology) => m.rolloutActor(system, topology) as unknown as AnyDef;
  },
  "train.buffer": async () => {
    const m = await import("../../actors/buffer/buffer-actor.ts");
    return (system, topology) => m.bufferActor(system, topology) as unknown as AnyDef;
  },
  "train.trainer": async () => {
    const m = await import("../../actors/trainer/trainer-actor.ts");
    return (system, topology) => m.trainerActor(system, topology) as unknown as AnyDef;
  },
  "train.weight-sync": async () => {
    const m = await import("../../actors/weight-sync/weight-sync-actor.ts");
    return (system, topology) => m.weightSyncActor(system, topology) as unknown as AnyDef;
  },
};

/** Names of the built-in kinds. */
export const builtinKinds = (): string[] => Object.keys(BUILTIN);

function isDefinition(x: unknown): x is AnyDef {
  return typeof x === "object" && x !== null && typeof (x as AnyDef).handle === "function" && typeof (x as AnyDef).init === "function";
}

/** Resolves built-in kinds and module paths. */
export const resolveKind: KindResolver = async (spec: ActorSpec, topology: Topology, system: ActorSystem) => {
  const builtin = BUILTIN[spec.kind];
  if (builtin) return (await builtin())(system, topology);
  if (!spec.kind.includes("/") && !spec.kind.endsWith(".ts") && !spec.kind.endsWith(".js"))
    throw new OozeError(
      "TOPOLOGY_INVALID",
      `${topology.file ?? "topology"}: actor '${spec.name}' has unknown kind '${spec.kind}'; built-in kinds: ${builtinKinds().join(", ")}, or a module path like ./my-actor.ts`,
    );
  const base = topology.file ? dirname(topology.file) : process.cwd();
  const path = isAbsolute(spec.kind) ? spec.kind : resolve(base, spec.kind);
  let mod: { default?: unknown };
  try {
    mod = (await importUserModule(path)) as { default?: unknown };
  } catch (e) {
    throw new OozeError("TOPOLOGY_INVALID", `actor '${spec.name}': cannot load kind module ${path}: ${(e as Error).message}`, { cause: e });
  }
  const d = mod.default;
  if (isDefinition(d)) return d;
  if (typeof d === "function") {
    const made = await (d as (system: ActorSystem) => AnyDef | Promise<AnyDef>)(system);
    if (isDefinition(made)) return made;
  }
  throw new OozeError("TOPOLOGY_INVALID", `actor '${spec.name}': ${path} must export default an actor definition (defineActor) or a function (system) => definition`);
};
