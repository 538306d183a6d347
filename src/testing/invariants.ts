// Ready invariants over a training job's recorded output, read through its public shapes: the
// trainer's batches.jsonl (sample indices trained, dropped, requeued per step), metrics.jsonl
// (weight version and staleness per step) and checkpoints/latest.json (the data position and, in
// fully_async, the groups still pending); plus a deadline. Each gives a verdict with what it saw.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../errors.ts";

/** What a run of a job under faults left behind. */
export interface JobOutcome {
  /** The job's output directory (`ooze train --out`). */
  dir: string;
  /** Whether the job ended by itself (not killed at a deadline). */
  finished: boolean;
  /** Wall time from start to end (or to the kill), ms. */
  durationMs: number;
  /**
   * The error the job ended with, or null: an actor whose supervision gave up (restart intensity
   * spent, a non-retryable crash) escalates and ends its node with this error. Unset: not recorded.
   */
  error?: string | null;
}

/** An invariant's verdict: ok, and what it saw. */
export interface Verdict {
  name: string;
  ok: boolean;
  detail: string;
}

/** A named check over a job's outcome; write your own with the same shape. */
export interface Invariant {
  name: string;
  check(job: JobOutcome): Omit<Verdict, "name"> | Promise<Omit<Verdict, "name">>;
}

/** One line of batches.jsonl (the fields the invariants read). */
export interface BatchLine {
  step: number;
  trained: number[];
  dropped: number[];
  requeued?: number[];
}

/** One line of metrics.jsonl (the fields the invariants read). */
export interface MetricsLine {
  step: number;
  weight_version: number;
  staleness_max: number;
  /** Samples of the step whose episode failed (retries exhausted, or the environment threw). */
  failed?: number;
}

/** Reads a JSONL file (missing → []); a line that is not JSON throws naming file and line. */
export function readJsonLines<T>(path: string): T[] {
  if (!existsSync(path)) return [];
  const out: T[] = [];
  readFileSync(path, "utf8")
    .split("\n")
    .forEach((l, i) => {
      if (l.trim() === "") return;
      try {
        out.push(JSON.parse(l) as T);
      } catch (e) {
        throw new OozeError("CONFIG_INVALID", `${path}:${i + 1}: not a JSON line (${(e as Error).message})`);
      }
    });
  return out;
}

/** Indices in `xs` that occur more than once, and those of 0..n-1 missing. */
function accounting(xs: readonly number[], n: number): { dup: number[]; missing: number[]; extra: number[] } {
  const count = new Map<number, number>();
  for (const x of xs) count.set(x, (count.get(x) ?? 0) + 1);
  const dup = [...count].filter(([, c]) => c > 1).map(([x]) => x);
  const missing: number[] = [];
  for (let i = 0; i < n; i++) if (!count.has(i)) missing.push(i);
  const extra = [...count.keys()].filter((x) => x < 0 || x >= n);
  return { dup, missing, extra };
}

const head = (xs: readonly number[]) => (xs.length > 8 ? `${xs.slice(0, 8).join(", ")}, … (${xs.length})` : xs.join(", "));

/**
 * Every sample index from 0 to the data position is trained, dropped or requeued exactly once, or
 * pending in the latest checkpoint (fully_async). Without a checkpoint, the position is one past the
 * largest index seen. For a topology whose episodes own several indices (an agent with
 * `maxSegments` > 1), use everyEpisodeOnce.
 */
export const everySampleOnce: Invariant = { name: "every sample trained or dropped exactly once", check: (job) => accountSamples(job, 1) };

/**
 * An agent topology's version of everySampleOnce: each episode owns `maxSegments` consecutive sample
 * indices and yields one sample per trajectory segment (at least one: a failed episode records a
 * placeholder at its first index), so an episode is accounted when its first index is recorded
 * once; no index may be recorded twice, none beyond the position, and an episode's segments are
 * its first indices with no gap.
 */
export function everyEpisodeOnce(maxSegments: number): Invariant {
  return { name: `every episode (${maxSegments} sample slots each) trained or dropped exactly once`, check: (job) => accountSamples(job, maxSegments) };
}

function accountSamples(job: JobOutcome, slots: number): Omit<Verdict, "name"> {
  const batches = readJsonLines<BatchLine>(join(job.dir, "batches.jsonl"));
  const latestPath = join(job.dir, "checkpoints", "latest.json");
  const latest = existsSync(latestPath) ? (JSON.parse(readFileSync(latestPath, "utf8")) as { nextSample?: number; step?: number; pending?: { firstSample: number; count: number }[] }) : null;
  // Records past the checkpoint's step belong to no checkpoint yet: count them, the position grows.
  const seen = batches.flatMap((b) => [...b.trained, ...b.dropped, ...(b.requeued ?? [])]);
  const pending = (latest?.pending ?? []).flatMap((g) => Array.from({ length: g.count }, (_, k) => g.firstSample + k));
  const all = [...seen, ...pending];
  const n = Math.max(latest?.nextSample ?? 0, all.length > 0 ? Math.max(...all) + 1 : 0);
  const a = accounting(all, n);
  // With several slots per episode, an unused slot is not lost: only an episode's first slot must be there,
  // and its segments fill its slots from the first without a gap.
  const present = new Set(all);
  const laterInEpisode = (i: number) => {
    for (let j = i + 1; j < (Math.floor(i / slots) + 1) * slots; j++) if (present.has(j)) return true;
    return false;
  };
  const missing = slots === 1 ? a.missing : a.missing.filter((i) => i % slots === 0 || laterInEpisode(i));
  const ok = a.dup.length === 0 && missing.length === 0 && a.extra.length === 0;
  const parts = [`${batches.length} batches, ${seen.length} samples recorded, ${pending.length} pending, position ${n}`];
  if (a.dup.length) parts.push(`recorded twice: ${head(a.dup)}`);
  if (missing.length) parts.push(`lost: ${head(missing)}`);
  if (a.extra.length) parts.push(`beyond the position: ${head(a.extra)}`);
  return { ok, detail: parts.join("; ") };
}

