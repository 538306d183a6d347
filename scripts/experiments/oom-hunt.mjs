// Hunts a heap blow-up in a job under fault schedules (docs/reliability.md, finding 19): runs the
// fully_async job of test/property/job-schedules.test.ts under `ooze fuzz` in a child process with a
// small heap (--max-old-space-size=400), for RUNS schedules, and prints the child's resident memory
// every 5 s from here. The watch is outside the job's process on purpose: finding 19's loop starved
// that process's own timers, so a watch inside it went silent. A child that dies of its heap names
// the run it died in (its last runs/run-N directory). OOZE_PROPERTY_PATH=N with SEED replays the N-th
// schedule.
// `node scripts/experiments/oom-hunt.mjs RUNS OUTDIR [SEED]` (plain JavaScript: node runs it as it is).
import { spawn } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const runs = process.argv[2] ?? "10";
const out = process.argv[3] ?? "/tmp/oom-hunt";
const seed = process.argv[4];
mkdirSync(out, { recursive: true });
const file = join(out, "fully_async.yaml");
writeFileSync(
  file,
  [
    "name: job-schedules-fully_async",
    "actors: [{ name: trainer, kind: train.trainer }]",
    "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
    "train: { mode: fully_async, task: addition, taskConfig: { digits: 1 }, preset: tiny, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 }",
  ].join("\n"),
);
const runsDir = join(out, "runs");
const args = ["--max-old-space-size=400", "bin/ooze.mjs", "fuzz", file, "--runs", runs, "--steps", "8", "--horizon", "1500", "--deadline", "90000",
  "--faults", "kill,pause,nats-restart,cut,engine,actor", "--shrink-runs", "2", "--out", runsDir];
// the seed through the environment, so that OOZE_PROPERTY_PATH replays one schedule of it
const env = seed ? { ...process.env, OOZE_PROPERTY_SEED: seed } : process.env;
const child = spawn(process.execPath, args, { stdio: ["ignore", "inherit", "inherit"], env });
const rssMb = () => {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.pid}/status`, "utf8"));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
};
const lastRun = () => {
  try {
    return readdirSync(runsDir).filter((d) => d.startsWith("run-")).sort((a, b) => Number(a.slice(4)) - Number(b.slice(4))).at(-1) ?? "none";
  } catch {
    return "none";
  }
};
const watch = setInterval(() => console.error(`[oom-hunt] child rss ${rssMb().toFixed(0)} MB, last run ${lastRun()}`), 5_000);
child.on("exit", (code, signal) => {
  clearInterval(watch);
  console.error(`[oom-hunt] ooze fuzz exited (code ${code}, signal ${signal}); last run ${lastRun()}`);
  process.exit(code ?? 1);
});
