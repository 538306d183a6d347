// `ooze fuzz`'s runner: a topology's training job run under fault schedules with ooze/testing. Each
// schedule runs on a job of its own (runJobSchedule, app/job/job-under-test.ts: a fresh nats-server
// behind a cut proxy, the engines as `ooze serve` processes behind recording fault proxies, the
// job's actors in this process), stopped at a deadline, its invariants checked on its output.
// Schedules come from fast-check (shrunk to a minimal failing one) or from a report file (--replay).
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { OozeError } from "../../src/errors.ts";
import { loadTopology, withSettings } from "../../src/topology/load.ts";
import { checkSchedules } from "../../src/testing/arbitraries.ts";
import type { FaultKind, FaultSpec } from "../../src/testing/faults.ts";
import type { JobUnderTestOptions } from "./job-types.ts";
import { describeFault, formatReport, replaySchedule, writeReport, type FaultReport } from "../../src/testing/report.ts";
import { jobScheduleSpace, runJobSchedule } from "./job-under-test.ts";

/** Options of runFuzz. */
export interface FuzzOptions {
  /** Topology file with a `train:` section. */
  file: string;
  /** Schedules to try (ignored with replay). */
  runs: number;
  seed?: number;
  /** Fault kinds to draw from. */
  faults: readonly FaultKind[];
  /** A report (or schedule) file to replay once instead of drawing schedules. */
  replay?: string;
  /** Override train.steps (default 3: small jobs, so many schedules fit). */
  steps: number;
  /**
   * `SECTION.FIELD=VALUE` overrides of the topology's train: and engines: sections, as `ooze train
   * --set` takes them: a topology sized for learning (hundreds of samples a step) fuzzes the same
   * code paths in a fraction of the time with `train.promptsPerStep=2`.
   */
  settings?: readonly string[];
  /** Faults start within this many ms of the job's start. */
  horizonMs: number;
  /** A job still running after this long is stopped and fails `finishes within`. */
  deadlineMs: number;
  /** Where runs and the report go. */
  out: string;
  /**
   * Most job runs spent shrinking after the first failure (default unlimited). Past it the
   * remaining smaller candidates are not run, so the result is the smallest failing schedule found
   * within the budget: a bound on a search whose runs take seconds and whose faults meet the job
   * at times that vary from run to run (one schedule may fail once and pass the next time).
   */
  shrinkRuns?: number;
  log: (line: string) => void;
  /** Names the property in the record of schedules run (OOZE_SCHEDULE_LOG; see recordSchedules). */
  label?: string;
}

/** What runFuzz found. */
export interface FuzzResult {
  ok: boolean;
  runs: number;
  /** The report of the minimal failing schedule (or of the last run when all held). */
  report: FaultReport;
  reportPath: string;
}

/** Runs a topology's job under fault schedules and checks its invariants; see the file comment. */
export async function runFuzz(o: FuzzOptions): Promise<FuzzResult> {
  const file = loadTopology(o.file);
  if (file.train === undefined)
    throw new OozeError("CONFIG_INVALID", `${o.file}: no train: section; ooze fuzz runs a topology's training job and checks its invariants, and this topology runs none (run it with ooze up; test its actors with ooze/testing's fault schedules)`);
  const topology = withSettings(file, o.settings ?? []);
  const out = resolve(o.out);
  mkdirSync(out, { recursive: true });
  const job = (i: number): JobUnderTestOptions => ({ topology, train: { steps: o.steps }, out: join(out, `run-${i}`), deadlineMs: o.deadlineMs, job: `fuzz-${process.pid}-${i}` });
  const space = jobScheduleSpace(job(0), o.faults, { horizonMs: o.horizonMs, maxFaults: 3 });
  let n = 0;
  let last: FaultReport | null = null;

  /** One job under one schedule: its report. */
  const runOne = async (schedule: FaultSpec[]): Promise<FaultReport> => {
    const i = n++;
    const started = Date.now();
    const report = await runJobSchedule(job(i), schedule);
    const bad = report.verdicts.filter((v) => !v.ok);
    const injected = new Set(report.applied.map((a) => a.index)).size;
    o.log(`ooze fuzz: run ${i} (${((Date.now() - started) / 1000).toFixed(1)} s, ${injected}/${schedule.length} faults injected before the job ended): [${schedule.map(describeFault).join("; ")}] → ${bad.length === 0 ? "all invariants held" : bad.map((v) => `${v.name}: ${v.detail}`).join("; ")}`);
    last = report;
    return report;
  };

  const reportPath = join(out, "report.json");
  const replayCmd = `ooze fuzz ${o.file} --replay ${reportPath} --steps ${o.steps}${(o.settings ?? []).map((v) => ` --set '${v}'`).join("")} --deadline ${o.deadlineMs}`;
  if (o.replay !== undefined) {
    const report = await runOne(replaySchedule(o.replay));
    report.replay = replayCmd;
    writeReport(reportPath, report);
    return { ok: report.verdicts.every((v) => v.ok), runs: 1, report, reportPath };
  }
  let failing: FaultReport | null = null;
  let shrinking = 0;
  const r = await checkSchedules(
    space,
    async (schedule) => {
      if (failing !== null && shrinking++ >= (o.shrinkRuns ?? Infinity)) return; // shrink budget spent: not run
      const rep = await runOne(schedule);
      const bad = rep.verdicts.filter((v) => !v.ok);
      if (bad.length > 0) {
        failing = rep; // the last failing run is the most shrunk one
        throw new Error(bad.map((v) => `${v.name}: ${v.detail}`).join("; "));
      }
    },
    { runs: o.runs, ...(o.seed !== undefined ? { seed: o.seed } : {}), ...(o.label !== undefined ? { label: o.label } : {}) },
  );
  const report: FaultReport = failing ?? last ?? { schedule: [], applied: [], verdicts: [], logs: {}, seed: null, path: null, replay: null };
  report.seed = r.seed;
  report.path = r.path;
  report.replay = replayCmd;
  if (!r.ok && r.schedule) report.schedule = r.schedule;
  writeReport(reportPath, report);
  return { ok: r.ok, runs: n, report, reportPath };
}

/** The text `ooze fuzz` prints at the end. */
export function fuzzSummary(r: FuzzResult): string {
  const head = r.ok ? `ooze fuzz: ${r.runs} runs, every invariant held` : `ooze fuzz: a violation; minimal schedule after ${r.runs} runs:`;
  return `${head}\n${formatReport(r.report, { logLines: r.ok ? 0 : 15 })}\nreport: ${r.reportPath}`;
}
