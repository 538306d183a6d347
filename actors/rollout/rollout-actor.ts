// The rollout actor (kind `train.rollout`): consumes prompt groups from the PROMPTS work queue (a
// durable consumer shared by every rollout instance, `concurrency` groups in flight each), runs the
// group's episodes on the job's engines (the ones the fleet actor registered in the engines KV
// bucket) with rolloutRange, publishes the group's samples as one message (msgID per prompt and
// attempt), and only then acks the prompt. A rollout killed mid-group leaves its prompt unacked: it
// comes back after ackWaitMs and is generated again with the same sample indices, and the stream's
// duplicate window keeps a group published twice from being stored twice.
import { z } from "zod";
import type { ActorSystem } from "../../src/actor/index.ts";
import type { Fleet } from "../../src/engine/fleet/fleet.ts";
import { normalizeEngineUrl } from "../../src/engine/fleet/types.ts";
import { FleetRegistry } from "../../src/engine/fleet/registry.ts";
import { OozeError } from "../../src/errors.ts";
import { settleWithin, whileElecting } from "../../src/transport/bus.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { defineLoopActor } from "../protocol/context.ts";
import { groupMsg, groupMsgId, promptRegistry } from "../protocol/messages.ts";
import { consumeStream, ensureTrainStreams, publish, type StreamConsumer } from "../protocol/streams.ts";
import { fullyAsyncLimits } from "../protocol/config.ts";
import { rolePolicies, singlePolicy } from "../protocol/policies.ts";
import type { TrainConfig } from "../protocol/config.ts";
import type { Task } from "../environment/task.ts";
import { FleetGenerator } from "./generator.ts";
import { loadTask } from "../environment/task-loader.ts";
import { rolloutRange } from "./rollout.ts";
import { engineShare, RolloutMembers } from "./shard.ts";
import { startAgentRollout, type AgentRollout } from "../environment/agent/rollout-hook.ts";
import { eachLimit } from "../../src/each-limit.ts";

/** The rollout actor's `config`. */
export const rolloutActorConfig = z.object({
  /**
   * Prompt groups generated at once by this instance (default: a step's prompts, or in fully_async
   * maxInflightGroups, divided among the topology's rollout instances: see rolloutConcurrency).
   */
  concurrency: z.number().int().min(1).optional(),
  /**
   * A group's prompt comes back to another consumer after this long without a heartbeat (the handler
   * beats every third of it): a killed rollout's, or one whose ack a crashed nats-server forgot (the
   * consumer takes at most `concurrency` unacked prompts, so such prompts hold up new ones until then).
   */
  ackWaitMs: z.number().int().min(500).default(10_000),
  /** How long to wait for the fleet to register its first engine. */
  engineWaitMs: z.number().int().min(0).default(120_000),
  /**
   * Progress deadline of one generation dispatch, ms (the rollout's Fleet progressTimeoutMs, default
   * 10 000 plus progressTimeoutPerTokenMs per token of budget, tightened by observed durations but
   * not below minProgressTimeoutMs): a dispatch past it is aborted on its engine and re-dispatched.
   */
  progressTimeoutMs: z.number().int().min(1).optional(),
  progressTimeoutPerTokenMs: z.number().min(0).optional(),
  minProgressTimeoutMs: z.number().int().min(1).optional(),
  /** How often it reads the engines registry and renews its membership among the rollout instances, ms. */
  registryPollMs: z.number().int().min(50).default(2_000),
  /** How often its fleet health-checks each engine of its share, ms (default 5 000; 0: never). */
  healthIntervalMs: z.number().int().min(0).optional(),
  /** Failed dispatches of one generation retried (elsewhere, or after a backoff) before the episode fails (default 10). */
  maxRetries: z.number().int().min(0).optional(),
  /**
   * Fault injection for tests: on its first delivery, group `holdGroup` is generated and then never
   * published nor acked (the process is meant to be killed there).
   */
  holdGroup: z.number().int().min(0).optional(),
});

/** Engines joined (or detached) at once when the share changes. */
const ATTACH_CONCURRENCY = 16;

