// Scale benchmark (`npm run bench -- scale [--sizes 8,32,128] [--steps N] [--per-engine S]
// [--turn-tokens T] [--train-tps-per-engine R] [--update-ms U] [--catch-up-ms C] [--modes sync,async,fully_async]
// [--max-staleness K] [--late-groups wait|requeue]`):
// the loop as it runs under `ooze train` — the real fleet and cache-aware router, the rollout, buffer,
// trainer and weight-sync actors, their JetStream streams on a real nats-server — against N simulated
// GPU engines (`ooze sim-engine --count N` in a child process: SGLang's API, timing from the H100
// serving model of src/engine/sim/perf-model.ts) and the simulated trainer (train.simulate), on
// heavy-tailed multi-turn agent episodes. OOZE_BENCH_KEEP=1 keeps the runs' directories (metrics.jsonl). For each N: trained samples/s in sync, async and
// fully_async mode, fully_async_vs_sync, the ideal overlap bound and fully_async_vs_bound, and, over
// each mode's measured window, the engines' utilisation (simulated GPU time / wall time), the
// routing's prefix-cache hit rate (cached / prompt tokens at the engines), NATS messages/s (the
// server's in + out), and the controller's CPU per trained sample (this process: every actor, the
// fleet and router, the HTTP clients). Progress on stderr; one JSON line last.
//
// Workload: bench/lib/long-tail-task.ts, prompt i asks for k_i turns (discrete Pareto, alpha 1.0, 1 to
// 16; mean ≈ 3.4) of `turnTokens` sampled tokens (default 128), the environment answering between
// turns; each turn is a /generate of the whole conversation so far (token-in/token-out), its prefix
// cached at the engine the router sends the session to. Per step: `perEngine` samples per engine
// (default 32: 4 prompts × 8 samples each), so the batch grows with the fleet.
//
// Trained samples/s: samples trained in steps 2..N over the wall time from the end of step 1 to the
// end of step N (start-up excluded), as in `bench loop`.
//
// The bound: min(generation, training), each alone, i.e. perfect overlap. Generation: the same
// engines and task with the real fleet (no NATS, no trainer), 2 steps' prompts kept in flight as
// fully_async keeps them (bench/lib/generation-only.ts), rate between the completion of the first
// step's worth of groups and of the N-th, plus one weight update a step (the engines stop for it in
// every mode: a step's samples take batch / rate + update-ms); `bound_without_updates` leaves the
// updates out. Training: the simulated trainer's rate on those samples (stepOverheadMs + tokens /
// tokensPerSecond a step; exact, as it is a timer).
//
// The simulated trainer trains `train-tps-per-engine` × N tokens/s (default 3,000 a engine: the
// trainer is scaled with the fleet, an assumption — roughly one training H100 for every two to
// three inference H100s for an 8B model), 200 ms overhead a step. Weight updates take `update-ms` on
// each engine (default 500 ms, for an 8B model's bf16 weights over NCCL: assumed, not measured).
//
// Caveat: the controller, the nats-server and the simulated engines share this machine's cores (2
// here, shared with other work). The engines make up time lost to a late timer or a descheduled
// process up to `catch-up-ms` (default 1,000 ms) behind their clock; what they could not make up is
// reported as engine_lag_fraction (of their simulated busy time) — where it is not near 0 the
// simulation itself is slower than the serving model says, which slows every mode.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { trainConfigOf } from "../actors/protocol/config.ts";
import { readJsonl, type StepMetrics } from "../actors/protocol/metrics.ts";
import { runTrainJob } from "../app/job/train-job.ts";
import type { SimStats } from "../src/engine/sim/sim-backend.ts";
import { loadTopology } from "../src/topology/load.ts";
import { freePort, startNatsServer } from "../src/transport/nats-server.ts";
import { generationOnly } from "./lib/generation-only.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const sizes = arg("sizes", "8,32,128").split(",").map(Number);
const steps = Number(arg("steps", "4"));
const perEngine = Number(arg("per-engine", "32"));
const samples = 8;
const turnTokens = Number(arg("turn-tokens", "128"));
const tpsPerEngine = Number(arg("train-tps-per-engine", "3000"));
const stepOverheadMs = 200;
const updateMs = Number(arg("update-ms", "500"));
const catchUpMs = Number(arg("catch-up-ms", "1000"));
const modes = arg("modes", "sync,async,fully_async").split(",") as ("sync" | "async" | "fully_async")[];
/**
 * fully_async's staleness bound. The batches take groups in launch order (lateGroups wait), so the
 * trainer waits whenever an episode outlasts bound + 1 steps: the longest here (16 turns, ~45 s on
 * 32 engines) needs 8 at ~5 s a step. With ooze's default, 2, the trainer waits for it (docs/experiments/scale.md).
 */
