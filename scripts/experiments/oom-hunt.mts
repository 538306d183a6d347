// Hunts a heap blow-up in a job under fault schedules (docs/reliability.md, finding 19): runs the
// fully_async job of test/property/job-schedules.test.ts under `ooze fuzz`'s runner for RUNS
// schedules, printing this process's heap every 5 s; past 700 MB it prints the most frequent shapes of
// the runner's lines and writes a heap snapshot. A loop that starves the timers silences the watch
// itself: a process that dies with its last heap line low had such a loop (finding 19's did). Run it
// under `--max-old-space-size` so that a blow-up ends soon.
// `node --max-old-space-size=400 --import tsx scripts/experiments/oom-hunt.mts RUNS OUTDIR [SEED]`
// (OOZE_PROPERTY_PATH=N with SEED replays the N-th schedule).
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeHeapSnapshot } from "node:v8";
import { fuzzSummary, runFuzz } from "../../app/job/fuzz-job.ts";

const runs = Number(process.argv[2] ?? 10);
const out = process.argv[3] ?? "/tmp/oom";
mkdirSync(out, { recursive: true });
if (process.argv[4]) process.env.OOZE_PROPERTY_SEED = process.argv[4];
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
const shapes = new Map<string, number>();
let count = 0;
const recent: string[] = [];
const top = () => [...shapes.entries()].sort((a, b) => b[1] - a[1]).slice(0, 12).map(([s, n]) => `${n}× ${s.slice(0, 300)}`).join("\n");
let dumped = false;
const watch = setInterval(() => {
  const heap = process.memoryUsage().heapUsed / 2 ** 20;
  console.error(`[oom-hunt] heap ${heap.toFixed(0)} MB, ${count} log lines`);
  if (heap > 700 && !dumped) {
    dumped = true;
    console.error(`[oom-hunt] HEAP HIGH; top line shapes:\n${top()}\nlast lines:\n${recent.slice(-40).join("\n")}`);
    writeFileSync(join(out, "shapes.txt"), top() + "\n---\n" + recent.join("\n"));
    console.error(`[oom-hunt] snapshot ${writeHeapSnapshot(join(out, "heap.heapsnapshot"))}`);
  }
}, 5_000);
const r = await runFuzz({
  file,
  runs,
  faults: ["kill", "pause", "nats-restart", "cut", "engine", "actor"],
  steps: 8,
  horizonMs: 1_500,
  deadlineMs: 90_000,
  out: join(out, "runs"),
  shrinkRuns: 2,
  label: "oom hunt (fully_async)",
  log: (l) => {
    count++;
    const s = l.replace(/^\d+ ms /, "").replace(/[0-9a-f]{8,}/g, "H").replace(/\d+/g, "N");
    shapes.set(s, (shapes.get(s) ?? 0) + 1);
    recent.push(l);
    if (recent.length > 2000) recent.splice(0, 1000);
  },
});
clearInterval(watch);
console.error(fuzzSummary(r));
console.error(`top shapes:\n${top()}`);
process.exit(r.ok ? 0 : 1);