interface RolloutState {
  consumer: StreamConsumer;
  gen: FleetGenerator;
  stopFollowing: () => Promise<void>;
  agents: AgentRollout | null;
}

/**
 * Keeps the rollout's fleet in step with the engines KV bucket (engines the fleet actor attaches,
 * replaces or detaches, e.g. after its process restarted) and with the weight version the fleet
 * actor brings them to (an engine back from a restart joins routing only once it serves it);
 * with `members`, it routes over this instance's share of the engines only (shard.ts), renewing its
 * membership every `everyMs` (from the bus's heartbeat worker, whatever a pass takes or the event loop
 * does). Returns the stop function, which resolves once a pass in flight has ended and the membership is
 * given up: await it before the bus closes, or a request still in flight outlives the connection
 * (docs/reliability.md, finding 10).
 */
export function followRegistry(fleet: Fleet, registry: FleetRegistry, log: (l: string) => void, everyMs = 2_000, members: RolloutMembers | null = null): () => Promise<void> {
  let stopped = false;
  let pass: Promise<void> | null = null;
  let lastShare = "";
  // The engines are listed again only when an engine's entry changed after the bucket's sequence at
  // the last listing (one request a pass; a listing is a get per engine: at a thousand engines,
  // every 2 s, in every rollout instance, that would be most of their work). The weight version,
  // which the fleet actor writes to the same bucket every step, does not count.
  let seenAt = -1;
  let listings = 0;
  let urls: string[] = [];
  // The share is computed again only when the engines or the members changed: it is a SHA-1 per
  // engine and member (4,096 at 1,024 engines and four instances, every pass, in every instance).
  let sharedFor = "";
  let shared: string[] = [];
  const follow = async () => {
    try {
      const v = await registry.version();
      if (v) fleet.followVersion(v.version);
      if (seenAt < 0 || (await registry.enginesChangedAfter(seenAt))) {
        const seq = await registry.lastSeq(); // (before the listing: a change during it is seen next pass)
        urls = (await registry.entries()).map((e) => normalizeEngineUrl(e.url));
        listings++;
        seenAt = seq;
      }
      let want = new Set(urls);
      if (members) {
        const all = await members.members();
        const key = `${listings}\n${[...all].sort().join("\n")}`;
        if (key !== sharedFor) [shared, sharedFor] = [engineShare(urls, all, members.self), key];
        want = new Set(shared);
        const share = `${want.size} of ${urls.length} engines, ${all.length} rollout instance(s)`;
        // (a lone instance, routing over every engine, says nothing)
        if (share !== lastShare && (all.length > 1 || lastShare !== "")) log(`rollout ${members.self}: routing over ${share}`);
        lastShare = share;
      }
      if (stopped) return;
      const listed = new Set(urls);
      // Engines gone from the registry are detached (their requests dispatched again elsewhere).
      for (const e of fleet.list()) {
        if (listed.has(e.id)) continue;
        try {
          await fleet.detach(e.id);
        } catch (err) {
          if (!(err instanceof OozeError && err.code === "ACTOR_NOT_FOUND")) throw err; // (a drained one went meanwhile)
        }
      }
      // Engines moving to another instance's share are drained, not detached: their requests in
      // flight finish here, and only new dispatches go elsewhere. An instance that read another as
      // gone for a moment (its beats late behind a stalled event loop) took its engines and gave them
      // back, and each detach re-dispatched every request on them: 7,751 in 8 minutes at 1,024
      // engines (Nov 30).
      const have = new Set(fleet.list().flatMap((e) => (e.draining ? [] : [e.id])));
      for (const url of have) if (!want.has(url)) fleet.drain(url);
      // Joins ask each engine two questions: one engine at a time, taking over 500 engines took a
      // pass most of a minute on a loaded machine (Nov 30), and the share it reads is stale meanwhile.
      await eachLimit([...want].filter((url) => !have.has(url)), ATTACH_CONCURRENCY, (url) => fleet.attach(url, { allowUnreachable: true }));
    } catch (e) {
      if (!stopped) log(`rollout: following the engines registry: ${(e as Error).message}`);
    }
  };
  const timer = setInterval(() => {
    pass ??= follow().finally(() => (pass = null));
  }, everyMs);
  // The membership is renewed apart from the passes, from the bus's heartbeat worker: a pass can
  // take long (attaching many engines to a loaded fleet; found at 128 engines, every instance's
  // passes slow, every entry gone), and the event loop can stall past the entries' TTL (1,024 engines).
  members?.keep(everyMs, (l) => void (!stopped && log(l)));
  return async () => {
    stopped = true;
    clearInterval(timer);
    await settleWithin(pass, 5_000); // a pass stuck behind a reconnecting connection must not hang the stop
    if (members) await settleWithin(members.leave().catch((e: unknown) => log(`rollout: ${(e as Error).message}`)), 5_000);
  };
}

