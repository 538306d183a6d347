// The types of ooze/testing/job: what startJobUnderTest starts (a topology's training job on its own
// NATS, with its engines and the targets of faults) and what it hands back.
import type { Topology } from "../../src/topology/schema.ts";
import type { ScheduleSpace } from "../../src/testing/arbitraries.ts";
import type { FaultKind, FaultSpec, FaultTargets } from "../../src/testing/faults.ts";
import type { Invariant, JobOutcome } from "../../src/testing/invariants.ts";
import type { TestNatsCluster } from "../../src/testing/nats-cluster.ts";
import type { FaultReport } from "../../src/testing/report.ts";


/** What startJobUnderTest starts. */
export interface JobUnderTestOptions {
  /** The topology (a file, or one parsed with parseTopology / loadTopology) with a `train:` section. */
  topology: string | Topology;
  /** Fields of `train:` replaced for the test, e.g. `{ steps: 8 }` (validated as the section is). */
  train?: Record<string, unknown>;
  /** The job's output directory (emptied first). */
  out: string;
  /**
   * NATS: by default a fresh nats-server (target `nats`), reached by the job through a cut proxy
   * (link `job-nats`). With `cluster`, a running cluster (its servers are targets `s0`, `s1`, …
   * for `nats-restart` with `server`), streams replicated `replicas` times (default 3).
   */
  nats?: { cluster: TestNatsCluster; replicas?: number };
  /**
   * Engines: `proxied` (default) starts each engine of the topology as an `ooze serve` process
   * behind an engine fault proxy (targets `engine-0`, …) that records what the engine returned
   * (OUT/engine-outputs/, for tokensAsSampled); `embedded` runs the topology's engines inside the
   * job as `ooze train` does (no engine targets; tokensAsSampled is then not among the invariants).
   * With `proxied`, the topology's external `urls` get a recording proxy each too (numbered first);
   * a topology with its own fleet actor has that actor's `engines` URLs and `embedded` engines
   * proxied the same way (the actor then reaches them through their proxies only).
   */
  engines?: "proxied" | "embedded";
  /** A job still running after this long (ms from its start) is stopped; finishesWithin fails. */
  deadlineMs: number;
  /** More targets of your own (faulty commands, disks, processes), merged with the job's. */
  targets?: FaultTargets;
  /** The job's id (default unique per call). */
  job?: string;
  /** Each line the job logs, prefixed with its ms on the faults' clock (0 = the job's start). */
  log?: (line: string) => void;
}

/** A job started by startJobUnderTest. */
export interface JobUnderTest {
  readonly out: string;
  /** The targets of faults: `trainer-worker` (process), the loop's actors, nats, links, engines, yours. */
  readonly targets: FaultTargets;
  /** The schedule space over these targets for `kinds` (give it to scheduleArb / checkSchedules). */
  space(kinds: readonly FaultKind[], o: { horizonMs: number; maxForMs?: number; maxFaults?: number }): ScheduleSpace;
  /**
   * The invariants that fit the topology: every sample (or agent episode) trained or dropped once,
   * no sample lost to a failed episode, versions only increase, the mode's staleness bound, every
   * trained token one an engine sampled (proxied engines), no actor left crashed, finishes within
   * the deadline.
   */
  readonly invariants: Invariant[];
  /** Resolves when the job's actors run (the faults' clock starts); rejects with the reason a job could not start. */
  readonly started: Promise<void>;
  /** Resolves when the job has ended: by itself, with an error, or stopped at the deadline. */
  readonly outcome: Promise<JobOutcome>;
  /** Output of each process involved so far (the job's lines, engines, nats-server), by name. */
  logs(): Record<string, string>;
  /** Stops the job if it still runs and everything started for it. */
  close(): Promise<void>;
}

/** The invariants runJobSchedule checks: a list, or a function of the job's own (e.g. `(own) => [...own, mine]`). */
export type JobInvariants = readonly Invariant[] | ((own: readonly Invariant[]) => readonly Invariant[]);
