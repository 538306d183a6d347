// Fail-over benchmark (`npm run bench -- failover [--runs N] [--steps S] [--kill-after K] [--server-log] [--trace]`): how long a
// training job across three node processes stalls when one of its three NATS servers dies. Each run
// starts a fresh three-server cluster (src/testing/nats-cluster.ts), runs a small sync training job
// with `ooze up --nats URL1,URL2,URL3` (rollout, buffer and learner in three processes, every stream
// and bucket with 3 replicas), SIGKILLs the server leading the samples stream after step K, and
// times the job's steps from its log. The stall is the step interval the kill fell in, less the
// median interval of the steps before it (the job's own pace on this machine, measured in the same
// run). Also the time lost in all: from the step before the kill to the last step, less the pace
// for those steps (a job whose steps stay slow after the stall loses more than the stall). The job's warnings during the stall are kept, to read where the time went (with
// --server-log, also when the surviving servers elected new leaders for the job's streams and
// consumers, from their logs). One JSON line
// last: the stalls, their p50 and p90, and each run's job exit status.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jobNames } from "../src/transport/names.ts";
import { connectBus } from "../src/transport/bus.ts";
import { startTestNatsCluster } from "../src/testing/nats-cluster.ts";

const args = process.argv.slice(2);
const opt = (name: string, d: number) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : d;
};
const runs = opt("runs", 10);
const steps = opt("steps", 10);
const killAfter = opt("kill-after", 4);
// --trace: every line the job prints after the kill (with OOZE_DEBUG=1), not only its warnings
const trace = args.includes("--trace");
const say = (m: string) => process.stderr.write(`[bench failover] ${m}\n`);

interface RunResult {
  stallS: number | null;
  /** From the step before the kill to the job's last step, less the job's pace for those steps: all the time the fault cost, a slowed tail included. */
  lostS: number | null;
  paceS: number;
  exit: number | null;
  warnings: string[];
}

