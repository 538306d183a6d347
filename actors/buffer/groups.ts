// The buffer's bookkeeping, free of I/O: collects samples into groups by prompt, knows when a group
// is complete (the rollout side says how many samples it produced, so over-sampled, aborted and
// fan-out groups of any size are normal), applies the dynamic filter and the staleness bound, and
// hands out batches counted in groups (rollouts). Every sample ends in exactly one of: a batch, a
// dropped group (filter), or a requeued prompt (stale) — never silently lost.
import { computeAdvantages, isZeroVariance, type AdvantageEstimator } from "../../src/algorithms/advantages.ts";
import { oldestVersion, type Sample } from "../../src/sample.ts";
import type { TrainSample } from "../protocol/messages.ts";

export interface BufferConfig {
  /** Groups (prompts) per training batch. */
  batchGroups: number;
  estimator: AdvantageEstimator;
  /** Drop groups whose rewards are all equal (no learning signal). */
  dropZeroVariance: boolean;
  /** Max weight versions between a sample's oldest tokens and the trainer's version; null = off. */
  maxStaleness: number | null;
  /** Advantage −x for each episode of a group that failed throughout (src/algorithms/advantages.ts); default 0. */
  failedGroupAdvantage?: number;
}

export interface Batch {
  samples: TrainSample[];
  groups: number[];
  /** Largest staleness (versions) of any sample in the batch. */
  stalenessMax: number;
}

interface Group {
  samples: Sample[];
  expected: number | null;
}

export class GroupBuffer {
  private readonly open = new Map<number, Group>();
  private readonly ready: { index: number; samples: Sample[] }[] = [];
  /** Groups dropped by the dynamic filter, and groups sent back for regeneration as stale. */
  readonly stats = { dropped: 0, requeued: 0, batches: 0 };

  constructor(private readonly config: BufferConfig) {
    if (!Number.isInteger(config.batchGroups) || config.batchGroups < 1) throw new RangeError("batchGroups must be ≥ 1");
  }

  /** Adds a sample. Returns the group index if this completed its group. */
  add(s: Sample): number | null {
    const g = this.group(s.groupIndex);
    if (g.samples.some((x) => x.index === s.index)) return null; // redelivered: once only
    g.samples.push(s);
    return this.maybeComplete(s.groupIndex, g);
  }

  /** The rollout side finished a group after producing `count` samples in all. */
  close(groupIndex: number, count: number): number | null {
    const g = this.group(groupIndex);
    g.expected = count;
    return this.maybeComplete(groupIndex, g);
  }

  private group(i: number): Group {
    let g = this.open.get(i);
    if (!g) this.open.set(i, (g = { samples: [], expected: null }));
    return g;
  }

  private maybeComplete(index: number, g: Group): number | null {
    if (g.expected === null || g.samples.length < g.expected) return null;
    this.open.delete(index);
    const usable = g.samples.filter((s) => s.reward !== null && s.status !== "failed");
    if (usable.length === 0 || (this.config.dropZeroVariance && isZeroVariance(usable.map(score)))) {
      this.stats.dropped++;
      return index;
    }
    this.ready.push({ index, samples: usable });
    return index;
  }

  /** Forgets an incomplete group (its samples will never all arrive); true if there was one. */
  discard(groupIndex: number): boolean {
    return this.open.delete(groupIndex);
  }

  /** Complete groups waiting for a batch. */
  get readyGroups(): number {
    return this.ready.length;
  }

  /**
   * Takes a batch of `batchGroups` groups for a trainer at `trainerVersion`, or null if not enough
   * fresh groups are ready (with `partial`, whatever is ready, if anything). Advantages are computed
   * over the whole batch, so batch-level estimators (reinforce_pp) whiten over all its groups.
   * Groups older than the staleness bound are removed and returned in `requeue` (their prompts
   * must be generated again).
   */
  takeBatch(trainerVersion: number, opts: { partial?: boolean } = {}): { batch: Batch | null; requeue: number[] } {
    const requeue = this.removeStale(trainerVersion);
    if (this.ready.length === 0 || (this.ready.length < this.config.batchGroups && !opts.partial)) return { batch: null, requeue };
    // Under a staleness bound the oldest groups go first (stable: completion order among equals), so
    // a group near the bound is trained before it goes stale.
    if (this.config.maxStaleness !== null) this.ready.sort((a, b) => groupOldest(a.samples, trainerVersion) - groupOldest(b.samples, trainerVersion));
    return { batch: this.batchOf(this.ready.splice(0, this.config.batchGroups), trainerVersion), requeue };
  }

