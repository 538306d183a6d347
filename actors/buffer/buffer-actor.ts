// The buffer actor (kind `train.buffer`, one per job): feeds prompt groups to the PROMPTS work queue
// (sync and async: one step's worth at a time; in sync mode only after the previous step's weights
// are synced, in async mode one step ahead; fully_async: continuously, ./continuous.ts), consumes SAMPLES
// (one message per prompt group) into a GroupBuffer, and when a step's groups are complete publishes
// one batch with advantages computed over it to BATCHES.
// Groups the dynamic filter drops are refilled (at most 3 rounds, as `ooze train` does). Sample
// indices are a function of the group (groupIndex · slots + k; slots = samplesPerPrompt, × maxSegments
// with train.agent: actors/protocol/agent-config.ts slotsPerPrompt), so a regenerated group
// reproduces the same indices. Group messages are acked only once their batch is published, so a
// restarted buffer gets back every message of the round in progress; it recovers its position from
// the last batch on BATCHES (in a new job, e.g. `ooze train --resume`, from the position the trainer
// announces with its weights), and re-fed prompts are deduplicated by their msgID.
import type { ActorSystem } from "../../src/actor/index.ts";
import { recordBufferBatch } from "../protocol/loop-metrics.ts";
import { OozeError } from "../../src/errors.ts";
import type { Sample } from "../../src/sample.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { defineLoopActor, type LoopEnv } from "../protocol/context.ts";
import {
  batchMsg, batchRegistry, groupRegistry, promptGroup, promptMsgId, promptRegistry, weightsRegistry,
  type BatchBody, type GroupBody, type PendingGroup, type VersionRecord,
} from "../protocol/messages.ts";
import { consumeStream, ensureTrainStreams, lastMessage, publish, scanStream, VersionsKv, type StreamConsumer } from "../protocol/streams.ts";
import { ContinuousFeeder, failedOf, statsOf, type FeederStart } from "./continuous.ts";
import { agentsUnproductive, emptyRoundReason } from "./empty-rounds.ts";
import { GroupBuffer } from "./groups.ts";
import { slotsPerPrompt } from "../protocol/agent-config.ts";
import { fullyAsyncLimits } from "../protocol/config.ts";
import { z } from "zod";

/** The buffer actor's `config`. */
export const bufferActorConfig = z.object({
  ackWaitMs: z.number().int().min(500).default(30_000),
  /**
   * Group messages held unacked until their batch is published, at most. Default: 10,000, or the
   * groups the loop may hold undecided at once where that is more (heldGroups). Below that the
   * consumer stops delivering the groups a batch waits for, and the job trains no further step.
   */
  maxAckPending: z.number().int().min(1).optional(),
  /**
   * Rounds in a row that may yield no trainable sample (every episode failed, every group filtered)
   * before the job stops with the reason (AGENTS_UNPRODUCTIVE, exit status non-zero). Each such round
   * is logged with its first episodes' errors.
   */
  maxEmptyRounds: z.number().int().min(1).default(10),
});

export { emptyRoundReason } from "./empty-rounds.ts";

/** The round of rollouts that becomes the next batch. */
interface Round {
  all: Map<number, Sample>;
  /** Acks of the round's group messages (sent once its batch is published). */
  acks: (() => void)[];
  refills: number;
  started: number;
  promptTokens: number;
  cachedTokens: number;
  /** Samples of `all` already summarised in an empty round's warning, and the filter's count then. */
  reported: number;
  droppedBefore: number;
}

interface BufferState {
  consumer: StreamConsumer;
  stopWatch: () => Promise<void>;
}

/** What both feeders do with the streams' messages. */
interface FeederLike {
  start(from: FeederStart): void | Promise<void>;
  onVersion(r: VersionRecord): Promise<void>;
  /** A prompt group's samples; `defer` holds its message's ack until the call's owner decides the group. */
  onGroup(g: GroupBody, defer: () => () => void): Promise<void>;
}

/**
 * Runs a feeder's calls one after another (samples and version records change the same state). After
 * a failure the bookkeeping is not trusted any more: every later call fails (the actor restarts).
 */
class Serial<F extends FeederLike> {
  private chain: Promise<unknown> = Promise.resolve();
  private broken = false;

  constructor(private readonly feeder: F) {}

