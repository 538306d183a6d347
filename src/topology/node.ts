// One node of a running topology: the actors a topology places on one host, in one process, under
// one supervised actor system attached to the job's bus. It serves the node's control subject
// (`ps`: its actors with state, restarts and mailbox depth; `down`: drain in-flight work, then stop)
// through src/actor/control.ts. Actor kinds are resolved by an injected resolver, so the core does
// not import the actors it hosts.
import {
  attachBus,
  controlRequest,
  createSystem,
  serveControl,
  startActors,
  type ActorDefinition,
  type ActorSystem,
  type DownReply,
  type PsReply,
  type StartedActor,
} from "../actor/index.ts";
import { OozeError } from "../errors.ts";
import { gauge, processMetrics, startMetricsServer, type MetricsServer } from "../metrics.ts";
import type { Bus } from "../transport/bus.ts";
import type { ActorSpec, Topology } from "./schema.ts";

/** Turns an actor spec's `kind` into its definition; gets the node's system for remote refs. */
// biome-ignore lint: definitions of any state/message type are hosted side by side.
export type KindResolver = (spec: ActorSpec, topology: Topology, system: ActorSystem) => Promise<ActorDefinition<any, any>>;

export type StopReason = "down" | "stop" | "escalated";

export interface RunningNode {
  readonly host: string;
  readonly system: ActorSystem;
  readonly actors: readonly StartedActor[];
  /** The node's Prometheus endpoint (its process's metrics), or null when `metrics: false`. */
  readonly metricsUrl: string | null;
  /** Resolves when the node has stopped (after `down`, `stop()` or a root escalation). */
  readonly stopped: Promise<{ reason: StopReason; error: OozeError | null }>;
  /** Drains (up to timeoutMs) and stops. */
  stop(timeoutMs?: number): Promise<void>;
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
  const m = topology.metrics;
  const metrics: MetricsServer | null = m === false ? null : await startMetricsServer(processMetrics(), m === true ? {} : m);
  const system = createSystem({ name: job, supervision: topology.supervision, log });
  const unwatch = metrics ? watchActors(system) : () => undefined;
  const specs = topology.actors.map((a) => ({ ...a, config: { ...a.config, host, job } }));
  const byName = new Map(topology.actors.map((a) => [a.name, a]));
  let actors: StartedActor[];
  try {
    await attachBus(system, bus, { job });
    actors = await startActors(system, specs, (_kind, spec) => opts.resolveKind(byName.get(spec.name)!, topology, system), {
      host,
      defaultHost: topology.hosts[0]!.name,
    });
  } catch (e) {
    // a node that fails to start leaves nothing behind: no actor, no metrics server in this process
    await system.stop().catch(() => undefined);
    unwatch();
    await metrics?.close().catch(() => undefined);
    throw e;
  }

  let resolveStopped!: (v: { reason: StopReason; error: OozeError | null }) => void;
  const stopped = new Promise<{ reason: StopReason; error: OozeError | null }>((r) => (resolveStopped = r));
  let stopping: Promise<void> | null = null;
  let unserve: () => void = () => undefined;
  const stop = (reason: StopReason, timeoutMs = 10_000, error: OozeError | null = null) => {
    stopping ??= (async () => {
      unserve();
      for (const a of actors) await a.durable?.stop();
      if (reason === "stop") await system.drain({ timeoutMs });
      await system.stop();
      unwatch();
      await metrics?.close();
      resolveStopped({ reason, error });
    })();
    return stopping;
  };
  // `down` drains before answering (serveControl), then calls onDown.
  try {
    unserve = await serveControl(system, host, { onDown: () => stop("down"), metricsUrl: () => metrics?.url ?? null });
  } catch (e) {
    await stop("escalated", 0);
    throw e;
  }
  void system.escalation.then((e) => {
    log(`[${host}] ${e.message}`);
    void stop("escalated", 0, e);
  });
  return { host, system, actors, metricsUrl: metrics?.url ?? null, stopped, stop: (t) => stop("stop", t) };
}

const systems = new Set<ActorSystem>();

/**
 * Every actor's supervision and mailbox figures (what `ooze ps` shows) as Prometheus series, read from
 * the node systems of this process at each scrape.
 */
function watchActors(system: ActorSystem): () => void {
  systems.add(system);
  const r = processMetrics();
  const each = (pick: (a: ReturnType<ActorSystem["list"]>[number]) => number) => (g: ReturnType<typeof gauge>) => {
    g.reset();
    for (const s of systems) for (const a of s.list()) g.set({ job: s.name, actor: a.path }, pick(a));
  };
  const L = ["job", "actor"];
  gauge(r, "ooze_actor_restarts", "Restarts of the actor by its supervisor.", L, each((a) => a.restarts));
  gauge(r, "ooze_actor_mailbox_depth", "Messages waiting in the actor's mailbox.", L, each((a) => a.mailboxDepth));
  gauge(r, "ooze_actor_processed", "Messages the actor has handled.", L, each((a) => a.processed));
  gauge(r, "ooze_actor_dead_letters", "Messages that could not be delivered to the actor (dead-lettered).", L, each((a) => a.deadLetters));
  gauge(r, "ooze_actor_malformed", "Frames for the actor that failed to decode or validate.", L, each((a) => a.malformed));
  return () => void systems.delete(system);
}

/** Asks one node for its actors (TimeoutError / ACTOR_NOT_FOUND when it does not answer). */
export function nodeStatus(bus: Bus, job: string, host: string, timeoutMs = 2_000): Promise<PsReply> {
  return controlRequest<PsReply>(bus, job, host, { op: "ps" }, timeoutMs);
}

/** Tells one node to drain and stop; resolves with whether it drained. */
export function nodeDown(bus: Bus, job: string, host: string, drainMs = 10_000): Promise<DownReply> {
  return controlRequest<DownReply>(bus, job, host, { op: "down", drainMs }, drainMs + 5_000);
}
