// Starting actors from topology specs {name, kind, count, config, placement, supervision, durable}:
// what `ooze up` / `ooze node` call. Kinds are resolved by the caller (built-in kinds or modules).
import { OozeError } from "../errors.ts";
import type { SupervisionPolicy } from "../supervisor/policy.ts";
import { serveDurable, type DurableMailbox, type DurableOptions } from "./durable.ts";
import type { ActorSystem } from "./system.ts";
import type { ActorDefinition, ActorRef } from "./types.ts";

/** One actor entry of a topology (the fields of topology's ActorSpec that hosting needs). */
export interface ActorSpecInput {
  name: string;
  kind: string;
  count?: number;
  config?: Record<string, unknown>;
  placement?: string | undefined;
  supervision?: Partial<SupervisionPolicy> | undefined;
  durable?: boolean;
}

/** Resolves a spec's kind to a definition (throw OozeError TOPOLOGY_INVALID for unknown kinds). */
// biome-ignore lint: definitions of any state/message type are hosted side by side.
export type KindResolver = (kind: string, spec: ActorSpecInput) => ActorDefinition<any, any> | Promise<ActorDefinition<any, any>>;

/** Options of `startActors`. */
export interface StartActorsOptions {
  /** Only specs placed on this host start here (a spec without placement goes to `defaultHost`). */
  host?: string;
  /** Host of specs without placement (the topology's first host); default: same as `host`. */
  defaultHost?: string;
  /** Settings of the durable mailboxes of `durable: true` specs. */
  durable?: DurableOptions;
}

/** One started actor instance. */
export interface StartedActor {
  spec: string;
  path: string;
  ref: ActorRef<unknown>;
  durable: DurableMailbox | null;
}

/**
 * Starts the specs placed on this host. A spec with count 1 and no supervision section becomes the
 * top-level actor `name`; otherwise a supervisor `name` (with the spec's policy) gets the instances
 * `name/0` … `name/{count-1}`. Durable specs also consume their JetStream mailbox (needs attachBus).
 */
export async function startActors(
  system: ActorSystem,
  specs: readonly ActorSpecInput[],
  resolve: KindResolver,
  opts: StartActorsOptions = {},
): Promise<StartedActor[]> {
  const started: StartedActor[] = [];
  try {
    for (const spec of specs) {
      const where = spec.placement ?? opts.defaultHost ?? opts.host;
      if (opts.host !== undefined && where !== opts.host) continue;
      const count = spec.count ?? 1;
      if (!Number.isInteger(count) || count < 1) {
        throw new OozeError("TOPOLOGY_INVALID", `actor '${spec.name}': count must be an integer >= 1 (got ${count})`);
      }
      const def = await resolve(spec.kind, spec);
      const config = spec.config ?? {};
      const refs: ActorRef<unknown>[] = [];
      if (count === 1 && spec.supervision === undefined) {
        refs.push(system.spawn(def, { name: spec.name, config }));
      } else {
        const sup = system.supervisor({ name: spec.name, ...(spec.supervision ? { supervision: spec.supervision } : {}) });
        for (let i = 0; i < count; i++) refs.push(sup.spawn(def, { name: String(i), config }));
      }
      for (const ref of refs) {
        const durable = spec.durable ? await serveDurable(system, ref.path, opts.durable) : null;
        started.push({ spec: spec.name, path: ref.path, ref, durable });
      }
    }
  } catch (e) {
    // what was served so far stops with the failure; the caller stops the system's actors
    for (const a of started) await a.durable?.stop().catch(() => undefined);
    throw e;
  }
  return started;
}