async function once(run: number): Promise<RunResult> {
  const dir = mkdtempSync(join(tmpdir(), "ooze-bench-failover-"));
  const cluster = await startTestNatsCluster({ size: 3 });
  const job = `failover-${process.pid}-${run}`;
  try {
    const file = join(dir, "train.yaml");
    writeFileSync(
      file,
      `name: failover
hosts: [{ name: rollout }, { name: learner }, { name: buffer }]
actors:
  - { name: rollout, kind: train.rollout, placement: rollout }
  - { name: fleet, kind: fleet, placement: learner, config: { embedded: { count: 1, preset: tiny, maxRunning: 32, cacheTokens: 4096 } } }
  - { name: buffer, kind: train.buffer, placement: buffer }
  - { name: trainer, kind: train.trainer, placement: learner, config: { out: ${JSON.stringify(join(dir, "run"))} } }
  - { name: weight-sync, kind: train.weight-sync, placement: learner }
train: { mode: sync, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${steps}, promptsPerStep: 3, samplesPerPrompt: 4, checkpointEvery: 100 }
`,
    );
    const child = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", job, "--nats", cluster.authUrls], {
      env: { ...process.env, OOZE_HOME: dir, ...(trace ? { OOZE_DEBUG: "1" } : {}) },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const stepAt: number[] = [];
    let killedAt: number | null = null;
    let killedWall = 0;
    const warnings: string[] = [];
    let killing: Promise<void> | null = null;
    const onLine = (line: string) => {
      const at = performance.now();
      if (/trainer: step \d+\//.test(line)) {
        stepAt.push(at);
        if (stepAt.length === killAfter && !killing) killing = kill();
      } else if (killedAt !== null && (trace || /warn|error|timed out|retry/i.test(line))) warnings.push(`+${((at - killedAt) / 1000).toFixed(1)} s ${line.slice(0, 240)}`);
    };
    const kill = async () => {
      const bus = await connectBus({ url: cluster.authUrls });
      try {
        const info = await (await bus.jsm()).streams.info(jobNames(job).streamSamples);
        const leader = info.cluster?.leader ?? "";
        const victim = Math.max(0, cluster.servers.findIndex((_, i) => leader.endsWith(`-s${i + 1}`)));
        killedAt = performance.now();
        cluster.servers[victim]!.kill("SIGKILL");
        killedWall = Date.now();
        say(`run ${run}: SIGKILLed server ${victim + 1} (the samples stream's leader) after step ${stepAt.length}`);
      } finally {
        await bus.close();
      }
    };
    let buf = "";
    const feed = (d: Buffer) => {
      buf += d.toString();
      const lines = buf.split("\n");
      buf = lines.pop()!;
      lines.forEach(onLine);
    };
    child.stdout!.on("data", feed);
    child.stderr!.on("data", feed);
    const deadline = setTimeout(() => child.kill("SIGKILL"), 600_000);
    const exit = await new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
    clearTimeout(deadline);
    await killing;
    const intervals = stepAt.slice(1).map((t, i) => (t - stepAt[i]!) / 1000);
    const before = intervals.slice(0, killAfter - 1).sort((a, b) => a - b);
    const paceS = before[Math.floor(before.length / 2)] ?? NaN;
    // the interval that holds the kill: from the step before it to the first step after it
    const after = killedAt === null ? -1 : stepAt.findIndex((t) => t > killedAt!);
    const stallS = after > 0 ? (stepAt[after]! - stepAt[after - 1]!) / 1000 - paceS : null;
    const lostS = after > 0 ? (stepAt.at(-1)! - stepAt[after - 1]!) / 1000 - paceS * (stepAt.length - after) : null;
    say(`run ${run}: exit ${exit}, ${stepAt.length} steps, pace ${paceS.toFixed(2)} s a step, stall ${stallS?.toFixed(1) ?? "-"} s, lost in all ${lostS?.toFixed(1) ?? "-"} s`);
    for (const w of warnings.slice(0, trace ? 400 : 12)) say(`  ${w}`);
    if (args.includes("--server-log")) {
      // When the surviving servers elected new leaders for the job's streams and consumers, from their logs.
      const elected: [number, string][] = [];
      cluster.servers.forEach((sv, i) => {
        if (!sv.running) return;
        for (const l of sv.logTail().split("\n")) {
          const m = /(\d{4})\/(\d\d)\/(\d\d) (\d\d:\d\d:\d\d\.\d+) \[INF\] JetStream cluster (new (?:stream|consumer) leader .*)/.exec(l);
          if (!m) continue;
          const t = Date.parse(`${m[1]}-${m[2]}-${m[3]}T${m[4]!.slice(0, 12)}Z`);
          if (t >= killedWall) elected.push([(t - killedWall) / 1000, `server ${i + 1}: ${m[5]}`]);
        }
      });
      for (const [t, l] of elected.sort((a, b) => a[0] - b[0])) say(`  elected +${t.toFixed(1)} s ${l}`);
    }

    return { stallS, lostS, paceS, exit, warnings };
  } finally {
    await cluster.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

const results: RunResult[] = [];
for (let r = 1; r <= runs; r++) results.push(await once(r));
const stalls = results.map((r) => r.stallS).filter((s): s is number => s !== null).sort((a, b) => a - b);
const q = (p: number) => (stalls.length ? Number(stalls[Math.min(stalls.length - 1, Math.ceil(p * stalls.length) - 1)]!.toFixed(1)) : null);
console.log(
  JSON.stringify({
    bench: "failover",
    runs,
    steps,
    kill_after_step: killAfter,
    stall_s: results.map((r) => (r.stallS === null ? null : Number(r.stallS.toFixed(1)))),
    stall_p50_s: q(0.5),
    stall_p90_s: q(0.9),
    stall_max_s: stalls.at(-1) === undefined ? null : Number(stalls.at(-1)!.toFixed(1)),
    lost_s: results.map((r) => (r.lostS === null ? null : Number(r.lostS.toFixed(1)))),
    pace_s: Number((results.reduce((n, r) => n + r.paceS, 0) / results.length).toFixed(2)),
    exits: results.map((r) => r.exit),
    goal: "stall_p90_s <= 10",
  }),
);