const maxStaleness = Number(arg("max-staleness", "8"));
const lateGroups = arg("late-groups", "wait") as "wait" | "requeue";
const task = fileURLToPath(new URL("./lib/long-tail-task.ts", import.meta.url));
const taskConfig = { alpha: 1.0, maxTurns: 16, turnTokens };
const OOZE = fileURLToPath(new URL("../bin/ooze.mjs", import.meta.url));
const root = mkdtempSync(join(tmpdir(), "ooze-bench-scale-"));
const say = (s: string) => process.stderr.write(`[bench scale] ${s}\n`);

/** `ooze sim-engine --count n` as a child process; resolves with its URLs. */
async function simEngines(n: number): Promise<{ urls: string[]; pid: number; stop: () => Promise<void> }> {
  const child = spawn(process.execPath, [OOZE, "sim-engine", "--count", String(n), "--update-weights-ms", String(updateMs), "--catch-up-ms", String(catchUpMs), "--parent-pid", String(process.pid)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (out += d));
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`sim-engine did not start within 60 s:\n${out}`)), 60_000);
    const check = () => {
      if (out.includes("ready")) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stderr!.on("data", check);
    void exited.then(() => reject(new Error(`sim-engine exited:\n${out}`)));
  });
  const urls = [...out.matchAll(/^(http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => m[1]!);
  return {
    urls,
    pid: child.pid!,
    stop: async () => {
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/** The engines' counters, summed. */
interface EngineTotals {
  busy: number;
  lag: number;
  prompt: number;
  hit: number;
  steps: number;
  seqs: number;
}

async function engineTotals(urls: readonly string[]): Promise<EngineTotals> {
  const all = await Promise.all(
    urls.map(async (u) => ((await (await fetch(`${u}/server_info`)).json()) as { internal_states: { cache: SimStats }[] }).internal_states[0]!.cache),
  );
  return all.reduce(
    (a, s) => ({ busy: a.busy + s.busySeconds, lag: a.lag + s.lagSeconds, prompt: a.prompt + s.promptTokens, hit: a.hit + s.hitTokens, steps: a.steps + s.decodeSteps, seqs: a.seqs + s.decodeSequences }),
    { busy: 0, lag: 0, prompt: 0, hit: 0, steps: 0, seqs: 0 },
  );
}

/** CPU seconds (user + system) of a process, from /proc (0 where it cannot be read). */
function procCpu(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return 0;
  }
}

interface Snapshot {
  at: number;
  cpu: number;
  sim: number;
  nats: number;
  msgs: number;
  engines: Promise<EngineTotals>;
}

interface ModeFigures {
  sps: number;
  engine_utilisation: number;
  prefix_hit_rate: number;
  nats_msgs_per_s: number;
  controller_cpu_ms_per_sample: number;
  controller_cores: number;
  sim_cores: number;
  nats_cores: number;
  engine_lag_fraction: number;
  mean_decode_batch: number;
  mean_step_s: number;
  staleness_max: number;
}

const natsMonitorPort = await freePort();
const nats = await startNatsServer({ monitorPort: natsMonitorPort });
async function natsMsgs(): Promise<number> {
  const v = (await (await fetch(`http://127.0.0.1:${natsMonitorPort}/varz`)).json()) as { in_msgs: number; out_msgs: number };
  return v.in_msgs + v.out_msgs;
}

async function snapshot(simPid: number, urls: readonly string[]): Promise<Snapshot> {
  const u = process.cpuUsage();
  return { at: performance.now(), cpu: (u.user + u.system) / 1e6, sim: procCpu(simPid), nats: procCpu(nats.pid), msgs: await natsMsgs(), engines: engineTotals(urls) };
}

function topologyFile(n: number, urls: readonly string[], mode: string): string {
  const file = join(root, `scale-${n}-${mode}.yaml`);
  const prompts = Math.max(1, Math.round((perEngine * n) / samples));
  writeFileSync(
    file,
    JSON.stringify({
      name: `scale-${n}-${mode.replace("_", "-")}`,
      actors: [{ name: "rollout", kind: "train.rollout" }],
      engines: { count: 0, urls },
      train: {
        mode, task, taskConfig, preset: "tiny", steps, promptsPerStep: prompts, samplesPerPrompt: samples, checkpointEvery: 1000, maxStaleness, lateGroups,
        simulate: { tokensPerSecond: tpsPerEngine * n, stepOverheadMs },
      },
    }),
  );
  return file;
}

async function runMode(n: number, mode: (typeof modes)[number]): Promise<ModeFigures> {
  const sim = await simEngines(n);
  try {
    const topo = loadTopology(topologyFile(n, sim.urls, mode));
    const { train, engines } = trainConfigOf(topo);
    const out = join(root, `${n}-${mode}`);
    let first: Promise<Snapshot> | null = null;
    let last: Promise<Snapshot> | null = null;
    await runTrainJob({
      topology: topo, train, engines, out, nats: { url: nats.url, token: nats.token }, job: `scale-${n}-${mode.replace("_", "-")}`,
      log: (l) => say(`  ${l}`),
      onStep: (m) => {
        if (m.step === 1) first = snapshot(sim.pid, sim.urls);
        if (m.step === steps) last = snapshot(sim.pid, sim.urls);
      },
    });
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    const a = await first!, b = await last!;
    const ea = await a.engines, eb = await b.engines;
    const wall = (b.at - a.at) / 1000;
    const trained = ms.slice(1).reduce((k, m) => k + m.samples, 0);
    const busy = eb.busy - ea.busy;
    const f: ModeFigures = {
      sps: trained / (ms.at(-1)!.seconds - ms[0]!.seconds),
      engine_utilisation: busy / (n * wall),
      prefix_hit_rate: (eb.hit - ea.hit) / Math.max(1, eb.prompt - ea.prompt),
      nats_msgs_per_s: (b.msgs - a.msgs) / wall,
      controller_cpu_ms_per_sample: ((b.cpu - a.cpu) * 1000) / trained,
      controller_cores: (b.cpu - a.cpu) / wall,
      sim_cores: (b.sim - a.sim) / wall,
      nats_cores: (b.nats - a.nats) / wall,
      engine_lag_fraction: (eb.lag - ea.lag) / Math.max(1e-9, busy),
      mean_decode_batch: (eb.seqs - ea.seqs) / Math.max(1, eb.steps - ea.steps),
      mean_step_s: ms.slice(1).reduce((k, m) => k + m.step_seconds, 0) / (ms.length - 1),
      staleness_max: Math.max(...ms.map((m) => m.staleness_max)),
    };
    say(
      `N=${n} ${mode}: ${f.sps.toFixed(1)} samples/s (step ${f.mean_step_s.toFixed(2)} s), engines ${(100 * f.engine_utilisation).toFixed(0)} % busy, prefix hits ${(100 * f.prefix_hit_rate).toFixed(0)} %, ` +
        `NATS ${f.nats_msgs_per_s.toFixed(0)} msgs/s, controller ${f.controller_cpu_ms_per_sample.toFixed(2)} ms CPU/sample (${f.controller_cores.toFixed(2)} cores), sim ${f.sim_cores.toFixed(2)} cores, lag ${(100 * f.engine_lag_fraction).toFixed(1)} %, mean decode batch ${f.mean_decode_batch.toFixed(1)}`,
    );
    return f;
  } finally {
    await sim.stop();
  }
}

async function bound(n: number): Promise<Record<"generation_only" | "generation_with_updates" | "training_only" | "bound" | "bound_without_updates" | "tokens_per_sample", number>> {
  const sim = await simEngines(n);
  try {
    const prompts = Math.max(1, Math.round((perEngine * n) / samples));
    const g = await generationOnly({
      urls: sim.urls, task, taskConfig, baseDir: process.cwd(), samplesPerPrompt: samples,
      window: 2 * prompts, total: (steps + 1) * prompts, skip: prompts, upto: steps * prompts,
    });
    const all = g.groups.flat();
    const tokensPerSample = all.reduce((k, s) => k + s.tokens.length, 0) / all.length;
    const batch = prompts * samples;
    const stepSeconds = stepOverheadMs / 1000 + (batch * tokensPerSample) / (tpsPerEngine * n);
    const trainingOnly = batch / stepSeconds;
    // Every step's new version stops every engine for one weight update, whatever the overlap.
    const generationWithUpdates = batch / (batch / g.sps + updateMs / 1000);
    const b = Math.min(generationWithUpdates, trainingOnly);
    say(`N=${n} bound ${b.toFixed(1)}: generation only ${g.sps.toFixed(1)} samples/s (${generationWithUpdates.toFixed(1)} with a weight update a step), training only ${trainingOnly.toFixed(1)} samples/s (${tokensPerSample.toFixed(0)} tokens a sample)`);
    return {
      generation_only: g.sps, generation_with_updates: generationWithUpdates, training_only: trainingOnly, bound: b,
      bound_without_updates: Math.min(g.sps, trainingOnly), tokens_per_sample: tokensPerSample,
    };
  } finally {
    await sim.stop();
  }
}

const load0 = loadavg()[0]!;
say(`sizes ${sizes.join(", ")}; ${steps} steps of ${perEngine} samples per engine (8 per prompt); turns of ${turnTokens} tokens; trainer ${tpsPerEngine} tokens/s per engine; weight update ${updateMs} ms; ${availableParallelism()} cores, load ${load0.toFixed(2)}`);
const result: Record<string, unknown> = { bench: "scale", steps, per_engine: perEngine, turn_tokens: turnTokens, train_tps_per_engine: tpsPerEngine, update_ms: updateMs, catch_up_ms: catchUpMs, max_staleness: maxStaleness, late_groups: lateGroups, cores: availableParallelism(), load_before: load0 };
const bySize: Record<string, unknown> = {};
try {
  for (const n of sizes) {
    const figures: Partial<Record<(typeof modes)[number], ModeFigures>> = {};
    for (const mode of modes) figures[mode] = await runMode(n, mode);
    const b = await bound(n);
    const fa = figures.fully_async?.sps ?? NaN;
    const row = {
      ...Object.fromEntries(modes.map((m) => [m, figures[m]!.sps])),
      fully_async_vs_sync: fa / (figures.sync?.sps ?? NaN),
      ...b,
      fully_async_vs_bound: fa / b.bound,
      engine_utilisation: Object.fromEntries(modes.map((m) => [m, figures[m]!.engine_utilisation])),
      prefix_hit_rate: Object.fromEntries(modes.map((m) => [m, figures[m]!.prefix_hit_rate])),
      nats_msgs_per_s: Object.fromEntries(modes.map((m) => [m, figures[m]!.nats_msgs_per_s])),
      controller_cpu_ms_per_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.controller_cpu_ms_per_sample])),
      controller_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.controller_cores])),
      sim_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.sim_cores])),
      nats_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.nats_cores])),
      engine_lag_fraction: Object.fromEntries(modes.map((m) => [m, figures[m]!.engine_lag_fraction])),
      mean_decode_batch: Object.fromEntries(modes.map((m) => [m, figures[m]!.mean_decode_batch])),
    };
    say(`N=${n}: fully_async_vs_sync ${row.fully_async_vs_sync.toFixed(2)}, fully_async_vs_bound ${row.fully_async_vs_bound.toFixed(2)}`);
    bySize[String(n)] = row;
  }
} finally {
  await nats.stop();
  if (process.env.OOZE_BENCH_KEEP) say(`run directories kept in ${root}`);
  else rmSync(root, { recursive: true, force: true });
}
result.sizes = bySize;
result.load_after = loadavg()[0]!;
console.log(JSON.stringify(result));
// Watches of the finished jobs' KV buckets may still retry on their closed connections (they keep the
// process alive and print ClosedConnectionError): the figures are out, so exit.
process.exit(0);
