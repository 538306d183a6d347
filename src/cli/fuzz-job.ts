// `ooze fuzz`'s runner: a topology's training job run under fault schedules with ooze/testing. For
// each schedule it starts what is faulted from outside the job — a fresh nats-server behind a cut
// proxy (link `job-nats`), the topology's engines as `ooze serve` processes each behind an engine
// fault proxy (`engine-0`, …) — runs the job (`ooze train`'s actors, in this process) while the
// schedule is played (`trainer-worker`: the trainer's worker process, which the trainer restarts),
// stops it at a deadline, and checks the invariants on its output. The loop's actors (`rollout`,
// `buffer`, `trainer`, `weight-sync`, `fleet`) are targets of `actor` faults: crashed through the
// runtime's supervision. Schedules come from fast-check
// (shrunk to a minimal failing one) or from a report file (--replay). This is a composition root of
// the loop, so it may import actors/.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { trainConfigOf, fullyAsyncLimits, type TrainConfig } from "../../actors/loop/config.ts";
import { OozeError } from "../errors.ts";
import { checkSchedules, type ScheduleSpace } from "../testing/arbitraries.ts";
import { createCutProxy } from "../testing/cut-proxy.ts";
import { startEngineFaultProxy, type EngineFaultProxy } from "../testing/engine-fault-proxy.ts";
import { checkTargets, playFaults, type FaultKind, type FaultPlayer, type FaultSpec } from "../testing/faults.ts";
import { checkInvariants, everySampleOnce, finishesWithin, noActorLeftCrashed, noFailedSamples, stalenessWithin, versionsIncrease, type Verdict } from "../testing/invariants.ts";
import { startTestNats } from "../testing/nats.ts";
import { describeFault, formatReport, replaySchedule, writeReport, type FaultReport } from "../testing/report.ts";
import { waitUntil } from "../testing/wait.ts";
import { loadTopology } from "../topology/load.ts";
import { runTrainJob } from "./train-job.ts";

const OOZE_BIN = fileURLToPath(new URL("../../bin/ooze.mjs", import.meta.url));

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

/** The loop's actors that `actor` faults crash. */
export const FUZZ_ACTORS = ["rollout", "buffer", "trainer", "weight-sync", "fleet"] as const;

/** What runFuzz found. */
export interface FuzzResult {
  ok: boolean;
  runs: number;
  /** The report of the minimal failing schedule (or of the last run when all held). */
  report: FaultReport;
  reportPath: string;
}

/** `ooze serve` for the job's model on a free port; resolves once it serves. */
async function startServe(train: TrainConfig, baseDir: string): Promise<{ url: string; child: ChildProcess; log: () => string }> {
  const model = train.model !== undefined ? ["--model", resolve(baseDir, train.model)] : ["--preset", train.preset, "--seed", String(train.seed)];
  const child = spawn(process.execPath, [OOZE_BIN, "serve", ...model, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout!.on("data", (d) => (log = (log + d).slice(-20_000)));
  child.stderr!.on("data", (d) => (log = (log + d).slice(-20_000)));
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  try {
    const url = await Promise.race([
      waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "ooze serve to print its URL", diagnostics: () => log }),
      exited.then(() => {
        throw new OozeError("ENGINE_UNAVAILABLE", `ooze serve exited before serving: ${log.trim()}`);
      }),
    ]);
    return { url, child, log: () => log };
  } catch (e) {
    child.kill("SIGKILL");
    throw e;
  }
}

async function stopChild(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const gone = new Promise((r) => c.once("exit", r));
  c.kill("SIGCONT");
  c.kill("SIGTERM");
  const t = setTimeout(() => c.kill("SIGKILL"), 5_000);
  await gone;
  clearTimeout(t);
}

