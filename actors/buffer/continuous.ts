// The buffer's fully_async bookkeeping (train.mode fully_async): generation never stops. Prompt
// groups are launched one by one onto the PROMPTS work queue, and a batch of `promptsPerStep` (P)
// complete groups is cut one batch ahead of the trainer: while it trains batch n (and its weights
// sync), batch n+1 is cut at the version it will be trained at (the synced one plus the batches cut
// since), so the staleness of every trained token is exact and the trainer need not wait. The staleness bound keeps
// batches near the trainer: a complete group whose oldest token is more than `maxStaleness` versions
// behind is never trained — it is requeued (its prompt generated again under new sample indices;
// dropped after MAX_REQUEUES).
//
// `lateGroups: wait` (default) makes that requeue unnecessary: batches take the groups in launch
// order (batch n+1 is the P undecided groups launched first, cut once all of them are complete), and
// a group is launched only while the groups launched before it fit in the batches its launch version
// may still reach: fewer than (bound + 1 − lag)·P undecided (lag: batches cut whose weights are not
// synced yet, up to 2 as batches are cut one ahead), and fewer than `maxInflightGroups` generating.
// A group is trained at most `bound` versions after its launch, so an episode longer than (bound + 1)
// training steps holds up its batch and the trainer waits: on a heavy-tailed workload the bound
// must cover the longest episode for the trainer never to wait (`bench scale`, docs/experiments/scale.md). So a long episode delays a batch instead of
// going stale, the engines meanwhile generate the groups behind it, and the trained groups are the
// prompts in order, as in sync mode: no length bias and nothing generated for nothing (`bench loop`,
// Nov 25: no sample requeued where the earlier policy requeued ~20 % of those it generated, and the
// trained response length is sync's).
// `lateGroups: requeue` cuts the P oldest complete groups as soon as they are ready and launches up to
// `maxInflightGroups` generating and one batch more waiting; groups that outlast the bound are
// regenerated, and since the attempts that finish in time are the short ones, it trains shorter
// episodes than sync. In both, no new prompt is launched that the remaining steps cannot train.
//
// Every decision (trained, dropped, requeued) is recorded in the next batch, and the messages of a
// group are acked only with that batch, so a restarted buffer finds every undecided group again in
// the streams (start()); groups found again have no known launch version and are cut in the order
// they are found.
//
// A batch cut with no sample (every group since the last batch dropped: its episodes failed, or the
// filter rejected it) is an empty round; after `maxEmptyRounds` of them in a row the job stops with
// their reason (AGENTS_UNPRODUCTIVE, ./empty-rounds.ts), as sync mode does.
import { oldestVersion, type Sample } from "../../src/sample.ts";
import { fullyAsyncLimits } from "../protocol/config.ts";
import { slotsPerPrompt } from "../protocol/agent-config.ts";
import { rewardStats as rewardStatsOf } from "../protocol/metrics.ts";
import type { LoopEnv } from "../protocol/context.ts";
import { MAX_FAILED_SAMPLES, type BatchBody, type GroupBody, type PendingGroup, type VersionRecord } from "../protocol/messages.ts";
import { agentsUnproductive, emptyRoundReason } from "./empty-rounds.ts";
import { GroupBuffer, type Batch } from "./groups.ts";

/** Times a prompt may be requeued as stale before it is dropped. */
export const MAX_REQUEUES = 3;

/** A group attempt launched and not yet decided (the live map holds them in launch order). */
interface Live extends PendingGroup {
  /** Version the engines served when it was launched (Infinity: unknown, found again after a restart). */
  launchVersion: number;
  /** Oldest token version of its samples (Infinity until they arrive). */
  oldest: number;
  samples: Sample[];
  acks: (() => void)[];
  complete: boolean;
  /** Its prompt was requeued by an earlier incarnation: recorded as requeued once complete. */
  superseded: boolean;
  /** Samples the rollout produced, from its close (≤ count, the index range: agent episodes yield a variable number). */
  produced: number | null;
}

/** What the continuous feeder does on the streams (the buffer actor implements it). */
export interface FeederIo {
  publishPrompt(g: PendingGroup, step: number): Promise<void>;
  publishBatch(body: BatchBody): Promise<void>;
  log(line: string): void;
}

