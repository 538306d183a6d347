// One node of a running topology: the actors a topology places on one host, in one process, under
// one supervised actor system attached to the job's bus. Answers control requests on
// names.control(host): `ps` (its actors with state, restarts and mailbox depth) and `down` (drain
// in-flight work, stop, exit). Actor kinds are resolved by an injected resolver, so the core does
// not import the actors it hosts.
import { attachBus, createSystem, serveDurable, type ActorDefinition, type ActorInfo, type ActorSystem, type DurableMailbox } from "../actor/index.ts";
import { decode, encode } from "../codec/index.ts";
import { OozeError } from "../errors.ts";
import type { Bus, BusSubscription } from "../transport/bus.ts";
import { jobNames } from "../transport/names.ts";
import { hostOf } from "./load.ts";
import type { ActorSpec, Topology } from "./schema.ts";

/** Turns an actor spec's `kind` into its definition. */
export type KindResolver = (spec: ActorSpec, topology: Topology, system: ActorSystem) => Promise<ActorDefinition<unknown, unknown>>;

/** A control request to a node. */
export type ControlRequest = { op: "ps" } | { op: "down"; timeoutMs?: number };

/** A node's answer to `ps`. */
export interface NodeStatus {
  host: string;
  pid: number;
  actors: ActorInfo[];
  failure: string | null;
}

export interface RunningNode {
  readonly host: string;
  readonly system: ActorSystem;
  /** Resolves when the node has stopped (after `down`, `stop()` or a root escalation). */
  readonly stopped: Promise<{ reason: "down" | "stop" | "escalated"; error: OozeError | null }>;
  status(): NodeStatus;
  /** Drains (up to timeoutMs) and stops. */
  stop(timeoutMs?: number): Promise<void>;
}

/** Instance names of an actor spec: `name` for count 1, else `name-0` … `name-(n−1)`. */
export function instanceNames(spec: ActorSpec): string[] {
  return spec.count === 1 ? [spec.name] : Array.from({ length: spec.count }, (_, i) => `${spec.name}-${i}`);
}

/** Starts the actors of `topology` placed on `host`. */
export async function startNode(opts: {
  topology: Topology;
  host: string;
  job: string;
  bus: Bus;
  resolveKind: KindResolver;
  log?: (line: string) => void;
}): Promise<RunningNode> {
  const { topology, host, job, bus } = opts;
  const log = opts.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  if (!topology.hosts.some((h) => h.name === host))
    throw new OozeError("TOPOLOGY_INVALID", `topology '${topology.name}' has no host '${host}' (hosts: ${topology.hosts.map((h) => h.name).join(", ")})`);
  const names = jobNames(job);
  const system = createSystem({ name: job, supervision: topology.supervision, log });
  await attachBus(system, bus, { job });
  const mailboxes: DurableMailbox[] = [];
  const mine = topology.actors.filter((a) => hostOf(topology, a) === host);
  for (const spec of mine) {
    const def = await opts.resolveKind(spec, topology, system);
    const parent = spec.supervision ? system.supervisor({ name: `${spec.name}-sup`, supervision: spec.supervision }) : system;
    for (const name of instanceNames(spec)) {
      const ref = parent.spawn(def, { name, config: { ...spec.config, host, job, instance: name } });
      if (spec.durable) mailboxes.push(await serveDurable(system, ref.path));
    }
  }

  let resolveStopped!: (v: { reason: "down" | "stop" | "escalated"; error: OozeError | null }) => void;
  const stopped = new Promise<{ reason: "down" | "stop" | "escalated"; error: OozeError | null }>((r) => (resolveStopped = r));
  let stopping: Promise<void> | null = null;
  let control: BusSubscription | null = null;

  const status = (): NodeStatus => ({ host, pid: process.pid, actors: system.list(), failure: system.failure?.message ?? null });
  const stop = (reason: "down" | "stop" | "escalated", timeoutMs = 10_000, error: OozeError | null = null) => {
    stopping ??= (async () => {
      control?.unsubscribe();
      for (const mb of mailboxes) await mb.stop();
      if (reason !== "escalated") await system.drain({ timeoutMs });
      await system.stop();
      resolveStopped({ reason, error });
    })();
    return stopping;
  };

  control = bus.subscribe(names.control(host), {
    handler: async (msg) => {
      let req: ControlRequest;
      try {
        req = decode(msg.data) as ControlRequest;
      } catch {
        return;
      }
      if (req?.op === "ps") await msg.respond(encode(status()));
      else if (req?.op === "down") {
        await msg.respond(encode({ ok: true, host }));
        void stop("down", req.timeoutMs);
      }
    },
  });
  void system.escalation.then((e) => {
    log(`[${host}] ${e.message}`);
    void stop("escalated", 0, e);
  });
  return { host, system, stopped, status, stop: (t) => stop("stop", t) };
}

/** Asks one node for its status (TimeoutError / ACTOR_NOT_FOUND when it does not answer). */
export async function nodeStatus(bus: Bus, job: string, host: string, timeoutMs = 2_000): Promise<NodeStatus> {
  const m = await bus.request(jobNames(job).control(host), encode({ op: "ps" } satisfies ControlRequest), { timeoutMs });
  return decode(m.data) as NodeStatus;
}

/** Tells one node to drain and stop. */
export async function nodeDown(bus: Bus, job: string, host: string, timeoutMs = 10_000): Promise<void> {
  await bus.request(jobNames(job).control(host), encode({ op: "down", timeoutMs } satisfies ControlRequest), { timeoutMs: 5_000 });
}
