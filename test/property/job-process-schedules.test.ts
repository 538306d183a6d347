// Property (ooze/testing on the job's own process): `ooze train` runs as a child process (its own
// embedded nats-server, an `ooze serve` engine, the trainer's worker) under schedules of SIGKILL,
// SIGTERM or SIGINT of that process and SIGSTOP/SIGCONT of it; the test is its supervisor and runs
// `ooze train --resume DIR` whenever it ends before its last step. Across the restarts every sample
// index is trained, dropped, requeued or pending exactly once, versions only increase, no batch is
// beyond the mode's staleness bound, no sample is lost to a failed episode, every step is recorded
// once, the job finishes, and no process of a killed incarnation outlives it (engine, worker,
// nats-server). sync and fully_async. Runs: propertyRuns(3).
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import {
  assertInvariants,
  checkSchedules,
  everySampleOnce,
  noFailedSamples,
  playFaults,
  propertyRuns,
  readJsonLines,
  stalenessWithin,
  versionsIncrease,
  waitUntil,
  withDeadline,
  type MetricsLine,
} from "../harness/index.ts";

const RUNS = propertyRuns(3);
const STEPS = 12;
const root = mkdtempSync(join(tmpdir(), "ooze-job-process-"));
const live = new Set<ChildProcess>();
const tally = { schedules: 0, incarnations: 0, ms: 0 };
afterAll(() => {
  process.stdout.write(`job process schedules: ${tally.schedules} schedules, ${tally.incarnations} incarnations of ooze train, ${tally.schedules > 0 ? ((60_000 * tally.schedules) / tally.ms).toFixed(1) : 0} schedules/min\n`);
  for (const c of live) c.kill("SIGKILL");
  rmSync(root, { recursive: true, force: true });
});

function topology(mode: "sync" | "fully_async"): string {
  const file = join(root, `${mode}.yaml`);
  writeFileSync(
    file,
    [
      `name: job-process-${mode}`,
      "actors: [{ name: trainer, kind: train.trainer }]",
      "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
      `train: { mode: ${mode}, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${STEPS}, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 }`,
    ].join("\n"),
  );
  return file;
}

/** Pids of the live descendants of `pid` (from /proc). */
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      parent.set(Number(d), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number) => {
    for (const [c, pp] of parent) if (pp === p) (out.push(c), walk(c));
  };
  walk(pid);
  return out;
}
/**
 * What keeps a process that should have ended alive: it writes a Node diagnostic report on SIGUSR2
 * (`--report-on-signal`), and the report's libuv handles that are active and referenced are listed.
 */
async function liveHandles(pid: number, dir: string): Promise<string> {
  const before = new Set(readdirSync(dir));
  try {
    process.kill(pid, "SIGUSR2");
    type Report = { libuv?: Record<string, unknown>[]; javascriptStack?: { stack?: string[] } };
    let report: Report | null = null;
    // The report is there once its file parses whole.
    await waitUntil(
      () => {
        const file = readdirSync(dir).find((f) => !before.has(f) && f.endsWith(".json"));
        try {
          report = file === undefined ? null : (JSON.parse(readFileSync(join(dir, file), "utf8")) as Report);
        } catch {
          report = null;
        }
        return report !== null;
      },
      { what: "a diagnostic report", timeoutMs: 5_000 },
    );
    const { libuv, javascriptStack } = report as unknown as Report;
    const handles = (libuv ?? []).filter((h) => h.is_active === true && h.is_referenced === true);
    const show = (h: Record<string, unknown>) => [h.type, h.localEndpoint, h.remoteEndpoint, h.firesInMsFromNow, h.filename, h.pid].filter((x) => x !== undefined).map((x) => JSON.stringify(x)).join(" ");
    return `active referenced handles of ${pid}:\n${handles.map(show).join("\n")}\nJS stack: ${(javascriptStack?.stack ?? []).slice(0, 8).join(" | ")}`;
  } catch (e) {
    return `no diagnostic report from ${pid}: ${(e as Error).message}`;
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z ");
  } catch {
    return false;
  }
};