/** Where a (re)started buffer begins: the last batch, or the trainer's starting position. */
export interface FeederStart {
  batches: number;
  nextPrompt: number;
  nextSample: number;
  pending: PendingGroup[];
  /**
   * Sample indices below this were allocated before the last batch: unless a `pending` group holds
   * them, their groups are decided (trained, dropped or requeued) and their messages, which may come
   * back when an ack was lost, are acked and ignored.
   */
  floor: number;
  /** Prompt groups and group messages still on PROMPTS and SAMPLES (launched and undecided). */
  inStreams: PendingGroup[];
}

const indices = (g: PendingGroup) => Array.from({ length: g.count }, (_, i) => g.firstSample + i);
const minVersion = (s: Sample) => oldestVersion(s) ?? Infinity;

/** fully_async feeding and batching; every call goes through the buffer actor's serial chain. */
export class ContinuousFeeder {
  private readonly groups: GroupBuffer;
  private readonly bound: number;
  private readonly maxInflight: number;
  /** Undecided attempts by their first sample index (unique per attempt). */
  private readonly live = new Map<number, Live>();
  /**
   * Of `live`: the attempts still generating (not complete) and those that may still be trained (not
   * superseded), kept as they change, so that a launch does not walk every undecided group (at 128
   * engines ~2,000 of them, once per completed group: 11 % of the job process's CPU).
   */
  private generating = 0;
  private trainable = 0;
  /** The current attempt of each prompt. */
  private readonly current = new Map<number, Live>();
  private queue: PendingGroup[] = [];
  private synced: VersionRecord | null = null;
  private batches = 0;
  private nextPrompt = 0;
  private nextSample = 0;
  /** See FeederStart.floor. */
  private floor = 0;
  /** Attempts decided by this incarnation, by prompt: their messages may come back when an ack was lost. */
  private readonly done = new Map<number, { firstSample: number; count: number }[]>();
  // Since the last batch:
  private requeued: number[] = [];
  private requeuedPrompts: number[] = [];
  private dropped: number[] = [];
  private droppedPrompts: number[] = [];
  private filtered: Sample[] = [];
  private held: (() => void)[] = [];
  private filteredSinceBatch = 0;
  private roundStart = performance.now();
  private promptTokens = 0;
  private cachedTokens = 0;
  /** Batches in a row cut with no sample to train. */
  private emptyRounds = 0;

  constructor(
    private readonly env: Pick<LoopEnv, "train">,
    private readonly io: FeederIo,
    private readonly maxEmptyRounds = 10,
  ) {
    const t = env.train;
    const limits = fullyAsyncLimits(t);
    this.bound = limits.maxStaleness;
    this.maxInflight = limits.maxInflightGroups;
    this.groups = new GroupBuffer({ batchGroups: t.promptsPerStep, estimator: t.estimator, dropZeroVariance: t.dropZeroVariance, failedGroupAdvantage: t.failedGroupAdvantage, maxStaleness: this.bound });
  }

  /** Takes up where the last batch (or the trainer's position) left off; groups in the streams come back as they arrive. */
  async start(from: FeederStart): Promise<void> {
    this.batches = from.batches;
    this.nextPrompt = from.nextPrompt;
    this.nextSample = from.nextSample;
    this.floor = from.nextSample;
    const known = new Map<number, PendingGroup>();
    for (const g of from.pending) known.set(g.firstSample, g);
    for (const g of from.inStreams) if (g.firstSample >= this.floor && !known.has(g.firstSample)) known.set(g.firstSample, g);
    for (const g of known.values()) {
      this.nextPrompt = Math.max(this.nextPrompt, g.prompt + 1);
      this.nextSample = Math.max(this.nextSample, g.firstSample + g.count);
    }
    // The newest attempt of a prompt is current; older ones were requeued by an earlier incarnation.
    const newest = new Map<number, number>();
    for (const g of known.values()) newest.set(g.prompt, Math.max(newest.get(g.prompt) ?? -1, g.attempt));
    const inStreams = new Set(from.inStreams.map((g) => g.firstSample));
    const relaunch: PendingGroup[] = [];
    for (const g of [...known.values()].sort((a, b) => a.firstSample - b.firstSample)) {
      const l = this.track(g, Infinity);
      if (g.attempt < newest.get(g.prompt)!) this.supersede(l);
      if (!inStreams.has(g.firstSample)) relaunch.push(g);
    }
    if (known.size > 0) this.io.log(`buffer: fully_async: ${known.size} groups in flight at the restart (${relaunch.length} launched again)`);
    for (const g of relaunch) await this.io.publishPrompt(g, this.batches + 1);
  }

