// Property (ooze/testing's `command` fault): a training job (runJobSchedule, with the faulty command
// as a target of the test's own) whose episodes run a black-box agent command
// (test/fixtures/agents/segments.mjs through the gateway), wrapped by createFaultyCommand,
// under schedules that make the command crash (exit 1 at once) or hang (never exit; the episode's
// 10 s timeout kills its process group — not less: an agent's start takes seconds on a loaded 2-core
// machine, and a healthy call timed out would fail its episode). Every episode is trained or
// dropped exactly once (everyEpisodeOnce), versions only increase, every trained token is one the
// engine sampled (split trajectories included), no actor is left crashed, the job finishes within its
// deadline (a hung command does not hang the job), and — an invariant of this test written over the
// job's metrics and the command's call log — episodes fail only when their command met a fault, and
// every faulted call failed its episode. Runs: propertyRuns(2).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  checkSchedules,
  createFaultyCommand,
  noFailedSamples,
  propertyRuns,
  readJsonLines,
  runJobSchedule,
  type Invariant,
  type MetricsLine,
} from "../harness/index.ts";

const RUNS = propertyRuns(2);
const DEADLINE_MS = 120_000;
const root = mkdtempSync(join(tmpdir(), "ooze-command-schedules-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const fixtures = resolve("test/fixtures/agents");
const tally = { schedules: 0, ok: 0, crash: 0, hang: 0 };
afterAll(() => void process.stdout.write(`command schedules: ${tally.schedules} schedules, agent calls ${tally.ok} ok, ${tally.crash} crashed, ${tally.hang} hung\n`));

describe("agent commands that crash or hang (ooze/testing)", () => {
  it("failed episodes are dropped once, the job never hangs, and only faulted calls fail", { timeout: 60_000 + RUNS * 150_000 }, async () => {
    let n = 0;
    const result = await checkSchedules(
      { kinds: ["command"], commands: ["agent"], horizonMs: 2_500, maxForMs: 1_500, maxFaults: 3 },
      async (schedule) => {
        const dir = join(root, `case-${n++}`);
        // The wrapper in a directory of its own, writable from the agent's sandbox (its call log).
        const cmdDir = join(root, `command-${n}`);
        mkdirSync(cmdDir);
        const cmd = createFaultyCommand(cmdDir, `agent-${n}`);
        const agent = cmd.wrap(join(fixtures, "segments.mjs"));
        const file = join(root, `agent-${n}.yaml`);
        writeFileSync(
          file,
          [
            "name: command-schedules",
            "actors: [{ name: trainer, kind: train.trainer }]",
            "engines: { count: 1 }",
            "train:",
            `  task: ${JSON.stringify(join(fixtures, "segments-task.ts"))}`,
            `  agent: { command: ${JSON.stringify(agent.command)}, args: ${JSON.stringify(agent.args)}, timeoutS: 10, killGraceS: 0.5, maxSegments: 3, sandbox: { writablePaths: [${JSON.stringify(cmdDir)}] } }`,
            "  preset: tiny",
            "  steps: 4",
            "  promptsPerStep: 2",
            "  samplesPerPrompt: 2",
            "  lr: 0.001",
          ].join("\n"),
        );
        const deadlineMs = DEADLINE_MS;
        /** Written over the job's metrics.jsonl and the wrapper's call log: failed episodes ⇔ faulted calls. */
        const onlyFaultedCallsFail: Invariant = {
          name: "episodes fail exactly when their command met a fault",
          check(job) {
            const calls = cmd.stats();
            const failed = readJsonLines<MetricsLine>(join(job.dir, "metrics.jsonl")).reduce((s, m) => s + (m.failed ?? 0), 0);
            const faulted = calls.crash + calls.hang;
            // A faulted call fails its episode: one failed sample (a placeholder) — or more when a hung
            // command had already made its requests; an unfaulted call never does.
            const ok = faulted === 0 ? failed === 0 : failed >= faulted;
            return { ok, detail: `${failed} failed samples; calls ${JSON.stringify(calls)}` };
          },
        };
        // The job's invariants, but for noFailedSamples (a faulted call fails its episode: expected here).
        const report = await runJobSchedule({ topology: file, out: dir, deadlineMs, targets: { commands: { agent: cmd } } }, schedule, (own) => [
          ...own.filter((i) => i !== noFailedSamples),
          onlyFaultedCallsFail,
        ]);
        const calls = cmd.stats();
        tally.schedules++;
        tally.ok += calls.ok;
        tally.crash += calls.crash;
        tally.hang += calls.hang;
        const bad = report.verdicts.filter((v) => !v.ok);
        expect(bad, `schedule ${JSON.stringify(schedule)}\n${report.logs.job?.split("\n").slice(-20).join("\n")}`).toEqual([]);
        expect(readJsonLines<MetricsLine>(join(dir, "metrics.jsonl"))).toHaveLength(4);
      },
      { runs: RUNS, label: "agent command crash/hang in a training job", timeLimitMs: RUNS * 150_000 - DEADLINE_MS },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  });
});