describe("the job's own process killed and resumed (ooze/testing)", () => {
  it("every invariant holds across SIGKILL / SIGTERM / SIGINT / SIGSTOP of `ooze train` and its --resume", { timeout: 60_000 + RUNS * 180_000 }, async () => {
    let n = 0;
    const result = await checkSchedules(
      { kinds: ["kill", "pause"], processes: ["job"], signals: ["SIGKILL", "SIGTERM", "SIGINT"], horizonMs: 4_000, maxForMs: 1_500, maxFaults: 3 },
      async (schedule, mode) => {
        const t0 = Date.now();
        const out = join(root, `run-${n++}`);
        const reports = join(root, `reports-${n}`);
        mkdirSync(reports, { recursive: true });
        const file = topology(mode);
        let log = "";
        let current: ChildProcess | null = null;
        let incarnations = 0;
        const spawned: number[] = [];
        const children = new Set<number>();
        const start = () => {
          // Resumed once the run directory is one (job.json written at the trainer's start); killed before, started again.
          const resume = incarnations++ > 0 && existsSync(join(out, "job.json"));
          const args = ["--report-on-signal", "--report-signal=SIGUSR2", `--report-directory=${reports}`, "bin/ooze.mjs", "train", file, ...(resume ? ["--resume", out] : ["--out", out]), "--quiet"];
          const c = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
          live.add(c);
          spawned.push(c.pid!);
          c.stdout!.on("data", (d) => (log += d));
          c.stderr!.on("data", (d) => (log += d));
          log += `\n--- incarnation ${incarnations}${resume ? " (--resume)" : ""}, pid ${c.pid}\n`;
          current = c;
          return new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
            c.once("exit", (code, signal) => {
              live.delete(c);
              r({ code, signal });
            }),
          );
        };
        // Note the job's descendants while it runs, to check that none outlives its incarnation.
        const watch = setInterval(() => current?.pid !== undefined && descendants(current.pid).forEach((p) => children.add(p)), 50);
        const player = playFaults(schedule, { processes: { job: () => (current?.exitCode === null && current.signalCode === null ? (current.pid ?? null) : null) } });
        try {
          for (;;) {
            const kills = () => player.applied().filter((a) => a.ok && /^SIG(KILL|TERM|INT) job/.test(a.action)).length;
            const before = kills();
            const ended = start();
            const end = await withDeadline(ended, 150_000, `ooze train (incarnation ${incarnations}) to end`).catch(async (e: Error) => {
              // A hung incarnation: say what keeps it alive (Nov 27 CI: one never ended after SIGINT, SIGTERM, SIGSTOP).
              const why = current?.pid !== undefined ? await liveHandles(current.pid, reports) : "";
              throw new Error(`${e.message}; output:\n${log.slice(-4000)}\n${why}`);
            });
            const steps = readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).length;
            if (end.code === 0 && steps === STEPS) break;
            // Ended early by a signal of the schedule (killed, or stopped gracefully): the supervisor resumes it.
            if (kills() === before) throw new Error(`ooze train ended (code ${end.code}, signal ${end.signal}) after ${steps} steps without a kill:\n${log.slice(-4000)}`);
            if (incarnations > 8) throw new Error(`still not finished after ${incarnations} incarnations:\n${log.slice(-4000)}`);
          }
        } finally {
          clearInterval(watch);
          await player.stop();
          tally.schedules++;
          tally.incarnations += incarnations;
          tally.ms += Date.now() - t0;
        }
        await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, versionsIncrease, stalenessWithin(mode === "sync" ? 0 : 2), noFailedSamples], `schedule ${JSON.stringify(schedule)}\n${log.slice(-3000)}`);
        expect(readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).map((m) => m.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
        expect(existsSync(join(out, "checkpoints", "latest.json"))).toBe(true);
        // No process of any incarnation is left (the last one exited 0; killed ones' children follow their parent).
        await waitUntil(() => [...children, ...spawned].every((p) => !alive(p)), {
          what: "every process of the job's incarnations to end",
          timeoutMs: 15_000,
          diagnostics: () => [...children, ...spawned].filter(alive).map((p) => `${p}: ${readFileSync(`/proc/${p}/cmdline`, "utf8").replaceAll("\0", " ").slice(0, 200)}`).join("\n"),
        });
      },
      { runs: RUNS, with: fc.constantFrom("sync" as const, "fully_async" as const), label: "job process: SIGKILL/SIGTERM/SIGINT/SIGSTOP of ooze train, then --resume" },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} in ${result.drawn} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });
});
