// fast-check arbitraries for fault schedules (which fault, on what, when, for how long) that shrink
// toward fewer, earlier and shorter faults, and `checkSchedules`, which runs a property over many
// schedules, returns the minimal failing one with the seed and path that replay it, and records how
// many schedules it ran (printed, and appended to OOZE_SCHEDULE_LOG when set) so a suite can count
// its schedules honestly.
import { appendFileSync } from "node:fs";
import fc from "fast-check";
import { ENGINE_FAULT_KINDS, type EngineFaultKind } from "./engine-fault-proxy.ts";
import { FAULT_KINDS, type FaultKind, type FaultSpec } from "./faults.ts";
import { COMMAND_FAULTS, type CommandFault } from "./faulty-command.ts";

/** What schedules may contain. Kinds without a target named here are left out. */
export interface ScheduleSpace {
  /** Fault kinds to draw from (default all those with a target). */
  kinds?: readonly FaultKind[];
  /** Node process names for kill and pause. */
  processes?: readonly string[];
  /** Signals a kill sends (default SIGKILL only: a crash; SIGTERM and SIGINT ask for a graceful stop). */
  signals?: readonly ("SIGKILL" | "SIGTERM" | "SIGINT")[];
  /** Cut proxy names for cut. */
  links?: readonly string[];
  /** Engine proxy names for engine faults. */
  engines?: readonly string[];
  /** Engine fault kinds (default all). */
  engineFaults?: readonly EngineFaultKind[];
  /** Whether a nats-server restart is possible (default: when the kinds name it). */
  nats?: boolean;
  /** Names of a cluster's nats-servers: nats-restart then restarts one of them. */
  natsServers?: readonly string[];
  /** Actor names for actor crashes. */
  actors?: readonly string[];
  /** Faulty command names for command faults. */
  commands?: readonly string[];
  /** Command fault kinds (default all). */
  commandFaults?: readonly CommandFault[];
  /** Disk names for disk-full. */
  disks?: readonly string[];
  /** Faults start within [0, horizonMs). */
  horizonMs: number;
  /** Longest duration of a pause, cut, engine fault or nats-server downtime (default horizonMs / 2). */
  maxForMs?: number;
  /** Most faults in one schedule (default 4). */
  maxFaults?: number;
}

/** The kinds a space can draw, given its targets. */
export function drawableKinds(space: ScheduleSpace): FaultKind[] {
  const want = space.kinds ?? FAULT_KINDS;
  return want.filter((k) => {
    if (k === "kill" || k === "pause") return (space.processes?.length ?? 0) > 0;
    if (k === "cut") return (space.links?.length ?? 0) > 0;
    if (k === "engine") return (space.engines?.length ?? 0) > 0;
    if (k === "actor") return (space.actors?.length ?? 0) > 0;
    if (k === "command") return (space.commands?.length ?? 0) > 0;
    if (k === "disk-full") return (space.disks?.length ?? 0) > 0;
    return (space.natsServers?.length ?? 0) > 0 || (space.nats ?? space.kinds?.includes("nats-restart") ?? false);
  });
}

