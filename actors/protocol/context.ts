// What every training-loop actor needs at init, and the one way such an actor is declared
// (defineLoopActor): the job's bus and names, the topology's `train:` section (trainSchema of
// ./config.ts, so `ooze train` and `ooze up` read the same file), the directory relative paths
// resolve against, its own validated config, and the control message that turns a background
// failure into a crash its supervisor handles.
import { dirname } from "node:path";
import { z } from "zod";
import { defineActor, remoteLayer, type ActorContext, type ActorDefinition, type ActorSystem } from "../../src/actor/index.ts";
import { newMessageId } from "../../src/codec/index.ts";
import { OozeError, toOozeError, type ErrorCode } from "../../src/errors.ts";
import type { Topology } from "../../src/topology/schema.ts";
import type { Bus } from "../../src/transport/bus.ts";
import type { JobNames } from "../../src/transport/names.ts";
import { trainSchema, type TrainConfig } from "./config.ts";

/** The job-level context of a loop actor. */
export interface LoopEnv {
  bus: Bus;
  names: JobNames;
  job: string;
  train: TrainConfig;
  /** Directory of the topology file (relative paths in it resolve here). */
  baseDir: string;
  /** Hosts of the topology (the trainer stops them all when the run is done). */
  hosts: string[];
  host: string;
}

/** Messages every loop actor accepts: a background task of `incarnation` failed (→ crash, restart by its supervisor). */
export const loopControl = z.object({
  op: z.literal("failed"), error: z.string(), incarnation: z.string(),
  /** Set for a failure no restart can cure (ESCALATE_AT_ONCE): its code, and the crash escalates. */
  code: z.string().optional(),
});

/**
 * Codes of background failures that a restart cannot cure: the actor's crash escalates at once (the
 * job stops with the error) instead of restarting into the same failure again.
 */
export const ESCALATE_AT_ONCE: readonly ErrorCode[] = ["AGENTS_UNPRODUCTIVE", "SANDBOX_UNAVAILABLE"];
/** A loop actor's control message. */
export type LoopControl = z.infer<typeof loopControl>;

/** Builds the LoopEnv of an actor from its system, the topology and ctx.config (host, job). */
function loopEnv(system: ActorSystem, topology: Topology, ctx: ActorContext<unknown>): LoopEnv {
  const { bus, names } = remoteLayer(system);
  return {
    bus,
    names,
    job: typeof ctx.config.job === "string" ? ctx.config.job : system.name,
    train: trainOf(topology),
    baseDir: topology.file ? dirname(topology.file) : process.cwd(),
    hosts: topology.hosts.map((h) => h.name),
    host: typeof ctx.config.host === "string" ? ctx.config.host : topology.hosts[0]!.name,
  };
}

/** The topology's `train:` section, validated (TOPOLOGY_INVALID naming the field). */
export function trainOf(topology: Topology): TrainConfig {
  const t = trainSchema.safeParse(topology.train ?? {});
  if (!t.success)
    throw new OozeError("TOPOLOGY_INVALID", `${topology.file ?? "topology"}: train: ${t.error.issues.map((i) => `${i.path.join(".") || "(section)"}: ${i.message}`).join("; ")}`);
  return t.data;
}

/** Validates an actor's own `config` (host and job, added by the node, are allowed). */
export function actorConfig<S extends z.ZodObject>(schema: S, ctx: ActorContext<unknown>): z.output<S> {
  const { host: _h, job: _j, ...own } = ctx.config;
  const r = schema.strict().safeParse(own);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new OozeError("TOPOLOGY_INVALID", `actor '${ctx.path}': config field '${i?.path.join(".") || "(root)"}': ${i?.message ?? "invalid"}`);
  }
  return r.data as z.output<S>;
}

/**
 * A reporter for background failures of one incarnation of an actor: logs and sends the actor one
 * `failed` message (a crash). The handler ignores a message of an earlier incarnation.
 */
function failer(ctx: ActorContext<LoopControl>): { incarnation: string; fail(e: unknown): void } {
  const incarnation = newMessageId();
  let sent = false;
  return {
    incarnation,
    fail(e) {
      if (sent) return;
      sent = true;
      const err = toOozeError(e);
      ctx.log.error(err.message);
      const fatal = !err.retryable && ESCALATE_AT_ONCE.includes(err.code);
      ctx.self.tell({ op: "failed", error: err.message, incarnation, ...(fatal ? { code: err.code } : {}) });
    },
  };
}

/** What a loop actor declares: its role, the schema of its own `config`, how it starts and stops. */
export interface LoopActorSpec<S, C extends z.ZodObject> {
  /** The actor's role: it is named `train-ROLE`, and its crash messages start with `ROLE:`. */
  role: string;
  /** Schema of the actor's `config` in the topology (validated at every start; host and job are added by the node). */
  config: C;
  /**
   * Starts one incarnation of the actor and returns its state. `fail` reports a failure of a
   * background task of this incarnation: the actor crashes, and its supervisor restarts it.
   */
  init(env: LoopEnv, cfg: z.output<C>, ctx: ActorContext<LoopControl>, fail: (e: unknown) => void): Promise<S>;
  /** Stops the incarnation (also before a restart). */
  onStop(state: S, ctx: ActorContext<LoopControl>): Promise<void>;
}

/** A loop actor's state: its own, and the incarnation whose failures crash it. */
export interface LoopActorState<S> {
  own: S;
  incarnation: string;
}

/**
 * Declares a training-loop actor (rollout, buffer, trainer, weight-sync) for a node's system and
 * topology: the `train:` section is checked now (a bad one fails the node at start, not at every
 * restart); each start builds its LoopEnv and validated config; a `failed` report of the current
 * incarnation crashes it (one of an earlier incarnation is ignored).
 */
export function defineLoopActor<S, C extends z.ZodObject>(system: ActorSystem, topology: Topology, spec: LoopActorSpec<S, C>): ActorDefinition<LoopActorState<S>, LoopControl> {
  trainOf(topology);
  return defineActor<LoopActorState<S>, LoopControl>({
    name: `train-${spec.role}`,
    messages: loopControl,
    async init(ctx) {
      const env = loopEnv(system, topology, ctx as ActorContext<unknown>);
      const cfg = actorConfig(spec.config, ctx as ActorContext<unknown>);
      const { fail, incarnation } = failer(ctx);
      return { own: await spec.init(env, cfg, ctx, fail), incarnation };
    },
    handle(state, msg) {
      if (msg.incarnation !== state.incarnation) return state; // about an incarnation already restarted
      if (msg.code !== undefined) throw new OozeError(msg.code as ErrorCode, `${spec.role}: ${msg.error}`, { retryable: false });
      throw new OozeError("ACTOR_CRASHED", `${spec.role}: ${msg.error}`, { retryable: true });
    },
    onStop: (state, ctx) => spec.onStop(state.own, ctx),
  });
}