/** The topology's rollout instances (its `train.rollout` actors, each `count` times). */
export function rolloutInstances(topology: Pick<Topology, "actors">): number {
  return topology.actors.reduce((n, a) => n + (a.kind === "train.rollout" ? a.count : 0), 0);
}

/**
 * Prompt groups generated at once: by the whole job (a step's prompts; fully_async:
 * maxInflightGroups), which is the shared PROMPTS consumer's max_ack_pending, and by one rollout
 * instance by default, the job's divided among `instances`, rounded up. Each instance pulls up to
 * its own from the shared consumer; with the job's whole number each, the first to pull took most of
 * the groups: at 1,024 engines one of four instances held up to 16,000 sequences against a socket
 * budget of 15,872, its health checks waited behind them for a socket, and the engines they failed
 * left routing (Dec 1, docs/experiments/scale.md).
 */
export function rolloutConcurrency(train: TrainConfig, instances: number): { job: number; instance: number } {
  const job = train.mode === "fully_async" ? fullyAsyncLimits(train).maxInflightGroups : train.promptsPerStep;
  return { job, instance: Math.max(1, Math.ceil(job / Math.max(1, instances))) };
}

/** Engine URLs from the job's engines KV bucket, waiting up to `waitMs` for the first one. */
async function engineUrls(registry: FleetRegistry, waitMs: number): Promise<string[]> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const urls = (await registry.entries()).map((e) => e.url);
    if (urls.length > 0) return urls;
    if (Date.now() >= deadline)
      throw new OozeError("ENGINE_UNAVAILABLE", `rollout: no engine in KV bucket '${registry.bucket}' after ${waitMs} ms; run a 'fleet' actor in the job (it registers its engines there)`, { retryable: true });
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * Each role's policy and the name engines serve it under, for a task of several roles; null for a task of one. The
 * task's roles and the topology's `train.roles` must name the same roles.
 */
function rolesOf(task: Task | null, train: TrainConfig): Map<string, { policy: string; lora: string | null; contexts: number }> | null {
  const taskRoles = task?.roles ?? null;
  const map = rolePolicies(train);
  if (!taskRoles && !map) return null;
  const configured = [...(map?.keys() ?? [])].sort().join(", ");
  if (!taskRoles || !map || [...taskRoles].sort().join(", ") !== configured)
    throw new OozeError("CONFIG_INVALID", `train.roles (${configured || "none"}) must map exactly the roles of task ${task?.name ?? train.task} (${taskRoles?.join(", ") || "one role"})`);
  return new Map([...map].map(([role, p]) => [role, { policy: p.name, lora: p.served, contexts: p.contexts }]));
}