  run<T>(fn: (f: F) => T | Promise<T>): Promise<T> {
    const p = this.chain.then(() => {
      if (this.broken) throw new OozeError("ACTOR_CRASHED", "buffer: an earlier step failed; waiting for the restart", { retryable: true });
      return fn(this.feeder);
    });
    this.chain = p.catch(() => {
      this.broken = true;
    });
    return p;
  }
}

/** The step-locked (sync and async) bookkeeping over the streams (one instance per job). */
class Feeder implements FeederLike {
  private readonly groups: GroupBuffer;
  private batches = 0;
  private nextPrompt = 0;
  private synced: VersionRecord | null = null;
  private readonly outstanding = new Set<number>();
  private readonly complete = new Set<number>();
  /** Groups below this index are in batches published before this incarnation started. */
  private floor = 0;
  private round: Round | null = null;
  private emptyRounds = 0;
  constructor(
    private readonly env: LoopEnv,
    private readonly path: string,
    private readonly log: (l: string) => void,
    private readonly maxEmptyRounds = 10,
  ) {
    const t = env.train;
    this.groups = new GroupBuffer({ batchGroups: t.promptsPerStep, estimator: t.estimator, dropZeroVariance: t.dropZeroVariance, failedGroupAdvantage: t.failedGroupAdvantage, maxStaleness: null });
  }

  /** Continues where the last batch (or the trainer's announced position) left off. */
  start(from: FeederStart): void {
    this.batches = from.batches;
    this.nextPrompt = this.floor = from.nextPrompt;
    if (from.batches > 0 || from.nextPrompt > 0) this.log(`buffer: continuing after batch ${from.batches} (next prompt ${from.nextPrompt})`);
  }

  async onVersion(r: VersionRecord): Promise<void> {
    if (!this.synced || r.step > this.synced.step || r.version > this.synced.version) this.synced = r;
    await this.maybeFeed();
  }

  /** Starts the next step's round when the synced weights are recent enough (sync: the previous step's; async: one behind). */
  private async maybeFeed(): Promise<void> {
    const t = this.env.train;
    if (this.round || this.batches >= t.steps) return;
    const lag = t.mode === "async" ? 1 : 0;
    if (this.batches - (this.synced?.step ?? -1) > lag) return;
    this.openRound();
    await this.feed(t.promptsPerStep);
  }

  private openRound(): Round {
    this.round ??= { all: new Map(), acks: [], refills: 0, started: performance.now(), promptTokens: 0, cachedTokens: 0, reported: 0, droppedBefore: this.groups.stats.dropped };
    return this.round;
  }

  private async feed(prompts: number): Promise<void> {
    const n = slotsPerPrompt(this.env.train);
    const sent: Promise<void>[] = [];
    for (let i = 0; i < prompts; i++) {
      const g = this.nextPrompt++;
      this.outstanding.add(g);
      sent.push(publishPrompt(this.env, this.path, { prompt: g, firstSample: g * n, count: n, attempt: 0 }, this.batches + 1));
    }
    await Promise.all(sent); // in flight together: one round trip for the step's prompts
  }

  /**
   * The round a message of group `g` belongs to, or null when its group is finished. Groups at or above the floor
   * that are not complete were fed by this or an earlier incarnation: they join the round.
   */
  private adopt(g: number): Round | null {
    if (this.outstanding.has(g)) return this.round;
    if (g < this.floor || this.complete.has(g)) return null;
    this.outstanding.add(g);
    this.nextPrompt = Math.max(this.nextPrompt, g + 1);
    return this.openRound();
  }

  /** A group's samples: they join the round (acked with its batch); a copy, or a group already finished, is acked now. */
  async onGroup(g: GroupBody, defer: () => () => void): Promise<void> {
    const round = this.adopt(g.groupIndex);
    if (!round) return;
    round.acks.push(defer());
    for (const s of g.samples) {
      if (round.all.has(s.index)) continue;
      round.all.set(s.index, s);
      this.groups.add(s);
    }
    round.promptTokens += g.promptTokens;
    round.cachedTokens += g.cachedTokens;
    const done = this.groups.close(g.groupIndex, g.samples.length);
    if (done !== null) await this.groupDone(done);
  }

