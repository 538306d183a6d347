// Scale benchmark (`npm run bench -- scale [--sizes 8,32,128] [--warmup W] [--window S] [--per-engine S]
// [--controllers K|K1,K2,..] [--sim-processes P|P1,P2,..] [--slowdown S|S1,S2,..]
// [--turn-tokens T] [--train-tps-per-engine R] [--update-ms U] [--catch-up-ms C] [--modes sync,async,fully_async]
// [--max-staleness K] [--inflight-steps F] [--late-groups wait|requeue] [--keep-cache] [--pause-in-place]
// [--max-turns K]`):
// the loop as it runs under `ooze train` — the real fleet and cache-aware router, the rollout, buffer,
// trainer and weight-sync actors, their JetStream streams on a real nats-server — against N simulated
// GPU engines (`ooze sim-engine --count N` in a child process: SGLang's API, timing from the H100
// serving model of src/engine/sim/perf-model.ts) and the simulated trainer (train.simulate), on
// heavy-tailed multi-turn agent episodes. OOZE_BENCH_KEEP=1 keeps the runs' directories (metrics.jsonl)
// and each child process's whole output (child-*.log in the bench's root directory);
// OOZE_BENCH_CPU_PROF=DIR has the rollout node processes write V8 CPU profiles there (node --cpu-prof;
// bench/lib/profile-window.mjs compares two runs' windows, cut with the step lines' monotonic times;
// run the bench itself under `node --cpu-prof` for the job's process). For each N: trained samples/s in sync, async and
// fully_async mode, fully_async_vs_sync, the ideal overlap bound and fully_async_vs_bound, and, over
// each mode's measured window, the engines' utilisation (simulated GPU time / wall time), the
// routing's prefix-cache hit rate (cached / prompt tokens at the engines), NATS messages/s (the
// server's in + out), and the controller's CPU per trained sample (this process: every actor, the
// fleet and router, the HTTP clients), also as a multiple of a CPU gauge read beside the window
// (bench/lib/cpu.ts: this machine's CPU time for the same work varies up to 2× over a day).
// Progress on stderr; one JSON line last.
//
// Workload: bench/lib/long-tail-task.ts, prompt i asks for k_i turns (discrete Pareto, alpha 1.0, 1 to
// `--max-turns`, default 16; mean ≈ 3.4) of `turnTokens` sampled tokens (default 128), the environment answering between
// turns; each turn is a /generate of the whole conversation so far (token-in/token-out), its prefix
// cached at the engine the router sends the session to. Per step: `perEngine` samples per engine
// (default 32: 4 prompts × 8 samples each), so the batch grows with the fleet.
//
// Controller processes: the rollout runs as K actors, each in its own `ooze node` process (hosts
// `start: external` of the job; actors/rollout/shard.ts gives each a share of the engines), beside
// the job's own process (fleet, buffer, trainer, weight sync). `--controllers` takes one K for every
// size or one per size; default ceil(N / 128). The simulated engines run in `--sim-processes` child
// processes (default ceil(N / 128): each process holds a socket for every sequence its engines run,
// and 256 engines of 64 sequences each ran one out of file descriptors).
//
// Slowdown: a fleet of N GPUs makes samples faster than this machine's two cores can route them (the
// controller, the simulated engines and nats-server together spend about CPU_S_PER_SAMPLE of CPU a
// sample). The bench therefore runs a size on a clock S times slower: engines decode and prefill S
// times slower and take S times longer for a weight update, the simulated trainer trains S times
// slower, and the timeouts and health checks that count in engine time are S times longer. Every
// ratio (fully_async_vs_sync, _vs_bound, CPU per sample) is that of the real-speed fleet as long as
// the machine keeps up with the slowed one; samples/s are on the slowed clock (× S for real time).
// Default S: enough that the sizes' samples need at most half the cores. A weight update then takes
// update-ms × S: the fleet's deadline on a control request (`controlTimeoutMs`) and the weight-sync's
// on an update of the whole fleet (`updateTimeoutMs`) are raised to match (until Nov 30 they stayed at
// 30 s, which capped S at 40).
//
// Steady state: each mode trains `warmup` steps and then a window of `window` steps; its figures are
// over that window. Defaults: fully_async max-staleness + 1 and 3 × max-staleness (at least 3); sync
// and async, whose staleness is at most 0 and 1, 1 and 2 steps of warm-up, a window of 3. Samples
// trained in it over its wall time, and samples generated in it (the samples stream's groups published
// meanwhile × 8), which must agree with the trained ones within 10 % for the window to be steady. The
// job is set to train bound + 1 steps more than warm-up and window and is stopped when the window ends:
// a job launches no prompt its remaining steps cannot train, so in its last bound + 1 steps generation
// tapers off and the trainer eats what is left (until Nov 30 the window ended at the job's last step,
// and fully_async's generated samples fell ~30 % short of the trained ones for that reason alone).
//
// The bound: min(generation, training), each alone, i.e. perfect overlap. Generation: the same
// engines and task with the real fleet (no NATS, no trainer), as many prompt groups kept in flight as
// fully_async may generate at once (bench/lib/generation-only.ts), rate between the completion of the
// first step's worth of groups and of the 7th, plus one weight update a step (the engines stop for it in
// every mode: a step's samples take batch / rate + update-ms); `bound_without_updates` leaves the
// updates out. Training: the simulated trainer's rate on those samples (stepOverheadMs + tokens /
// tokensPerSecond a step; exact, as it is a timer).
// The training rate is per sample of that run's mix of episode lengths; a window that drew longer or
// shorter episodes trains fewer or more samples a second at the same trainer time, so fully_async_vs_bound
// may read above 1 or low at small sizes (256 samples a step at 8 engines). `trainer_busy` (the trainer's
// own time over the window's wall time) does not depend on the mix: 1 when the trainer never waits.
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
import { createWriteStream, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { trainConfigOf } from "../actors/protocol/config.ts";
import { readJsonl, type StepMetrics } from "../actors/protocol/metrics.ts";
import { runTrainJob } from "../app/job/train-job.ts";
import type { SimStats } from "../src/engine/sim/sim-backend.ts";
import { loadTopology } from "../src/topology/load.ts";
import { freePort, startNatsServer } from "../src/transport/nats-server.ts";
import { jobNames } from "../src/transport/names.ts";
import { H100_LLAMA_8B } from "../src/engine/sim/perf-model.ts";
import { cpuGaugeMs, processCpuSeconds } from "./lib/cpu.ts";
import { generationOnly } from "./lib/generation-only.ts";
import { slowFleet, slowKeepAlive } from "./lib/slow-clock.ts";
import { setMaxIdleMs } from "../src/engine/http.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const sizes = arg("sizes", "8,32,128").split(",").map(Number);
const warmupArg = arg("warmup", "");
const windowArg = arg("window", "");
const controllersArg = arg("controllers", "");
const simProcessesArg = arg("sim-processes", "");
const perEngine = Number(arg("per-engine", "32"));
const samples = 8;
const turnTokens = Number(arg("turn-tokens", "128"));
const tpsPerEngine = Number(arg("train-tps-per-engine", "3000"));
const stepOverheadMs = 200;
const updateMs = Number(arg("update-ms", "500"));
const catchUpMs = Number(arg("catch-up-ms", "1000"));
/** `--modes none` measures the bound alone (to recompute it for a mode run made before). */
const modesArg = arg("modes", "sync,async,fully_async");
const modes = (modesArg === "none" ? [] : modesArg.split(",")) as ("sync" | "async" | "fully_async")[];
/**
 * fully_async's staleness bound. The batches take groups in launch order (lateGroups wait), so the
 * trainer waits whenever an episode outlasts bound + 1 steps: the longest here (16 turns, ~45 s on
 * 32 engines) needs 8 at ~5 s a step. With ooze's default, 2, the trainer waits for it (docs/experiments/scale.md).
 */
const maxStaleness = Number(arg("max-staleness", "8"));
const lateGroups = arg("late-groups", "wait") as "wait" | "requeue";
/**
 * `--inflight-steps F`: fully_async generates at most F steps' worth of prompt groups at once
 * (train.maxInflightGroups = F × promptsPerStep); unset, ooze's default, max-staleness steps' worth.
 * A large bound leaves room for complete groups to wait behind a long episode; this keeps it from
 * also launching that many groups at once.
 */
const inflightSteps = arg("inflight-steps", "") === "" ? null : Number(arg("inflight-steps", ""));
/** `--keep-cache`: train.keepCacheOnUpdate, the engines' prefix caches kept across weight updates (no re-prefill of episodes in flight). */
const keepCache = process.argv.includes("--keep-cache");
/** `--pause-in-place`: train.pauseOnUpdate in_place (with --keep-cache), the running requests kept across weight updates instead of aborted and dispatched again. */
const pauseInPlace = process.argv.includes("--pause-in-place");
if (pauseInPlace && !keepCache) throw new Error("--pause-in-place needs --keep-cache (train.pauseOnUpdate: in_place keeps the running requests' KV)");
/** A mode's warm-up and window steps, the step the window ends at, and the steps its job is set to train (stopped at `end`). */
function planOf(mode: string): { warmup: number; window: number; end: number; steps: number } {
  const bound = mode === "fully_async" ? maxStaleness : mode === "async" ? 1 : 0;
  const warmup = warmupArg ? Number(warmupArg) : bound + 1;
  const window = windowArg ? Number(windowArg) : Math.max(3, 3 * bound);
  return { warmup, window, end: warmup + window, steps: warmup + window + bound + 1 };
}
/** Steps' worth of prompts the generation-only rate is measured over (start-up and tail excluded). */
const boundSteps = 6;
/**
 * Prompt groups the generation-only run keeps in flight: as many as fully_async may generate at once
 * (its maxInflightGroups: `--inflight-steps` steps' worth, or ooze's default, max-staleness steps'
 * worth). Until Nov 30 it kept 2 steps' worth whatever fully_async kept. With more sequences at once
 * the engines decode larger batches and make more samples a second, so the bound was low whenever
 * fully_async kept more in flight (it read 1.43 at 32 engines with 8 samples an engine).
 */
const boundInflightSteps = inflightSteps ?? Math.max(1, maxStaleness);
/** A per-size setting: one value for every size, or one per size (in --sizes order); else the default. */
function perSize(value: string, n: number, fallback: (n: number) => number): number {
  if (!value) return fallback(n);
  const xs = value.split(",").map(Number);
  return xs.length === 1 ? xs[0]! : xs[sizes.indexOf(n)] ?? fallback(n);
}
const controllersOf = (n: number) => Math.max(1, perSize(controllersArg, n, (k) => Math.ceil(k / 128)));
const slowdownArg = arg("slowdown", "");
/** CPU seconds a sample costs all processes together on this machine (measured at N = 8 and 32: 9–10 ms). */
const CPU_S_PER_SAMPLE = 0.012;
const slowdownOf = (n: number) =>
  Math.max(1, perSize(slowdownArg, n, (k) => Math.ceil(((k * tpsPerEngine) / (4 * turnTokens)) * CPU_S_PER_SAMPLE / (0.5 * availableParallelism()))));
const simProcessesOf = (n: number) => Math.max(1, perSize(simProcessesArg, n, (k) => Math.ceil(k / 128)));
const task = fileURLToPath(new URL("./lib/long-tail-task.ts", import.meta.url));
const taskConfig = { alpha: 1.0, maxTurns: Number(arg("max-turns", "16")), turnTokens };
const OOZE = fileURLToPath(new URL("../bin/ooze.mjs", import.meta.url));
const root = mkdtempSync(join(tmpdir(), "ooze-bench-scale-"));
const say = (s: string) => process.stderr.write(`[bench scale] ${s}\n`);

interface Child {
  pid: number;
  out: () => string;
  /** Whether it has exited. */
  gone: () => boolean;
  stop: () => Promise<void>;
}

/** A child process of ours; resolves once its output shows `ready` (the whole output so far is passed on). */
async function child(args: string[], ready: (out: string) => boolean, what: string, env: Record<string, string> = {}): Promise<Child> {
  const prof = process.env.OOZE_BENCH_CPU_PROF && args[0] === "node" ? ["--cpu-prof", `--cpu-prof-dir=${process.env.OOZE_BENCH_CPU_PROF}`] : [];
  const c = spawn(process.execPath, [...prof, OOZE, ...args, "--parent-pid", String(process.pid)], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  // The output's last 64 KiB (for errors); the readiness check stops listening once it passed. It
  // once stayed on and searched the whole growing output at every chunk: in a long run, 15 % of this
  // process's CPU, which the bench counts as the controller's (Nov 30).
  let out = "";
  const log = process.env.OOZE_BENCH_KEEP ? createWriteStream(join(root, `child-${what.replace(/\W+/g, "-")}-${c.pid}.log`)) : null;
  const keep = (d: Buffer) => {
    log?.write(d);
    out += d;
    if (out.length > 128 * 1024) out = out.slice(-64 * 1024);
  };
  c.stdout!.on("data", keep);
  c.stderr!.on("data", keep);
  let gone = false;
  const exited = new Promise<void>((r) =>
    c.once("exit", () => {
      gone = true;
      log?.end();
      r();
    }),
  );
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start within 60 s:\n${out.slice(-3000)}`)), 60_000);
    const check = () => {
      if (ready(out)) {
        clearTimeout(timer);
        c.stderr!.off("data", check);
        c.stdout!.off("data", check);
        resolve();
      }
    };
    c.stderr!.on("data", check);
    c.stdout!.on("data", check);
    void exited.then(() => reject(new Error(`${what} exited:\n${out.slice(-3000)}`)));
  });
  return {
    pid: c.pid!,
    out: () => out,
    gone: () => gone,
    stop: async () => {
      if (gone) return;
      c.kill("SIGTERM");
      // A node's consumers wait up to 10 s for their handlers in flight (streams.ts), and a profiled
      // child writes its profile only when it exits by itself: SIGKILL only past that.
      const killer = setTimeout(() => {
        say(`${what} (pid ${c.pid}) still running 30 s after SIGTERM: SIGKILL; its last output:\n${out.slice(-1500)}`);
        c.kill("SIGKILL");
      }, 30_000);
      await exited;
      clearTimeout(killer);
      if (c.exitCode !== null && c.exitCode !== 0) say(`${what} (pid ${c.pid}) exited with code ${c.exitCode} on SIGTERM`);
      else if (c.signalCode) say(`${what} (pid ${c.pid}) ended by ${c.signalCode}`);
    },
  };
}

/** The serving model S times slower (decode and prefill rates over S, weight updates S times longer), as a file for sim-engine --table. */
function slowTable(slow: number): string {
  const t = H100_LLAMA_8B;
  const file = join(root, `table-x${slow}.json`);
  writeFileSync(
    file,
    JSON.stringify({
      ...t, name: `${t.name} slowed ${slow}x`, updateWeightsMs: updateMs * slow,
      decodeTokensPerSecond: t.decodeTokensPerSecond.map((row) => row.map((r) => r / slow)), prefillTokensPerSecond: t.prefillTokensPerSecond.map((r) => r / slow),
    }),
  );
  return file;
}

/** `ooze sim-engine --count k` in `procs` child processes, n engines in all, `slow` times slower than the serving model; resolves with their URLs. */
async function simEngines(n: number, procs: number, slow: number): Promise<{ urls: string[]; pids: number[]; stop: () => Promise<void> }> {
  const children: Child[] = [];
  // the engines' keep-alive on the slowed clock, and this process's clients' cap on it (its fleets:
  // the job's, the bound's generation, and the rollout's where it runs here)
  const keepAlive = slowKeepAlive(slow);
  setMaxIdleMs(keepAlive.clientCapMs);
  try {
    for (let p = 0; p < procs; p++) {
      const count = Math.floor(n / procs) + (p < n % procs ? 1 : 0);
      const args = ["sim-engine", "--count", String(count), "--seed", String(p * 100_000), "--table", slowTable(slow), "--catch-up-ms", String(catchUpMs), "--keep-alive-ms", String(keepAlive.engineMs)];
      children.push(await child(args, (o) => o.includes("ready"), "sim-engine"));
    }
  } catch (e) {
    await Promise.all(children.map((c) => c.stop()));
    throw e;
  }
  const urls = children.flatMap((c) => [...c.out().matchAll(/^(http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => m[1]!));
  return { urls, pids: children.map((c) => c.pid), stop: async () => void (await Promise.all(children.map((c) => c.stop()))) };
}

/** The engines' counters, summed. */
interface EngineTotals {
  busy: number;
  lag: number;
  prompt: number;
  hit: number;
  steps: number;
  seqs: number;
  requests: number;
  aborted: number;
}

async function engineTotals(urls: readonly string[]): Promise<EngineTotals> {
  const all = await Promise.all(
    urls.map(async (u) => ((await (await fetch(`${u}/server_info`)).json()) as { internal_states: { cache: SimStats }[] }).internal_states[0]!.cache),
  );
  return all.reduce(
    (a, s) => ({
      busy: a.busy + s.busySeconds, lag: a.lag + s.lagSeconds, prompt: a.prompt + s.promptTokens, hit: a.hit + s.hitTokens, steps: a.steps + s.decodeSteps, seqs: a.seqs + s.decodeSequences,
      requests: a.requests + s.requests, aborted: a.aborted + s.aborted,
    }),
    { busy: 0, lag: 0, prompt: 0, hit: 0, steps: 0, seqs: 0, requests: 0, aborted: 0 },
  );
}

interface Snapshot {
  at: number;
  /** CPU seconds of the controller: this process and the rollout node processes. */
  cpu: number;
  /** The rollout node processes' part of `cpu` (the rest is the job's process: fleet, buffer, trainer, weight sync, and this bench). */
  rollout: number;
  sim: number;
  nats: number;
  msgs: number;
  /** Prompt groups published on the samples stream so far (its last sequence). */
  groups: number;
  engines: Promise<EngineTotals>;
  /** The CPU gauge read beside the job (bench/lib/cpu.ts), in ms. */
  gauge: Promise<number>;
}

interface ModeFigures {
  sps: number;
  slowdown: number;
  controllers: number;
  sim_processes: number;
  trained_in_window: number;
  generated_in_window: number;
  generated_vs_trained: number;
  engine_utilisation: number;
  prefix_hit_rate: number;
  nats_msgs_per_s: number;
  controller_cpu_ms_per_sample: number;
  /**
   * The CPU gauge (bench/lib/cpu.ts) read at the window's start and end, their mean in ms, and the
   * controller's CPU a sample as a multiple of it: the figure to compare across runs made at
   * different hours (this machine's CPU time for the same work varies up to 2× over a day).
   */
  cpu_gauge_ms: number;
  controller_cpu_per_sample_in_gauges: number;
  controller_cores: number;
  /**
   * The controller's CPU a generated sample, split: the rollout node processes (generation: the
   * episodes, routing, the engines' HTTP) and the job's process (fleet actor, buffer, trainer, weight
   * sync, this bench's readings); with one rollout process it runs in the job's, and all is "job".
   */
  rollout_cpu_ms_per_generated_sample: number;
  job_cpu_ms_per_generated_sample: number;
  sim_cores: number;
  nats_cores: number;
  engine_lag_fraction: number;
  mean_decode_batch: number;
  mean_step_s: number;
  staleness_max: number;
  /** The trainer's own time (train_seconds) over the window's wall time: 1 when it never waits, whatever the window's token mix. */
  trainer_busy: number;
  /** Tokens per trained sample in the window (the bound's training rate is per sample of its own mix). */
  window_tokens_per_sample: number;
  /** Requests the engines admitted per sample generated in the window (turns, and dispatches again after aborts). */
  engine_requests_per_sample: number;
  /** Requests aborted before they finished per sample generated in the window (weight updates' pauses). */
  engine_aborts_per_sample: number;
}

const natsMonitorPort = await freePort();
const nats = await startNatsServer({ monitorPort: natsMonitorPort });
async function natsMsgs(): Promise<number> {
  const v = (await (await fetch(`http://127.0.0.1:${natsMonitorPort}/varz`)).json()) as { in_msgs: number; out_msgs: number };
  return v.in_msgs + v.out_msgs;
}

/**
 * A stream's last sequence, from the server's monitoring port: on a machine at load 10 a JetStream
 * API request from the job's own connection timed out here, and ended the bench (Dec 1).
 */
async function lastSeq(stream: string): Promise<number> {
  const j = (await (await fetch(`http://127.0.0.1:${natsMonitorPort}/jsz?streams=true`)).json()) as {
    account_details?: { stream_detail?: { name: string; state: { last_seq: number } }[] }[];
  };
  for (const a of j.account_details ?? []) for (const st of a.stream_detail ?? []) if (st.name === stream) return st.state.last_seq;
  throw new Error(`stream ${stream} is not in the NATS server's /jsz`);
}

async function snapshot(job: string, nodePids: readonly number[], simPids: readonly number[], urls: readonly string[]): Promise<Snapshot> {
  const u = process.cpuUsage();
  const groups = await lastSeq(jobNames(job).streamSamples);
  const sum = (pids: readonly number[]) => pids.reduce((k, pid) => k + processCpuSeconds(pid), 0);
  const engines = engineTotals(urls);
  engines.catch(() => {}); // (awaited later, by the caller)
  const gauge = cpuGaugeMs();
  gauge.catch(() => {});
  const rollout = sum(nodePids);
  return {
    at: performance.now(), cpu: (u.user + u.system) / 1e6 + rollout, rollout, sim: sum(simPids), nats: processCpuSeconds(nats.pid), msgs: await natsMsgs(),
    groups, engines, gauge,
  };
}

/** Deadlines of a weight update on the slowed clock: one engine's control request, and the whole fleet's update (their defaults plus twice the slowed update). */
const slowUpdate = (slow: number) => ({ controlTimeoutMs: 30_000 + 2 * updateMs * slow, updateTimeoutMs: 120_000 + 2 * updateMs * slow });

/** The job's topology: the rollout in this process (k = 1), or k rollout actors each on an external host of its own. */
function topologyFile(n: number, k: number, urls: readonly string[], mode: string): string {
  const { steps } = planOf(mode);
  const file = join(root, `scale-${n}-${mode}.yaml`);
  const prompts = Math.max(1, Math.round((perEngine * n) / samples));
  const slow = slowdownOf(n);
  // A rollout's prompt comes back to another instance after ackWaitMs without a beat. At 1,024
  // engines on two cores a process stalled longer than the default 10 s, and most groups in flight
  // were generated twice (Dec 1, docs/experiments/scale.md): the bench gives them a minute.
  const config = { ...slowFleet(slow), ackWaitMs: 60_000 };
  const rollouts = k === 1 ? [{ name: "rollout", kind: "train.rollout", config }] : Array.from({ length: k }, (_, i) => ({ name: `rollout-${i}`, kind: "train.rollout", placement: `r${i}`, config }));
  writeFileSync(
    file,
    JSON.stringify({
      name: `scale-${n}-${mode.replace("_", "-")}`,
      hosts: [{ name: "main" }, ...(k === 1 ? [] : Array.from({ length: k }, (_, i) => ({ name: `r${i}`, start: "external" })))],
      actors: [
        { name: "fleet", kind: "fleet", config: { engines: urls, healthIntervalMs: config.healthIntervalMs, controlTimeoutMs: slowUpdate(slow).controlTimeoutMs } },
        { name: "weight-sync", kind: "train.weight-sync", config: { updateTimeoutMs: slowUpdate(slow).updateTimeoutMs } },
        ...rollouts,
      ],
      train: {
        mode, task, taskConfig, preset: "tiny", steps, promptsPerStep: prompts, samplesPerPrompt: samples, checkpointEvery: 1000, maxStaleness, lateGroups, keepCacheOnUpdate: keepCache, pauseOnUpdate: pauseInPlace ? "in_place" : "abort",
        ...(inflightSteps === null ? {} : { maxInflightGroups: Math.max(1, Math.round(inflightSteps * prompts)) }),
        simulate: { tokensPerSecond: (tpsPerEngine * n) / slow, stepOverheadMs: stepOverheadMs * slow },
      },
    }),
  );
  return file;
}

async function runMode(n: number, mode: (typeof modes)[number]): Promise<ModeFigures> {
  const k = controllersOf(n);
  const { warmup, end } = planOf(mode);
  const sim = await simEngines(n, simProcessesOf(n), slowdownOf(n));
  const nodes: Child[] = [];
  try {
    const file = topologyFile(n, k, sim.urls, mode);
    const topo = loadTopology(file);
    const { train, engines } = trainConfigOf(topo);
    const out = join(root, `${n}-${mode}`);
    const job = `scale-${n}-${mode.replace("_", "-")}`;
    const natsAuthUrl = nats.url.replace("nats://", `nats://${nats.token}@`);
    // k > 1: the rollout actors in node processes of their own (they wait for the job's engines).
    const stopJob = new AbortController();
    let nodeFailure: Error | null = null;
    if (k > 1)
      for (let i = 0; i < k; i++) {
        const node = await child(["node", "--nats", natsAuthUrl, "--job", job, "--topology", file, "--host", `r${i}`], (o) => o.includes(`[r${i}] running`), `ooze node r${i}`, {
          OOZE_HTTP_MAX_IDLE_MS: String(slowKeepAlive(slowdownOf(n)).clientCapMs),
        });
        nodes.push(node);
      }
    let first: Promise<Snapshot> | null = null;
    let last: Promise<Snapshot> | null = null;
    const watchdog = setInterval(() => {
      for (const [i, node] of nodes.entries())
        if (node.gone() && !nodeFailure) {
          nodeFailure = new Error(`rollout node r${i} failed:\n${node.out().slice(-3000)}`);
          stopJob.abort();
        }
    }, 2_000);
    try {
      await runTrainJob({
        topology: topo, train, engines, out, nats: { url: nats.url, token: nats.token }, job, signal: stopJob.signal,
        // warnings and errors, and the buffer's batches (how many groups are generating and finished)
        verbose: true,
        log: (l) => (!/\] (info|debug) /.test(l) || /buffer: batch/.test(l)) && say(`  ${l}`),
        onStep: (m) => {
          // (monotonic: the clock of V8's CPU profiles, to cut them to the window: bench/lib/profile-window.mjs)
          const monotonic = Number(process.hrtime.bigint() / 1_000_000n) / 1000;
          say(`  N=${n} ${mode}: step ${m.step}/${end} (${m.step <= warmup ? "warm-up" : "window"}) at ${m.seconds.toFixed(1)} s, ${m.samples} samples, staleness ≤ ${m.staleness_max}, monotonic ${monotonic.toFixed(2)} s`);
          // (awaited once the job has ended; a failure meanwhile must not be an unhandled rejection,
          // which ended the whole bench at step 8 of a 1,024-engine run on Dec 1)
          if (m.step === warmup) (first = snapshot(job, nodes.map((x) => x.pid), sim.pids, sim.urls)).catch(() => {});
          if (m.step === end) {
            last = snapshot(job, nodes.map((x) => x.pid), sim.pids, sim.urls);
            void last.finally(() => stopJob.abort()); // the window is over: the rest of the job's steps only kept launches going through it
          }
        },
      });
    } finally {
      clearInterval(watchdog);
    }
    if (nodeFailure) throw nodeFailure;
    const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    const a = await first!, b = await last!;
    const ea = await a.engines, eb = await b.engines;
    const gauge = ((await a.gauge) + (await b.gauge)) / 2;
    const wall = (b.at - a.at) / 1000;
    const inWindow = ms.filter((m) => m.step > warmup && m.step <= end);
    const trained = inWindow.reduce((x, m) => x + m.samples, 0);
    const generated = (b.groups - a.groups) * samples;
    const busy = eb.busy - ea.busy;
    const windowSeconds = ms.find((m) => m.step === end)!.seconds - ms.find((m) => m.step === warmup)!.seconds;
    const f: ModeFigures = {
      sps: trained / windowSeconds,
      slowdown: slowdownOf(n),
      controllers: k,
      sim_processes: sim.pids.length,
      trained_in_window: trained,
      generated_in_window: generated,
      generated_vs_trained: generated / trained,
      engine_utilisation: busy / (n * wall),
      prefix_hit_rate: (eb.hit - ea.hit) / Math.max(1, eb.prompt - ea.prompt),
      nats_msgs_per_s: (b.msgs - a.msgs) / wall,
      controller_cpu_ms_per_sample: ((b.cpu - a.cpu) * 1000) / trained,
      cpu_gauge_ms: gauge,
      controller_cpu_per_sample_in_gauges: ((b.cpu - a.cpu) * 1000) / trained / gauge,
      controller_cores: (b.cpu - a.cpu) / wall,
      rollout_cpu_ms_per_generated_sample: ((b.rollout - a.rollout) * 1000) / Math.max(1, generated),
      job_cpu_ms_per_generated_sample: ((b.cpu - b.rollout - (a.cpu - a.rollout)) * 1000) / Math.max(1, generated),
      sim_cores: (b.sim - a.sim) / wall,
      nats_cores: (b.nats - a.nats) / wall,
      engine_lag_fraction: (eb.lag - ea.lag) / Math.max(1e-9, busy),
      mean_decode_batch: (eb.seqs - ea.seqs) / Math.max(1, eb.steps - ea.steps),
      mean_step_s: inWindow.reduce((x, m) => x + m.step_seconds, 0) / inWindow.length,
      trainer_busy: inWindow.reduce((x, m) => x + m.train_seconds, 0) / windowSeconds,
      window_tokens_per_sample: inWindow.reduce((x, m) => x + m.tokens, 0) / trained,
      staleness_max: Math.max(...inWindow.map((m) => m.staleness_max)),
      engine_requests_per_sample: (eb.requests - ea.requests) / Math.max(1, generated),
      engine_aborts_per_sample: (eb.aborted - ea.aborted) / Math.max(1, generated),
    };
    say(
      `N=${n} ${mode} (${k} rollout process(es), ${f.sim_processes} sim, slowed ${f.slowdown}x): ${f.sps.toFixed(1)} samples/s (step ${f.mean_step_s.toFixed(2)} s; window: ${trained} trained, ${generated} generated), engines ${(100 * f.engine_utilisation).toFixed(0)} % busy, prefix hits ${(100 * f.prefix_hit_rate).toFixed(0)} %, ` +
        `NATS ${f.nats_msgs_per_s.toFixed(0)} msgs/s, controller ${f.controller_cpu_ms_per_sample.toFixed(2)} ms CPU/sample (a generated one: rollout processes ${f.rollout_cpu_ms_per_generated_sample.toFixed(2)}, job ${f.job_cpu_ms_per_generated_sample.toFixed(2)}; ${f.controller_cores.toFixed(2)} cores; ${f.controller_cpu_per_sample_in_gauges.toFixed(4)} of the CPU gauge's ${f.cpu_gauge_ms.toFixed(0)} ms), sim ${f.sim_cores.toFixed(2)} cores, lag ${(100 * f.engine_lag_fraction).toFixed(1)} %, mean decode batch ${f.mean_decode_batch.toFixed(1)}, ` +
        `${f.engine_requests_per_sample.toFixed(2)} engine requests and ${f.engine_aborts_per_sample.toFixed(2)} aborts a generated sample`,
    );
    return f;
  } finally {
    await Promise.all(nodes.map((x) => x.stop()));
    await sim.stop();
  }
}

async function bound(n: number): Promise<Record<"generation_only" | "generation_with_updates" | "training_only" | "bound" | "bound_without_updates" | "tokens_per_sample", number>> {
  const slow = slowdownOf(n);
  const sim = await simEngines(n, simProcessesOf(n), slow);
  try {
    const prompts = Math.max(1, Math.round((perEngine * n) / samples));
    const inflight = Math.max(1, Math.round(boundInflightSteps * prompts));
    const g = await generationOnly({
      urls: sim.urls, task, taskConfig, baseDir: process.cwd(), samplesPerPrompt: samples, fleet: slowFleet(slow),
      // steady in flight between the skip-th and the upto-th completion: launches go on until upto + window
      window: inflight, total: (boundSteps + 1) * prompts + inflight,
      skip: prompts, upto: (boundSteps + 1) * prompts,
    });
    const all = g.groups.flat();
    const tokensPerSample = all.reduce((k, s) => k + s.tokens.length, 0) / all.length;
    const batch = prompts * samples;
    const stepSeconds = (stepOverheadMs * slow) / 1000 + (batch * tokensPerSample * slow) / (tpsPerEngine * n);
    const trainingOnly = batch / stepSeconds;
    // Every step's new version stops every engine for one weight update, whatever the overlap.
    const generationWithUpdates = batch / (batch / g.sps + (updateMs * slow) / 1000);
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
say(`sizes ${sizes.join(", ")} (rollout processes ${sizes.map(controllersOf).join(", ")}; slowdown ${sizes.map(slowdownOf).join(", ")}; sim-engine processes ${sizes.map(simProcessesOf).join(", ")}); warm-up + window steps ${modes.map((m) => `${m} ${planOf(m).warmup} + ${planOf(m).window}`).join(", ")}, each step ${perEngine} samples per engine (8 per prompt); episodes of 1 to ${taskConfig.maxTurns} turns of ${turnTokens} tokens; trainer ${tpsPerEngine} tokens/s per engine; weight update ${updateMs} ms; ${availableParallelism()} cores, load ${load0.toFixed(2)}`);
const result: Record<string, unknown> = { bench: "scale", steps: Object.fromEntries(modes.map((m) => [m, planOf(m)])), per_engine: perEngine, turn_tokens: turnTokens, train_tps_per_engine: tpsPerEngine, update_ms: updateMs, catch_up_ms: catchUpMs, max_staleness: maxStaleness, max_turns: taskConfig.maxTurns, inflight_steps: inflightSteps, late_groups: lateGroups, keep_cache: keepCache, pause_on_update: pauseInPlace ? "in_place" : "abort", cores: availableParallelism(), load_before: load0 };
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
      slowdown: slowdownOf(n),
      controllers: controllersOf(n),
      sim_processes: simProcessesOf(n),
      generated_vs_trained: Object.fromEntries(modes.map((m) => [m, figures[m]!.generated_vs_trained])),
      trained_in_window: Object.fromEntries(modes.map((m) => [m, figures[m]!.trained_in_window])),
      controller_cpu_ms_per_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.controller_cpu_ms_per_sample])),
      cpu_gauge_ms: Object.fromEntries(modes.map((m) => [m, figures[m]!.cpu_gauge_ms])),
      controller_cpu_per_sample_in_gauges: Object.fromEntries(modes.map((m) => [m, figures[m]!.controller_cpu_per_sample_in_gauges])),
      rollout_cpu_ms_per_generated_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.rollout_cpu_ms_per_generated_sample])),
      job_cpu_ms_per_generated_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.job_cpu_ms_per_generated_sample])),
      controller_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.controller_cores])),
      sim_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.sim_cores])),
      nats_cores: Object.fromEntries(modes.map((m) => [m, figures[m]!.nats_cores])),
      engine_lag_fraction: Object.fromEntries(modes.map((m) => [m, figures[m]!.engine_lag_fraction])),
      mean_decode_batch: Object.fromEntries(modes.map((m) => [m, figures[m]!.mean_decode_batch])),
      trainer_busy: Object.fromEntries(modes.map((m) => [m, figures[m]!.trainer_busy])),
      window_tokens_per_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.window_tokens_per_sample])),
      engine_requests_per_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.engine_requests_per_sample])),
      engine_aborts_per_sample: Object.fromEntries(modes.map((m) => [m, figures[m]!.engine_aborts_per_sample])),
    };
    say(`N=${n}: fully_async_vs_sync ${row.fully_async_vs_sync.toFixed(2)}, fully_async_vs_bound ${row.fully_async_vs_bound.toFixed(2)}, trainer busy ${(100 * (figures.fully_async?.trainer_busy ?? NaN)).toFixed(0)} % of the fully_async window (tokens a sample: window ${(figures.fully_async?.window_tokens_per_sample ?? NaN).toFixed(0)}, bound ${b.tokens_per_sample.toFixed(0)})`);
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