/** The rollout actor definition for a node's system and topology. */
export function rolloutActor(system: ActorSystem, topology: Topology) {
  return defineLoopActor(system, topology, {
    role: "rollout",
    config: rolloutActorConfig,
    async init(env, cfg, ctx): Promise<RolloutState> {
      const { bus, names, train } = env;
      const agent = train.agent;
      const task = agent ? null : await loadTask(train.task, train.taskConfig, env.baseDir, { model: train.model });
      const registry = await FleetRegistry.open(bus, env.job);
      // Several rollout instances each route over a share of the engines (shard.ts).
      // Before its first beat an instance has nothing to lose by waiting: a cluster re-electing (a
      // server restarted or a partition healed) answers "jetstream is not enabled" for a few seconds,
      // and crashing on it six times in as many restarts ended the job (cluster-schedules, Nov 30).
      const members = await RolloutMembers.open(bus, env.job, ctx.path);
      await whileElecting(() => members.beat());
      // Registered engines may be gone (their host restarting): they join when healthy, or leave with the registry.
      const urls = engineShare(await engineUrls(registry, cfg.engineWaitMs), await whileElecting(() => members.members()), ctx.path);
      const served = await whileElecting(() => registry.version());
      const { progressTimeoutMs, progressTimeoutPerTokenMs, minProgressTimeoutMs, maxRetries, healthIntervalMs } = cfg;
      const faultOpts = Object.fromEntries(Object.entries({ progressTimeoutMs, progressTimeoutPerTokenMs, minProgressTimeoutMs, maxRetries, healthIntervalMs }).filter(([, v]) => v !== undefined));
      const gen = await FleetGenerator.create([], (l) => ctx.log.info(l), faultOpts);
      // A LoRA policy: every request names its adapter, which the engines load under the policy's name.
      gen.lora = singlePolicy(train.policies).served;
      // A task of several roles: each context's requests name its role's policy.
      const roles = rolesOf(task, train);
      let agents: AgentRollout | null = null;
      try {
        if (served) gen.fleet.followVersion(served.version);
        // (the first alone: the model it serves is the one the others must serve)
        if (urls.length > 0) await gen.fleet.attach(urls[0]!, { allowUnreachable: true });
        await eachLimit(urls.slice(1), ATTACH_CONCURRENCY, (url) => gen.fleet.attach(url, { allowUnreachable: true }));
        await ensureTrainStreams(bus, names, train);
        // train.agent: episodes are agent processes talking to a gateway over this fleet (actors/environment/agent)
        if (agent) agents = await startAgentRollout({ ...train, agent }, env.baseDir, gen.countingFleet(), (l) => ctx.log.warn(l));
      } catch (e) {
        await gen.close();
        throw e;
      }
      const groups = rolloutConcurrency(train, rolloutInstances(topology));
      const concurrency = cfg.concurrency ?? groups.instance;
      const consumer = consumeStream({
        bus, names, stream: names.streamPrompts, subject: names.trainPrompts, durable: names.consumer("train_rollout"),
        registry: promptRegistry, actor: ctx.path, concurrency, maxAckPending: Math.max(groups.job, concurrency), ackWaitMs: cfg.ackWaitMs, log: (l) => ctx.log.warn(l),
        async handle(msg, info) {
          const p = msg.body;
          const r = agents
            ? { samples: await agents.group(p) }
            : await rolloutRange(task!, gen, { firstPrompt: p.groupIndex, prompts: 1, samplesPerPrompt: p.samples, firstSample: p.firstSample }, {
                seed: train.seed, temperature: train.temperature, partialRollout: train.partialRollout, log: (l) => ctx.log.warn(l), roles,
              });
          if (cfg.holdGroup === p.groupIndex && info.deliveryCount === 1) {
            ctx.log.warn(`rollout: holding group ${p.groupIndex} unpublished (holdGroup fault injection)`);
            await new Promise(() => undefined);
          }
          const cache = gen.takeCacheStats();
          const body = { groupIndex: p.groupIndex, firstSample: p.firstSample, attempt: p.attempt, samples: r.samples, ...cache };
          await publish(bus, names.trainSamples, groupMsg, body, groupMsgId(p.groupIndex, p.attempt), ctx.path);
        },
      });
      const stopFollowing = followRegistry(gen.fleet, registry, (l) => ctx.log.warn(l), cfg.registryPollMs, members);
      ctx.log.info(`rollout: consuming ${names.streamPrompts} with ${concurrency} groups in flight on ${gen.fleet.list().length} engine(s)`);
      return { consumer, gen, stopFollowing, agents };
    },
    async onStop(state) {
      await state.stopFollowing();
      // Running agent episodes end first (their sandboxes killed), so the consumer's wait for handlers is short.
      await state.agents?.stop();
      await state.consumer.stop();
      await state.agents?.close();
      await state.gen.close();
    },
  });
}