  async onVersion(r: VersionRecord): Promise<void> {
    if (!this.synced || r.step > this.synced.step || r.version > this.synced.version) this.synced = r;
    await this.fill();
    await this.maybeBatch();
  }

  /** A group attempt's samples: it is complete (acked with the batch that decides it); a copy of a decided one is acked now. */
  async onGroup(c: GroupBody, defer: () => () => void): Promise<void> {
    if (!this.live.has(c.firstSample) && this.isDecided(c.groupIndex, c.firstSample)) return;
    let l = this.live.get(c.firstSample);
    if (!l) {
      // An attempt an earlier incarnation launched after its last batch.
      const slots = slotsPerPrompt(this.env.train);
      l = this.track({ prompt: c.groupIndex, firstSample: c.firstSample, count: slots, attempt: c.attempt }, Infinity);
      const cur = this.current.get(c.groupIndex);
      if (cur && cur !== l && cur.attempt > l.attempt) this.supersede(l);
      this.nextSample = Math.max(this.nextSample, c.firstSample + slots);
      this.nextPrompt = Math.max(this.nextPrompt, c.groupIndex + 1);
    }
    l.acks.push(defer());
    if (l.complete) return; // a copy (an ack lost to a nats-server restart): acked with the decision
    this.promptTokens += c.promptTokens;
    this.cachedTokens += c.cachedTokens;
    l.produced = c.samples.length;
    for (const s of c.samples) {
      l.samples.push(s);
      l.oldest = Math.min(l.oldest, minVersion(s));
    }
    await this.complete(l);
  }

  /** Whether sample index `index` of prompt `prompt` belongs to an attempt that is decided already. */
  private isDecided(prompt: number, index: number): boolean {
    if ((this.done.get(prompt) ?? []).some((d) => index >= d.firstSample && index < d.firstSample + d.count)) return true;
    if (index >= this.floor) return false;
    for (const l of this.live.values()) if (l.prompt === prompt && index >= l.firstSample && index < l.firstSample + l.count) return false;
    return true;
  }

  private track(g: PendingGroup, launchVersion: number): Live {
    const l: Live = { ...g, launchVersion, oldest: Infinity, samples: [], acks: [], complete: false, superseded: false, produced: null };
    this.live.set(g.firstSample, l);
    this.generating++;
    this.trainable++;
    const cur = this.current.get(g.prompt);
    if (!cur || cur.attempt <= g.attempt) this.current.set(g.prompt, l);
    return l;
  }

  /** A live attempt a later attempt of its prompt replaces: complete, it is requeued, never trained. */
  private supersede(l: Live): void {
    if (l.superseded) return;
    l.superseded = true;
    if (this.live.has(l.firstSample)) this.trainable--;
  }

  /** Hands a complete attempt to the group buffer (or records it requeued when superseded). */
  private async complete(l: Live): Promise<void> {
    l.complete = true;
    this.generating--;
    if (l.superseded) {
      this.decide(l);
      this.requeued.push(...indices(l));
      this.requeuedPrompts.push(l.prompt);
      return;
    }
    const before = this.groups.stats.dropped;
    for (const s of l.samples) this.groups.add(s);
    const closed = this.groups.close(l.prompt, l.produced ?? l.count) !== null;
    if (!closed) {
      // a group message whose samples repeat an index: it can never complete (and would hold up the batches behind it)
      this.groups.discard(l.prompt);
      this.io.log(`buffer: group of prompt ${l.prompt} (samples from ${l.firstSample}) repeats a sample index; dropped`);
    }
    if (!closed || this.groups.stats.dropped > before) {
      // the dynamic filter (or every episode failed): dropped, recorded with the next batch
      this.decide(l);
      this.filtered.push(...l.samples);
      this.dropped.push(...indices(l));
      this.droppedPrompts.push(l.prompt);
      this.filteredSinceBatch++;
    }
    await this.fill();
    await this.maybeBatch();
  }

