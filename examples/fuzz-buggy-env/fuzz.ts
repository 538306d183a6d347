// The same check as `ooze fuzz`, written with ooze/testing's API: what a user puts in their own
// test suite to run their topology under fault schedules, with an invariant of their own beside
// ooze's. Run it (see README.md beside this file):
//   OOZE_EXAMPLE_BUG=1 node --import tsx examples/fuzz-buggy-env/fuzz.ts --runs 5 --seed 3
// It exits 1 with the smallest failing schedule found, 0 when every schedule held.
import { join } from "node:path";
import { parseArgs } from "node:util";
import { fileURLToPath } from "node:url";
import { checkSchedules, formatReport, readJsonLines, type FaultReport, type Invariant, type MetricsLine } from "ooze/testing";
import { runJobSchedule, type JobUnderTestOptions } from "ooze/testing/job";

const { values } = parseArgs({
  options: { runs: { type: "string", default: "5" }, seed: { type: "string", default: "3" }, "shrink-runs": { type: "string", default: "4" }, out: { type: "string", default: "runs/fuzz-api" } },
});
const topology = fileURLToPath(new URL("topology.yaml", import.meta.url));

/** The user's own invariant, over the job's metrics.jsonl: every step trains its whole batch (3 prompts × 4 samples). */
const fullBatches: Invariant = {
  name: "every step trains 12 samples",
  check(job) {
    const short = readJsonLines<MetricsLine & { samples: number }>(join(job.dir, "metrics.jsonl")).filter((m) => m.samples !== 12);
    return short.length === 0 ? { ok: true, detail: "every step trained 12 samples" } : { ok: false, detail: `short steps: ${short.map((m) => `step ${m.step}: ${m.samples}`).join(", ")}` };
  },
};

let n = 0;
let failing: FaultReport | null = null;
let shrinking = 0;
const options = (): JobUnderTestOptions => ({ topology, out: join(values.out, `run-${n++}`), train: { steps: 4 }, deadlineMs: 120_000 });
const result = await checkSchedules(
  // Engine faults (503s, cut or held-back replies, slow replies, resets) in the first 2.5 s of the ~2.5 s job.
  { kinds: ["engine"], engines: ["engine-0"], horizonMs: 2_500, maxFaults: 3 },
  async (schedule) => {
    // Shrinking bounded (as `ooze fuzz --shrink-runs`): timing decides whether a fault meets an episode.
    if (failing !== null && shrinking++ >= Number(values["shrink-runs"])) return;
    const report = await runJobSchedule(options(), schedule, (own) => [...own, fullBatches]); // ooze's invariants and the user's
    const bad = report.verdicts.filter((v) => !v.ok);
    console.log(`run ${n - 1}: ${schedule.length} fault(s) → ${bad.length === 0 ? "all invariants held" : bad.map((v) => `${v.name}: ${v.detail}`).join("; ")}`);
    if (bad.length > 0) {
      failing = report;
      throw new Error(bad.map((v) => v.name).join("; "));
    }
  },
  { runs: Number(values.runs), seed: Number(values.seed) },
);
if (result.ok) {
  console.log(`${result.runs} schedules, every invariant held`);
} else {
  console.log(`a violation; the smallest failing schedule found (seed ${result.seed}, path ${result.path}):`);
  console.log(formatReport({ ...failing!, schedule: result.schedule ?? failing!.schedule, seed: result.seed, path: result.path }, { logLines: 0 }));
  process.exitCode = 1;
}
