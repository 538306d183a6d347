// `ooze fuzz FILE [--runs N] [--seed S] [--faults kill,pause,…] [--replay PATH]`: the topology's
// training job run under fault schedules (app/job/fuzz-job.ts); prints the minimal failing schedule
// with the command that replays it and exits 1 on a violated invariant.
import type { Command } from "commander";
import { OozeError } from "../../../src/errors.ts";
import { FAULT_KINDS, type FaultKind } from "../../../src/testing/faults.ts";
import { int } from "./rollout.ts";

interface FuzzCliOptions {
  runs: string;
  seed?: string;
  faults: string;
  replay?: string;
  steps: string;
  set?: string[];
  horizon: string;
  deadline: string;
  out: string;
  shrinkRuns?: string;
  verbose?: boolean;
}

export function register(program: Command) {
  program
    .command("fuzz")
    .description("run the topology's training job under fault schedules and check its invariants (every sample once, versions increase, staleness bound, no hang)")
    .argument("<file>", "topology YAML file with a train: section")
    .option("--runs <n>", "schedules to try", "10")
    .option("--seed <s>", "fast-check seed (reproduces the schedules of a run)")
    .option("--faults <kinds>", `fault kinds to draw from (${FAULT_KINDS.join(",")})`, FAULT_KINDS.join(","))
    .option("--replay <path>", "replay the schedule of a report.json (or a schedule file) once")
    .option("--steps <n>", "override train.steps (small jobs let many schedules fit)", "3")
    .option("--set <field=value>", "override any field of train: or engines: (repeatable; value as YAML), as ooze train takes it: e.g. --set train.promptsPerStep=2 fuzzes a big topology's paths with small steps", (v: string, prev: string[] = []) => [...prev, v])
    .option("--horizon <ms>", "faults start within this many ms of the job's start", "10000")
    .option("--deadline <ms>", "a job still running after this long is stopped and counts as a hang", "120000")
    .option("--out <dir>", "where the runs and report.json go", "runs/fuzz")
    .option("--shrink-runs <n>", "most job runs spent shrinking a failing schedule (default: until fast-check is done)")
    .option("--verbose", "print a line per run")
    .action(async (file: string, opts: FuzzCliOptions) => {
      const kinds = opts.faults.split(",").map((k) => k.trim()).filter(Boolean);
      const unknown = kinds.filter((k) => !(FAULT_KINDS as readonly string[]).includes(k));
      if (unknown.length > 0 || kinds.length === 0)
        throw new OozeError("CONFIG_INVALID", `--faults: unknown fault kind(s) '${unknown.join(",") || opts.faults}'; choose from ${FAULT_KINDS.join(", ")}`);
      const { runFuzz, fuzzSummary } = await import("../../job/fuzz-job.ts");
      const r = await runFuzz({
        file,
        runs: int("runs", opts.runs, 1),
        ...(opts.seed !== undefined ? { seed: int("seed", opts.seed, -(2 ** 31)) } : {}),
        faults: kinds as FaultKind[],
        ...(opts.replay !== undefined ? { replay: opts.replay } : {}),
        steps: int("steps", opts.steps, 1),
        settings: opts.set ?? [],
        horizonMs: int("horizon", opts.horizon, 1),
        deadlineMs: int("deadline", opts.deadline, 1),
        out: opts.out,
        ...(opts.shrinkRuns !== undefined ? { shrinkRuns: int("shrink-runs", opts.shrinkRuns, 0) } : {}),
        label: `ooze fuzz ${file}`,
        log: opts.verbose ? (l) => process.stderr.write(`${l}\n`) : () => {},
      });
      console.log(fuzzSummary(r));
      if (!r.ok) process.exitCode = 1;
    });
}