  /** The attempt leaves the live set; its messages are acked with the next batch. */
  private decide(l: Live): void {
    if (this.live.delete(l.firstSample)) {
      if (!l.complete) this.generating--;
      if (!l.superseded) this.trainable--;
    }
    const done = this.done.get(l.prompt) ?? [];
    done.push({ firstSample: l.firstSample, count: l.count });
    this.done.set(l.prompt, done);
    if (this.current.get(l.prompt) === l) this.current.delete(l.prompt);
    this.held.push(...l.acks);
  }

  /**
   * Launches groups, requeued prompts first (see the header: lateGroups wait keeps the undecided groups
   * within the bound's reach, requeue at most one batch beyond maxInflightGroups); a new prompt only
   * while the remaining steps need more groups than are undecided.
   */
  private async fill(): Promise<void> {
    const t = this.env.train;
    const P = t.promptsPerStep;
    if (!this.synced || this.batches >= t.steps) return;
    const room = this.room();
    const needed = (t.steps - this.batches) * P;
    const sent: Promise<void>[] = [];
    while (this.generating < this.maxInflight && this.live.size < room) {
      let g = this.queue.shift();
      if (!g) {
        if (this.trainable >= needed) break;
        g = { prompt: this.nextPrompt++, firstSample: this.nextSample, count: slotsPerPrompt(t), attempt: 0 };
        this.nextSample += g.count;
      }
      this.track(g, this.synced.version);
      sent.push(this.io.publishPrompt(g, this.batches + 1));
    }
    await Promise.all(sent);
  }

  /** The undecided groups after a batch and what bounds the launches (why the engines may run short of work). */
  private occupancy(): string {
    return `${this.live.size} groups undecided (${this.generating} generating, ${this.live.size - this.generating} complete), room ${this.room()}, at most ${this.maxInflight} generating`;
  }

  /** Undecided groups the launches may fill up to (see the header). */
  private room(): number {
    const t = this.env.train, P = t.promptsPerStep;
    const lag = this.synced ? Math.max(0, this.batches - this.synced.step) : 0;
    return t.lateGroups === "wait" ? (this.bound + 1 - lag) * P : this.maxInflight + P;
  }

  /** A stale attempt: its prompt goes back to the queue under new sample indices, or is dropped after MAX_REQUEUES. */
  private requeue(prompt: number): void {
    const l = this.current.get(prompt);
    if (!l) return;
    this.decide(l);
    if (l.attempt + 1 > MAX_REQUEUES) {
      this.dropped.push(...indices(l));
      this.droppedPrompts.push(prompt);
      this.io.log(`buffer: prompt ${prompt} went stale ${l.attempt + 1} times (its generation outlasts the staleness bound ${this.bound}); dropped`);
      return;
    }
    this.requeued.push(...indices(l));
    this.requeuedPrompts.push(prompt);
    this.queue.push({ prompt, firstSample: this.nextSample, count: l.count, attempt: l.attempt + 1 });
    this.nextSample += l.count;
  }

  /** Cuts the next batch when the step before the previous one is synced and enough fresh groups are complete. */
  private async maybeBatch(): Promise<void> {
    const t = this.env.train;
    const P = t.promptsPerStep;
    // One batch ahead: batch n+1 is cut while the trainer trains batch n (its version not synced
    // yet), at the version the trainer will train it at — one more than the synced one per batch
    // (an empty batch keeps the version: the staleness counted is then one too many, never too few).
    if (!this.synced || this.synced.step < this.batches - 1 || this.batches >= t.steps) return;
    const v = this.synced.version + (this.batches - this.synced.step);
    const partial = this.filteredSinceBatch >= 3 * P;
    // After 3P filtered groups whatever is ready goes (below), so a filter that rejects most groups still ends steps.
    if (t.lateGroups === "wait" && !partial) return this.cutInOrder(v);
    const r = this.groups.takeBatch(v, { partial });
    for (const p of r.requeue) this.requeue(p);
    if (!r.batch && !(partial && this.filteredSinceBatch >= 4 * P && this.groups.readyGroups === 0)) {
      if (r.requeue.length > 0) await this.fill();
      return;
    }
    await this.publish(r.batch);
  }