  /**
   * Takes exactly the groups `indices` (in that order) as a batch for a trainer at `trainerVersion`,
   * or null when one of them is not ready. Stale groups are removed first, as in takeBatch: when one
   * of `indices` was, the batch is null and the caller picks its groups again.
   */
  takeGroups(indices: readonly number[], trainerVersion: number): { batch: Batch | null; requeue: number[] } {
    const requeue = this.removeStale(trainerVersion);
    const at = indices.map((i) => this.ready.findIndex((g) => g.index === i));
    if (at.some((i) => i < 0)) return { batch: null, requeue };
    const taken = at.map((i) => this.ready[i]!);
    const wanted = new Set(indices);
    for (let i = this.ready.length - 1; i >= 0; i--) if (wanted.has(this.ready[i]!.index)) this.ready.splice(i, 1);
    return { batch: this.batchOf(taken, trainerVersion), requeue };
  }

  /** Removes the ready groups beyond the staleness bound at `trainerVersion`; returns their indices. */
  private removeStale(trainerVersion: number): number[] {
    const requeue: number[] = [];
    const bound = this.config.maxStaleness;
    if (bound === null) return requeue;
    for (let i = this.ready.length - 1; i >= 0; i--) {
      const g = this.ready[i]!;
      if (trainerVersion - groupOldest(g.samples, trainerVersion) > bound) {
        requeue.push(g.index);
        this.ready.splice(i, 1);
        this.stats.requeued++;
      }
    }
    return requeue;
  }

  /**
   * A batch of `taken` groups with advantages computed over all of them, per policy: each policy's
   * samples of a group are a group of their own (a role's baseline is its own role's episodes).
   */
  private batchOf(taken: readonly { index: number; samples: Sample[] }[], trainerVersion: number): Batch {
    const flat = taken.flatMap((g) => g.samples);
    const adv = advantagesByPolicy(flat, this.config.estimator, this.config.failedGroupAdvantage ?? 0);
    let stalenessMax = 0;
    const samples = flat.map((s, i) => {
      stalenessMax = Math.max(stalenessMax, trainerVersion - (oldestVersion(s) ?? trainerVersion));
      return { ...s, advantage: adv[i]! };
    });
    this.stats.batches++;
    return { samples, groups: taken.map((g) => g.index), stalenessMax };
  }
}

/** Oldest version of any token of a group's samples (`fallback` when none has a version). */
function groupOldest(samples: readonly Sample[], fallback: number): number {
  let v = fallback;
  for (const s of samples) v = Math.min(v, oldestVersion(s) ?? fallback);
  return v;
}

/**
 * Group advantages computed separately over each policy's samples (one computation without
 * policies). A role task's contexts (metadata.context) are grouped by their prompt too: the guesses of
 * one message are GRPO's group of one prompt, whose baseline is what the guesser made of that message.
 * Batch-level estimators (reinforce_pp) whiten over all of a policy's samples of the batch, across
 * those groups.
 */
function advantagesByPolicy(samples: readonly Sample[], estimator: AdvantageEstimator, failedGroupAdvantage: number): Float64Array {
  const policies = new Map<string, number[]>();
  const groupIds = new Map<string, number>();
  const scored = samples.map((s, i) => {
    const policy = s.policy ?? "";
    const prompt = s.metadata.context !== undefined ? Array.from(s.tokens.subarray(0, s.tokens.length - s.responseLength)).join(",") : "";
    const key = `${policy}\u0000${prompt}\u0000${s.groupIndex}`;
    let g = groupIds.get(key);
    if (g === undefined) groupIds.set(key, (g = groupIds.size));
    const at = policies.get(policy);
    if (at) at.push(i);
    else policies.set(policy, [i]);
    return { ...score(s), groupIndex: g };
  });
  const out = new Float64Array(samples.length);
  for (const positions of policies.values()) {
    const adv = computeAdvantages(positions.map((i) => scored[i]!), estimator, { failedGroupAdvantage });
    positions.forEach((i, k) => (out[i] = adv[k]!));
  }
  return out;
}

function score(s: Sample) {
  return { groupIndex: s.groupIndex, rolloutId: s.rolloutId, reward: s.reward ?? 0 };
}