  private async groupDone(g: number): Promise<void> {
    this.outstanding.delete(g);
    this.complete.add(g);
    if (this.outstanding.size > 0) return;
    const t = this.env.train;
    const round = this.round!;
    // Dynamic sampling: refill groups the filter dropped (at most 3 rounds; then train on what there is).
    if (this.groups.readyGroups < t.promptsPerStep && round.refills < 3) {
      round.refills++;
      return this.feed(t.promptsPerStep - this.groups.readyGroups);
    }
    const { batch } = this.groups.takeBatch(this.synced?.version ?? 0, { partial: true });
    if (!batch) {
      // This round's part: the samples and filtered groups since the last empty round was reported.
      const why = emptyRoundReason([...round.all.values()].slice(round.reported), this.groups.stats.dropped - round.droppedBefore);
      round.reported = round.all.size;
      round.droppedBefore = this.groups.stats.dropped;
      this.emptyRounds++;
      this.log(`buffer: WARNING round ${this.emptyRounds} in a row produced no trainable sample: ${why}`);
      if (this.emptyRounds >= this.maxEmptyRounds) {
        // No restart can cure this (the same agent fails the same way): the job stops, saying why.
        throw agentsUnproductive(this.emptyRounds, why);
      }
      round.refills = 0;
      return this.feed(t.promptsPerStep);
    }
    this.emptyRounds = 0;
    const trained = new Set(batch.samples.map((s) => s.index));
    const all = [...round.all.values()];
    const step = this.batches + 1;
    await publishBatch(this.env, this.path, {
      step,
      samples: batch.samples,
      groups: batch.groups,
      dropped: all.filter((s) => !trained.has(s.index)).map((s) => s.index).sort((a, b) => a - b),
      failedSamples: failedOf(all),
      stalenessMax: Math.max(0, batch.stalenessMax),
      nextPrompt: this.nextPrompt,
      nextSample: this.nextPrompt * slotsPerPrompt(t),
      stats: {
        generated: all.length,
        ...statsOf(all),
        droppedGroups: this.groups.stats.dropped,
        rolloutSeconds: (performance.now() - round.started) / 1000,
        promptTokens: round.promptTokens,
        cachedTokens: round.cachedTokens,
      },
    });
    this.batches = step;
    this.round = null;
    for (const ack of round.acks) ack();
    this.log(`buffer: batch ${step} (${batch.samples.length} samples, ${batch.groups.length} groups) published`);
    await this.maybeFeed();
  }
}

/** Publishes one prompt group to PROMPTS (msgID per prompt and attempt). */
async function publishPrompt(env: LoopEnv, path: string, g: PendingGroup, step: number): Promise<void> {
  const body = { groupIndex: g.prompt, firstSample: g.firstSample, samples: g.count, step, attempt: g.attempt };
  await publish(env.bus, env.names.trainPrompts, promptGroup, body, promptMsgId(g.prompt, g.attempt), path);
}

/** Publishes one batch to BATCHES (msgID `batch-<step>`); its failed episodes only for the trainer's explorer (train.explorer). */
async function publishBatch(env: LoopEnv, path: string, body: BatchBody): Promise<void> {
  const full = { pending: [], requeued: [], requeuedPrompts: [], trainedPrompts: [], droppedPrompts: [], ...body, failedSamples: [] as Sample[] };
  if (env.train.explorer.keepSteps > 0) full.failedSamples = body.failedSamples ?? [];
  await publish(env.bus, env.names.trainBatches, batchMsg, full, `batch-${body.step}`, path);
  recordBufferBatch(env.job, path, { generated: body.stats.generated, trained: body.samples.length, dropped: body.dropped.length, groups: body.groups.length });
}

/**
 * Where a (re)started buffer begins: after the last batch on BATCHES, or, in a job with none yet, at
 * the position the trainer announced with its starting weights (0, or a resumed run's checkpoint);
 * fully_async also collects the groups still on PROMPTS and SAMPLES (launched, not decided).
 */