  /** lateGroups wait: the batch is the P undecided groups launched first, once every one of them is complete. */
  private async cutInOrder(v: number): Promise<void> {
    const P = this.env.train.promptsPerStep;
    for (;;) {
      const head: Live[] = [];
      for (const l of this.live.values()) {
        if (l.superseded) continue; // requeued by an earlier incarnation: never trained
        if (!l.complete) return; // the batch waits for it
        head.push(l);
        if (head.length === P) break;
      }
      if (head.length < P) return;
      const r = this.groups.takeGroups(head.map((l) => l.prompt), v);
      for (const p of r.requeue) this.requeue(p); // stale (found again after a restart): the head moves on
      if (r.batch) return this.publish(r.batch);
      if (r.requeue.length === 0) return;
      await this.fill();
    }
  }

  private async publish(batch: Batch | null): Promise<void> {
    const step = this.batches + 1;
    if ((batch?.samples.length ?? 0) === 0) {
      const why = emptyRoundReason(this.filtered, this.filteredSinceBatch);
      this.emptyRounds++;
      this.io.log(`buffer: WARNING round ${this.emptyRounds} in a row produced no trainable sample: ${why}`);
      // the groups stay unacked: the job stops here (escalated at once), not after one more empty step
      if (this.emptyRounds >= this.maxEmptyRounds) throw agentsUnproductive(this.emptyRounds, why);
    } else this.emptyRounds = 0;
    const trained = new Set(batch?.samples.map((s) => s.index) ?? []);
    const all: Sample[] = [...this.filtered];
    const dropped = [...this.dropped];
    for (const p of batch?.groups ?? []) {
      const l = this.current.get(p)!;
      this.decide(l);
      for (const s of l.samples) {
        all.push(s);
        if (!trained.has(s.index)) dropped.push(s.index); // failed episodes of a trained group
      }
    }
    const pending = [...[...this.live.values()].map(({ prompt, firstSample, count, attempt }) => ({ prompt, firstSample, count, attempt })), ...this.queue];
    await this.io.publishBatch({
      step,
      samples: batch?.samples ?? [],
      groups: batch?.groups ?? [],
      dropped: dropped.sort((a, b) => a - b),
      failedSamples: failedOf(all),
      stalenessMax: Math.max(0, batch?.stalenessMax ?? 0),
      nextPrompt: this.nextPrompt,
      nextSample: this.nextSample,
      pending: pending.sort((a, b) => a.firstSample - b.firstSample),
      requeued: this.requeued,
      requeuedPrompts: this.requeuedPrompts,
      trainedPrompts: batch?.groups ?? [],
      droppedPrompts: this.droppedPrompts,
      stats: {
        generated: all.length + this.requeued.length,
        ...statsOf(all),
        droppedGroups: this.groups.stats.dropped,
        rolloutSeconds: (performance.now() - this.roundStart) / 1000,
        promptTokens: this.promptTokens,
        cachedTokens: this.cachedTokens,
      },
    });
    this.batches = step;
    for (const ack of this.held) ack();
    this.held = [];
    this.requeued = [];
    this.requeuedPrompts = [];
    this.dropped = [];
    this.droppedPrompts = [];
    this.filtered = [];
    this.filteredSinceBatch = 0;
    this.roundStart = performance.now();
    this.promptTokens = this.cachedTokens = 0;
    await this.fill();
    this.io.log(`buffer: batch ${step} (${batch?.samples.length ?? 0} samples, ${batch?.groups.length ?? 0} groups) published; ${this.occupancy()}`);
  }
}

/** Reward, length and failure figures of a batch's decided samples (metrics.jsonl). */
/** A batch's failed episodes, for the trainer's explorer (the first MAX_FAILED_SAMPLES). */
export function failedOf(all: readonly Sample[]): Sample[] {
  return all.filter((s) => s.status === "failed").slice(0, MAX_FAILED_SAMPLES);
}

export function statsOf(all: readonly Sample[]): Pick<BatchBody["stats"], "rewards" | "failed"> {
  return {
    rewards: rewardStatsOf(all),
    failed: all.filter((s) => s.status === "failed").length,
  };
}