/** One fault drawn from the space; shrinks toward an earlier, shorter fault. */
export function faultArb(space: ScheduleSpace): fc.Arbitrary<FaultSpec> {
  const at = fc.integer({ min: 0, max: Math.max(0, space.horizonMs - 1) });
  const forMs = fc.integer({ min: 0, max: space.maxForMs ?? Math.floor(space.horizonMs / 2) });
  const pick = (xs: readonly string[] | undefined) => fc.constantFrom(...(xs ?? []));
  const byKind: Record<FaultKind, () => fc.Arbitrary<FaultSpec>> = {
    kill: () => fc.record({ kind: fc.constant("kill" as const), target: pick(space.processes), at, signal: fc.constantFrom(...(space.signals ?? (["SIGKILL"] as const))) }),
    pause: () => fc.record({ kind: fc.constant("pause" as const), target: pick(space.processes), at, forMs }),
    "nats-restart": () =>
      (space.natsServers?.length ?? 0) > 0
        ? fc.record({ kind: fc.constant("nats-restart" as const), at, downMs: forMs, server: pick(space.natsServers) })
        : fc.record({ kind: fc.constant("nats-restart" as const), at, downMs: forMs }),
    cut: () => fc.record({ kind: fc.constant("cut" as const), link: pick(space.links), at, forMs }),
    engine: () =>
      fc.record({
        kind: fc.constant("engine" as const),
        engine: pick(space.engines),
        at,
        forMs,
        fault: fc.record({
          kind: fc.constantFrom(...(space.engineFaults ?? ENGINE_FAULT_KINDS)),
          rate: fc.constantFrom(1, 0.5, 0.3),
          seed: fc.integer({ min: 0, max: 1000 }),
        }),
      }),
    actor: () => fc.record({ kind: fc.constant("actor" as const), target: pick(space.actors), at }),
    command: () =>
      fc.record({ kind: fc.constant("command" as const), command: pick(space.commands), at, forMs, fault: fc.constantFrom(...(space.commandFaults ?? COMMAND_FAULTS)) }),
    "disk-full": () => fc.record({ kind: fc.constant("disk-full" as const), disk: pick(space.disks), at, forMs }),
  };
  const kinds = drawableKinds(space);
  if (kinds.length === 0) throw new Error("faultArb: the space has no fault kind with a target (name processes, links, engines, nats, actors, commands or disks)");
  return fc.oneof(...kinds.map((k) => byKind[k]()));
}

/** A schedule of 0..maxFaults faults sorted by time; shrinks toward fewer, earlier, shorter faults. */
export function scheduleArb(space: ScheduleSpace): fc.Arbitrary<FaultSpec[]> {
  return fc.array(faultArb(space), { maxLength: space.maxFaults ?? 4 }).map((fs) => [...fs].sort((a, b) => a.at - b.at));
}

/**
 * Runs of a property: OOZE_PROPERTY_RUNS when set (every property runs that many, as ooze's tests
 * always read it), else `defaultRuns` × OOZE_PROPERTY_SCALE (default 1), at least 1.
 */
export function propertyRuns(defaultRuns: number): number {
  const fixed = Number(process.env.OOZE_PROPERTY_RUNS);
  if (Number.isFinite(fixed) && fixed > 0) return Math.floor(fixed);
  const scale = Number(process.env.OOZE_PROPERTY_SCALE);
  return Math.max(1, Math.round(defaultRuns * (Number.isFinite(scale) && scale > 0 ? scale : 1)));
}

/**
 * Records that the property `label` ran `runs` schedules: a line on stdout and, when
 * OOZE_SCHEDULE_LOG names a file, a JSON line `{label, runs, ok, seed}` appended to it (what a CI
 * total is summed from). checkSchedules calls it; a property written with fast-check directly can too.
 */
export function recordSchedules(label: string, runs: number, ok: boolean, seed: number | null = null): void {
  process.stdout.write(`ooze/testing: ${label}: ${runs} schedule(s), ${ok ? "all held" : "FAILED"}${seed !== null ? ` (seed ${seed})` : ""}\n`);
  const file = process.env.OOZE_SCHEDULE_LOG;
  if (file) appendFileSync(file, `${JSON.stringify({ label, runs, ok, seed, at: new Date().toISOString() })}\n`);
}

/** Options of checkSchedules. */
export interface CheckOptions {
  /** Schedules to try (default propertyRuns(10)). */
  runs?: number;
  /** Names the property in the record of schedules run (recordSchedules); without it nothing is recorded. */
  label?: string;
  /** Seed of the run (default OOZE_PROPERTY_SEED, else random); with `path` (or OOZE_PROPERTY_PATH), replays one schedule. */
  seed?: number;
  /** The counterexample path printed by a failing run. */
  path?: string;
  /**
   * Stops trying or shrinking schedules after this long (ms), between runs: a failure found is then
   * reported with the schedule shrunk so far. Set it under the test's timeout, so that a schedule that
   * fails slowly (a job that runs to its deadline) is reported rather than timed out.
   */
  timeLimitMs?: number;
}