/** Runs a topology's job under fault schedules and checks its invariants; see the file comment. */
export async function runFuzz(o: FuzzOptions): Promise<FuzzResult> {
  const topo = loadTopology(o.file);
  const { train: train0, engines } = trainConfigOf(topo);
  const train = { ...train0, steps: o.steps };
  const baseDir = resolve(o.file, "..");
  const engineCount = Math.max(1, engines.count + engines.urls.length);
  const bound = train.mode === "sync" ? 0 : train.mode === "async" ? 1 : fullyAsyncLimits(train).maxStaleness;
  const invariants = [everySampleOnce, noFailedSamples, versionsIncrease, stalenessWithin(bound), noActorLeftCrashed, finishesWithin(o.deadlineMs)];
  const out = resolve(o.out);
  mkdirSync(out, { recursive: true });
  const space: ScheduleSpace = {
    kinds: o.faults,
    processes: ["trainer-worker"],
    links: ["job-nats"],
    engines: Array.from({ length: engineCount }, (_, i) => `engine-${i}`),
    actors: FUZZ_ACTORS,
    nats: o.faults.includes("nats-restart"),
    horizonMs: o.horizonMs,
    maxForMs: Math.floor(o.horizonMs / 2),
    maxFaults: 3,
  };
  let n = 0;
  let last: FaultReport | null = null;

  /** One job under one schedule: its report. */
  const runOne = async (schedule: FaultSpec[]): Promise<FaultReport> => {
    const i = n++;
    const dir = join(out, `run-${i}`);
    rmSync(dir, { recursive: true, force: true });
    const lines: string[] = [];
    const logs: Record<string, string> = {};
    const started = Date.now();
    const nats = await startTestNats();
    const link = await createCutProxy(nats.port);
    const serves: Awaited<ReturnType<typeof startServe>>[] = [];
    const proxies: EngineFaultProxy[] = [];
    let verdicts: Verdict[] = [];
    let applied: FaultReport["applied"] = [];
    try {
      for (let k = 0; k < engineCount; k++) {
        serves.push(await startServe(train, baseDir));
        proxies.push(await startEngineFaultProxy(serves[k]!.url));
      }
      const workerPid = () => {
        const pids = lines.map((l) => /trainer: worker pid (\d+)/.exec(l)?.[1]).filter(Boolean);
        return pids.length > 0 ? Number(pids.at(-1)) : null;
      };
      const ctl = new AbortController();
      const t0 = Date.now();
      let timedOut = false;
      const deadline = setTimeout(() => {
        timedOut = true;
        ctl.abort();
      }, o.deadlineMs);
      let crashActor: ((name: string) => boolean) | null = null;
      const targets = {
        actors: Object.fromEntries(FUZZ_ACTORS.map((a) => [a, () => crashActor?.(a) ?? false])),
        processes: { "trainer-worker": workerPid },
        nats,
        links: { "job-nats": link },
        engines: Object.fromEntries(proxies.map((p, k) => [`engine-${k}`, p])),
      };
      checkTargets(schedule, targets); // a schedule naming a missing target fails before the job starts
      // Faults start once the job has started (its actors run): a job that cannot start fails with its reason.
      let player: FaultPlayer | null = null;
      let error: string | null = null;
      let clock = Date.now(); // from onStart on: the faults' clock (their `at`)
      try {
        await runTrainJob({
          topology: topo,
          train,
          engines: { ...engines, count: 0, urls: proxies.map((p) => p.url) },
          out: dir,
          job: `fuzz-${process.pid}-${i}`,
          nats: { url: `nats://127.0.0.1:${link.port}`, token: nats.token },
          verbose: true,
          log: (l) => lines.push(`${Date.now() - clock} ms ${l}`),
          signal: ctl.signal,
          onStart: (info) => {
            clock = Date.now();
            crashActor = info.crashActor;
            player = playFaults(schedule, targets);
          },
        });
      } catch (e) {
        error = e instanceof Error ? e.message : String(e);
      } finally {
        clearTimeout(deadline);
        applied = player ? await (player as FaultPlayer).stop() : [];
      }
      const durationMs = Date.now() - t0;
      if (player === null && error !== null) throw new OozeError("INTERNAL", `the job did not start, so no fault was injected: ${error}`);
      verdicts = await checkInvariants({ dir, finished: !timedOut, durationMs, error }, invariants);
    } catch (e) {
      if (e instanceof OozeError && e.code === "CONFIG_INVALID") throw e; // a schedule naming a missing target
      verdicts = [{ name: "the job under test starts", ok: false, detail: e instanceof Error ? e.message : String(e) }];
    } finally {
      for (const p of proxies) await p.close();
      for (const [k, s] of serves.entries()) {
        await stopChild(s.child);
        logs[`engine-${k}`] = s.log();
      }
      await link.close();
      logs["nats-server"] = nats.logTail();
      await nats.stop();
      logs.job = lines.join("\n");
    }
    const report: FaultReport = { schedule, applied, verdicts, logs, seed: null, path: null, replay: null };
    const bad = verdicts.filter((v) => !v.ok);
    const injected = new Set(applied.map((a) => a.index)).size;
    o.log(`ooze fuzz: run ${i} (${((Date.now() - started) / 1000).toFixed(1)} s, ${injected}/${schedule.length} faults injected before the job ended): [${schedule.map(describeFault).join("; ")}] → ${bad.length === 0 ? "all invariants held" : bad.map((v) => `${v.name}: ${v.detail}`).join("; ")}`);
    last = report;
    return report;
  };

  const reportPath = join(out, "report.json");
  const replayCmd = `ooze fuzz ${o.file} --replay ${reportPath} --steps ${o.steps} --deadline ${o.deadlineMs}`;
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