/** Weight versions only increase, one step after another (metrics.jsonl), and steps are recorded once each. */
export const versionsIncrease: Invariant = {
  name: "weight versions only increase",
  check(job) {
    const ms = readJsonLines<MetricsLine>(join(job.dir, "metrics.jsonl"));
    for (let i = 1; i < ms.length; i++) {
      const a = ms[i - 1]!;
      const b = ms[i]!;
      if (!(b.step > a.step)) return { ok: false, detail: `step ${b.step} recorded after step ${a.step}` };
      if (!(b.weight_version > a.weight_version)) return { ok: false, detail: `step ${b.step}: weight version ${b.weight_version} after ${a.weight_version} at step ${a.step}` };
    }
    return { ok: true, detail: `${ms.length} steps, versions ${ms.map((m) => m.weight_version).join(" → ") || "none"}` };
  },
};

/** No step trained on a sample more than `bound` versions older than the trainer (metrics staleness_max). */
export function stalenessWithin(bound: number): Invariant {
  return {
    name: `no batch beyond staleness ${bound}`,
    check(job) {
      const ms = readJsonLines<MetricsLine>(join(job.dir, "metrics.jsonl"));
      const bad = ms.filter((m) => m.staleness_max > bound);
      return bad.length === 0
        ? { ok: true, detail: `${ms.length} steps, max staleness ${Math.max(0, ...ms.map((m) => m.staleness_max))}` }
        : { ok: false, detail: `steps ${bad.map((m) => `${m.step} (staleness ${m.staleness_max})`).join(", ")} beyond ${bound}` };
    },
  };
}

/**
 * No sample lost to a failure: every step's `failed` count (metrics.jsonl) is 0. everySampleOnce
 * accepts a failed episode as accounted for (it is dropped, not lost from the books); this one
 * holds the job to what a user expects of transient faults — retried until they pass, nothing
 * dropped. It sees engines whose retries ran out and environments (tasks, rewards, agents) that
 * throw when an episode is slow or runs again: their samples never reach training.
 */
export const noFailedSamples: Invariant = {
  name: "no sample lost to a failed episode",
  check(job) {
    const ms = readJsonLines<MetricsLine>(join(job.dir, "metrics.jsonl"));
    const bad = ms.filter((m) => (m.failed ?? 0) > 0);
    const total = bad.reduce((n, m) => n + (m.failed ?? 0), 0);
    return bad.length === 0
      ? { ok: true, detail: `${ms.length} steps, no failed episode` }
      : { ok: false, detail: `${total} failed episode(s), dropped from training: ${bad.map((m) => `step ${m.step}: ${m.failed}`).join(", ")}` };
  },
};

/**
 * No actor left crashed: every crash ended in a restart, none escalated (the job ended without an
 * error). Needs `JobOutcome.error`; a job killed at its deadline is judged by finishesWithin.
 */
export const noActorLeftCrashed: Invariant = {
  name: "no actor left crashed",
  check(job) {
    if (job.error === undefined) throw new OozeError("CONFIG_INVALID", "noActorLeftCrashed needs JobOutcome.error (null when the job ended without one)");
    return job.error === null ? { ok: true, detail: "every crash ended in a restart; the job ended without an error" } : { ok: false, detail: job.error };
  },
};

/** The job ended by itself within `ms` (no hang). */
export function finishesWithin(ms: number): Invariant {
  return {
    name: `finishes within ${ms} ms`,
    check(job) {
      const ok = job.finished && job.durationMs <= ms;
      return { ok, detail: job.finished ? `finished in ${Math.round(job.durationMs)} ms` : `still running after ${Math.round(job.durationMs)} ms (killed)` };
    },
  };
}

/** Runs every invariant; one that throws is a failed verdict carrying the error. */
export async function checkInvariants(job: JobOutcome, invariants: readonly Invariant[]): Promise<Verdict[]> {
  const out: Verdict[] = [];
  for (const inv of invariants) {
    try {
      const v = await inv.check(job);
      out.push({ name: inv.name, ...v });
    } catch (e) {
      out.push({ name: inv.name, ok: false, detail: `the check threw: ${e instanceof Error ? e.message : String(e)}` });
    }
  }
  return out;
}

/**
 * Runs the invariants and throws (an Error listing every broken one with what it saw, then the
 * ones that held) when any breaks; resolves with the verdicts otherwise. For tests and properties.
 */
export async function assertInvariants(job: JobOutcome, invariants: readonly Invariant[], context = ""): Promise<Verdict[]> {
  const verdicts = await checkInvariants(job, invariants);
  const bad = verdicts.filter((v) => !v.ok);
  if (bad.length > 0) {
    const lines = [...bad.map((v) => `FAIL ${v.name}: ${v.detail}`), ...verdicts.filter((v) => v.ok).map((v) => `ok   ${v.name}: ${v.detail}`)];
    throw new Error(`invariants broken in ${job.dir}:\n${lines.join("\n")}${context ? `\n${context}` : ""}`);
  }
  return verdicts;
}