/** The outcome of checkSchedules. */
export interface CheckResult<E = undefined> {
  ok: boolean;
  runs: number;
  seed: number;
  /** Replays the minimal failing schedule (with seed). */
  path: string | null;
  /** The minimal failing schedule, or null. */
  schedule: FaultSpec[] | null;
  /** The job parameters drawn with it (`opts.with`), or null. */
  drawn: E | null;
  /** Why it failed (the property's error message). */
  error: string | null;
}

/** An error's message on one line, its head and its tail (an assertion's own message comes first, what failed last). */
function gist(e: unknown): string {
  const text = String(e instanceof Error ? e.message : e).replace(/\s*\n\s*/g, " | ");
  return text.length <= 800 ? text : `${text.slice(0, 300)} … ${text.slice(-500)}`;
}

/**
 * Runs `property` (which plays a schedule and throws when an invariant breaks) over schedules from
 * `space`; on a failure fast-check shrinks the schedule, and the result names the minimal one with
 * the seed and path that replay it. `opts.with` draws the job's own parameters beside each schedule
 * (routing, request mix, mode…), shrunk and replayed with it, and handed to the property.
 */
export async function checkSchedules<E = undefined>(
  space: ScheduleSpace,
  property: (schedule: FaultSpec[], drawn: E) => Promise<void>,
  opts: CheckOptions & { with?: fc.Arbitrary<E> } = {},
): Promise<CheckResult<E>> {
  const runs = opts.runs ?? propertyRuns(10);
  // A failure printed by any test replays with OOZE_PROPERTY_SEED=S OOZE_PROPERTY_PATH=P.
  const envSeed = process.env.OOZE_PROPERTY_SEED !== undefined ? Number(process.env.OOZE_PROPERTY_SEED) : undefined;
  const seed = opts.seed ?? (Number.isInteger(envSeed) ? envSeed : undefined);
  const path = opts.path ?? (seed !== undefined && opts.seed === undefined ? process.env.OOZE_PROPERTY_PATH : undefined);
  // The seed is drawn here, not by fast-check, so that it is printed before the first schedule runs: a
  // test that times out still names the seed that replays it.
  const drawnSeed = seed ?? (Date.now() ^ Math.floor(Math.random() * 0x100000000)) | 0;
  const params: fc.Parameters<[FaultSpec[], E]> = {
    numRuns: runs,
    seed: drawnSeed,
    ...(path !== undefined ? { path } : {}),
    ...(opts.timeLimitMs !== undefined ? { interruptAfterTimeLimit: opts.timeLimitMs } : {}),
  };
  const name = opts.label ?? "schedules";
  process.stdout.write(`ooze/testing: ${name}: ${runs} schedule(s) from seed ${drawnSeed}${path !== undefined ? ` path ${path}` : ""}\n`);
  const extra = opts.with ?? (fc.constant(undefined) as unknown as fc.Arbitrary<E>);
  // The first failure is printed as it happens, before shrinking (which may take longer than the test has).
  let failures = 0;
  const checked = async (schedule: FaultSpec[], drawn: E): Promise<void> => {
    try {
      await property(schedule, drawn);
    } catch (e) {
      if (failures++ === 0) process.stdout.write(`ooze/testing: ${name}: schedule ${JSON.stringify(schedule)} failed (shrinking): ${gist(e)}\n`);
      throw e;
    }
  };
  const d = await fc.check(fc.asyncProperty(scheduleArb(space), extra, checked), params);
  const err = d.errorInstance;
  if (d.interrupted) process.stdout.write(`ooze/testing: ${name}: stopped at the time limit (${opts.timeLimitMs} ms) after ${d.numRuns} schedule(s)\n`);
  if (opts.label !== undefined) recordSchedules(opts.label, d.numRuns, !d.failed, d.seed);
  return {
    ok: !d.failed,
    runs: d.numRuns,
    seed: d.seed,
    path: d.counterexamplePath,
    schedule: d.counterexample ? d.counterexample[0] : null,
    drawn: d.counterexample ? d.counterexample[1] : null,
    error: d.failed ? (err instanceof Error ? err.message : String(err)) : null,
  };
}
