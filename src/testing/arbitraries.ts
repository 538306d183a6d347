// fast-check arbitraries for fault schedules (which fault, on what, when, for how long) that shrink
// toward fewer, earlier and shorter faults, and `checkSchedules`, which runs a property over many
// schedules and returns the minimal failing one with the seed and path that replay it.
import fc from "fast-check";
import { ENGINE_FAULT_KINDS, type EngineFaultKind } from "./engine-fault-proxy.ts";
import { FAULT_KINDS, type FaultKind, type FaultSpec } from "./faults.ts";

/** What schedules may contain. Kinds without a target named here are left out. */
export interface ScheduleSpace {
  /** Fault kinds to draw from (default all those with a target). */
  kinds?: readonly FaultKind[];
  /** Node process names for kill and pause. */
  processes?: readonly string[];
  /** Cut proxy names for cut. */
  links?: readonly string[];
  /** Engine proxy names for engine faults. */
  engines?: readonly string[];
  /** Engine fault kinds (default all). */
  engineFaults?: readonly EngineFaultKind[];
  /** Whether a nats-server restart is possible (default: when the kinds name it). */
  nats?: boolean;
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
    return space.nats ?? space.kinds?.includes("nats-restart") ?? false;
  });
}

/** One fault drawn from the space; shrinks toward an earlier, shorter fault. */
export function faultArb(space: ScheduleSpace): fc.Arbitrary<FaultSpec> {
  const at = fc.integer({ min: 0, max: Math.max(0, space.horizonMs - 1) });
  const forMs = fc.integer({ min: 0, max: space.maxForMs ?? Math.floor(space.horizonMs / 2) });
  const pick = (xs: readonly string[] | undefined) => fc.constantFrom(...(xs ?? []));
  const byKind: Record<FaultKind, () => fc.Arbitrary<FaultSpec>> = {
    kill: () => fc.record({ kind: fc.constant("kill" as const), target: pick(space.processes), at, signal: fc.constant("SIGKILL" as const) }),
    pause: () => fc.record({ kind: fc.constant("pause" as const), target: pick(space.processes), at, forMs }),
    "nats-restart": () => fc.record({ kind: fc.constant("nats-restart" as const), at, downMs: forMs }),
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
  };
  const kinds = drawableKinds(space);
  if (kinds.length === 0) throw new Error("faultArb: the space has no fault kind with a target (name processes, links, engines or nats)");
  return fc.oneof(...kinds.map((k) => byKind[k]()));
}

/** A schedule of 0..maxFaults faults sorted by time; shrinks toward fewer, earlier, shorter faults. */
export function scheduleArb(space: ScheduleSpace): fc.Arbitrary<FaultSpec[]> {
  return fc.array(faultArb(space), { maxLength: space.maxFaults ?? 4 }).map((fs) => [...fs].sort((a, b) => a.at - b.at));
}

/** Options of checkSchedules. */
export interface CheckOptions {
  /** Schedules to try (default OOZE_PROPERTY_RUNS or 10). */
  runs?: number;
  /** Seed of the run (default random); with `path`, replays one schedule. */
  seed?: number;
  /** The counterexample path printed by a failing run. */
  path?: string;
}

/** The outcome of checkSchedules. */
export interface CheckResult {
  ok: boolean;
  runs: number;
  seed: number;
  /** Replays the minimal failing schedule (with seed). */
  path: string | null;
  /** The minimal failing schedule, or null. */
  schedule: FaultSpec[] | null;
  /** Why it failed (the property's error message). */
  error: string | null;
}

/**
 * Runs `property` (which plays a schedule and throws when an invariant breaks) over schedules from
 * `space`; on a failure fast-check shrinks the schedule, and the result names the minimal one with
 * the seed and path that replay it.
 */
export async function checkSchedules(space: ScheduleSpace, property: (schedule: FaultSpec[]) => Promise<void>, opts: CheckOptions = {}): Promise<CheckResult> {
  const runs = opts.runs ?? (Number(process.env.OOZE_PROPERTY_RUNS) || 10);
  const params: fc.Parameters<[FaultSpec[]]> = { numRuns: runs, ...(opts.seed !== undefined ? { seed: opts.seed } : {}), ...(opts.path !== undefined ? { path: opts.path } : {}) };
  const d = await fc.check(fc.asyncProperty(scheduleArb(space), property), params);
  const err = d.errorInstance;
  return {
    ok: !d.failed,
    runs: d.numRuns,
    seed: d.seed,
    path: d.counterexamplePath,
    schedule: d.counterexample ? d.counterexample[0] : null,
    error: d.failed ? (err instanceof Error ? err.message : String(err)) : null,
  };
}