async function startingPosition(env: LoopEnv, log: (l: string) => void): Promise<FeederStart> {
  const { bus, names } = env;
  const last = await lastMessage(bus, names.streamBatches, batchRegistry);
  let from: FeederStart;
  if (last) {
    const b = last.body;
    from = { batches: b.step, nextPrompt: b.nextPrompt, nextSample: b.nextSample, pending: b.pending, floor: b.nextSample, inStreams: [] };
  } else {
    let w = await lastMessage(bus, names.streamWeights, weightsRegistry);
    for (let waited = 0; !w; waited += 250) {
      if (waited % 30_000 === 0) log("buffer: waiting for the trainer to announce its starting weights");
      await new Promise((r) => setTimeout(r, 250));
      w = await lastMessage(bus, names.streamWeights, weightsRegistry);
    }
    const p = w.body.position;
    from = { batches: w.body.step, nextPrompt: p.nextPrompt, nextSample: p.nextSample, pending: p.pending, floor: p.nextSample, inStreams: [] };
  }
  if (env.train.mode === "fully_async") {
    for (const m of await scanStream(bus, names.streamPrompts, promptRegistry))
      from.inStreams.push({ prompt: m.body.groupIndex, firstSample: m.body.firstSample, count: m.body.samples, attempt: m.body.attempt });
    for (const m of await scanStream(bus, names.streamSamples, groupRegistry))
      from.inStreams.push({ prompt: m.body.groupIndex, firstSample: m.body.firstSample, count: slotsPerPrompt(env.train), attempt: m.body.attempt });
  }
  return from;
}

/**
 * Group messages the buffer may hold unacked at once: every undecided group (fully_async with
 * lateGroups wait: the room, bound + 1 batches' worth; with requeue: what may generate plus a
 * batch; otherwise a step's worth), plus a batch's worth of slack for refills and redeliveries.
 * A 1,024-engine run with bound 16 (17,408 undecided groups) stalled at the old fixed 10,000 (Nov 30).
 */
export function heldGroups(train: LoopEnv["train"]): number {
  const P = train.promptsPerStep;
  if (train.mode !== "fully_async") return 3 * P;
  const { maxStaleness, maxInflightGroups } = fullyAsyncLimits(train);
  return (train.lateGroups === "wait" ? (maxStaleness + 1) * P : maxInflightGroups + P) + P;
}

/** The buffer actor definition for a node's system and topology. */
export function bufferActor(system: ActorSystem, topology: Topology) {
  return defineLoopActor(system, topology, {
    role: "buffer",
    config: bufferActorConfig,
    async init(env, cfg, ctx, fail): Promise<BufferState> {
      await ensureTrainStreams(env.bus, env.names, env.train);
      const held = heldGroups(env.train);
      if (cfg.maxAckPending !== undefined && cfg.maxAckPending < held)
        throw new OozeError(
          "CONFIG_INVALID",
          `buffer: config.maxAckPending ${cfg.maxAckPending} is below the ${held} group messages this loop may hold unacked (${env.train.promptsPerStep} prompts a step, mode ${env.train.mode}); the batches would wait for groups the consumer no longer delivers: raise it, or leave it unset`,
        );
      const maxAckPending = cfg.maxAckPending ?? Math.max(10_000, held);
      const log = (l: string) => ctx.log.info(l);
      const feeder =
        env.train.mode === "fully_async"
          ? new Serial(new ContinuousFeeder(env, {
              publishPrompt: (g, step) => publishPrompt(env, ctx.path, g, step),
              publishBatch: (b) => publishBatch(env, ctx.path, b),
              log: (l) => (l.includes("WARNING") ? ctx.log.warn(l) : log(l)),
            }, cfg.maxEmptyRounds))
          : new Serial(new Feeder(env, ctx.path, (l) => (l.includes("WARNING") ? ctx.log.warn(l) : log(l)), cfg.maxEmptyRounds));
      // The start position may wait for the trainer: found in the background, first in the chain.
      void feeder.run((f) => startingPosition(env, log).then((from) => f.start(from))).catch((e: unknown) => fail(e));
      const versions = await VersionsKv.open(env.bus, env.names);
      const stopWatch = await versions.watch((r) => void feeder.run((f) => f.onVersion(r)).catch((e: unknown) => fail(e)));
      const consumer = consumeStream({
        bus: env.bus, names: env.names, stream: env.names.streamSamples, subject: env.names.trainSamples, durable: env.names.consumer("train_buffer"),
        registry: groupRegistry, actor: ctx.path, ackWaitMs: cfg.ackWaitMs, maxAckPending, prefetch: 64, log: (l) => ctx.log.warn(l),
        // A failure half-way (a publish while NATS is away) leaves the bookkeeping unsure: crash, and
        // let the restarted buffer recover from BATCHES and the redelivered samples.
        handle: (msg, info) =>
          feeder
            .run((f) => f.onGroup(msg.body, info.defer))
            .catch((e: unknown) => {
              fail(e);
              throw e;
            }),
      });
      return { consumer, stopWatch };
    },
    async onStop(state) {
      await state.stopWatch();
      await state.consumer.stop();
    },
  });
}
