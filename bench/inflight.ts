// In-flight benchmark (`npm run bench -- inflight [--engines E] [--factor K] [--per-engine P]
// [--slowdown S] [--warmup W] [--window T] [--rounds R] [--turn-tokens N] [--max-turns M]
// [--node-flags "F…"] [--same-in-flight]`): what a
// rollout process spends a request as the requests it holds in flight grow, at the same request
// rate. A rollout process at 1,024 engines holds thousands of requests at once, and its garbage
// collector re-marks what they hold at every major collection (docs/experiments/scale.md, Dec 2): the
// controller's CPU a sample then grows with the fleet. This measures that alone, in one process.
//
// Two sizes, each run `--rounds` times, alternating: small, E engines (default 8) with P samples in
// flight an engine (default 16), served S times slower than the H100 serving model (default 2); large,
// K times the engines and samples in flight (default 32) on a clock K times slower, so that each
// request lasts K times longer and the request rate stays the same. The measured process
// (bench/lib/inflight-driver.mjs) runs the rollout's generation path from the compiled dist/ —
// the long-tail task's episodes (up to M turns of N tokens, defaults 4 and 32, as `bench scale`'s light
// workload), the fleet with cache-aware routing, the engine client, the HTTP transport — against
// `ooze sim-engine` processes (one per 128 engines), with no health checks, NATS or trainer; the
// fleet's progress deadlines, which count in engine time, are as many times longer as the clock is
// slowed (as in `bench scale`), and each size reports the turns dispatched again a request (0 when
// the deadlines suit the clock: before Dec 2, 10:10 UTC, most large-size turns missed theirs and
// were aborted and sent again, which this bench counted as the cost of holding them). Each size
// also reports its system CPU, the simulated engines' cores, and a gauge read inside the process
// and in a fresh one (bench/lib/cpu.ts), which say how fast the machine ran meanwhile.
// `--same-in-flight` asks the other question: the large size has K times the engines but the same
// requests in flight (P / K an engine) on the same clock, so what grows is only the engines a
// process routes over and holds sockets to, not what it holds (a rollout process on a real fleet,
// with processes added as the fleet grows, holds about as many requests whatever the fleet's size).
// `--node-flags` are given to the measured process's node (V8's heap settings, e.g.
// "--max-semi-space-size=64"), at both sizes.
// OOZE_BENCH_CPU_PROF=DIR has the measured process write a V8 CPU profile of each window there.
// `--census DIR` writes two heap snapshots of the large size's first round there (requests in flight,
// then none) and prints what a request in flight holds, by kind of object.
// Progress on stderr; one JSON line last: each size's CPU a request (all threads; main thread),
// main-thread GC pauses a request, heap bytes a request in flight, and the large size's over the
// small one's, from the same run.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { H100_LLAMA_8B } from "../src/engine/sim/perf-model.ts";
import { cpuGaugeMs, processCpuSeconds } from "./lib/cpu.ts";
import { slowFleet, slowKeepAlive } from "./lib/slow-clock.ts";

const flag = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const engines = Number(flag("engines", "8"));
const factor = Number(flag("factor", "32"));
const perEngine = Number(flag("per-engine", "16"));
const slowdown = Number(flag("slowdown", "2"));
const warmupS = Number(flag("warmup", "20"));
const windowS = Number(flag("window", "40"));
const rounds = Number(flag("rounds", "2"));
const turnTokens = Number(flag("turn-tokens", "32"));
const maxTurns = Number(flag("max-turns", "4"));
/** A folder for the large size's heap census (first round): objects a request in flight, by kind. */
const censusDir = flag("census", "");
/** Flags for the measured process's node, split on spaces. */
const nodeFlags = flag("node-flags", "").split(" ").filter((f) => f !== "");
/** The large size holds the small one's requests in flight over K times the engines, on the small one's clock. */
const sameInFlight = process.argv.includes("--same-in-flight");
if (![engines, factor, perEngine, slowdown, warmupS, windowS, rounds, turnTokens, maxTurns].every((x) => Number.isFinite(x) && x > 0))
  throw new Error("bench inflight: every option must be a positive number");
if ((engines * perEngine) % 8 !== 0) throw new Error("bench inflight: engines × per-engine must be a multiple of 8 (prompt groups of 8)");
if (sameInFlight && perEngine % factor !== 0) throw new Error(`bench inflight: --same-in-flight spreads the ${perEngine} requests an engine over ${factor} times the engines: --per-engine must be a multiple of --factor`);

const OOZE = fileURLToPath(new URL("../bin/ooze.mjs", import.meta.url));
const DRIVER = fileURLToPath(new URL("./lib/inflight-driver.mjs", import.meta.url));
const TASK = fileURLToPath(new URL("./lib/long-tail-task.ts", import.meta.url));
const root = mkdtempSync(join(tmpdir(), "ooze-bench-inflight-"));
const say = (s: string) => process.stderr.write(`[bench inflight] ${s}\n`);

/** The serving model `slow` times slower, as a file for sim-engine --table. */
function slowTable(slow: number): string {
  const t = H100_LLAMA_8B;
  const file = join(root, `table-x${slow}.json`);
  const table = {
    ...t,
    name: `${t.name} slowed ${slow}x`,
    decodeTokensPerSecond: t.decodeTokensPerSecond.map((row) => row.map((r) => r / slow)),
    prefillTokensPerSecond: t.prefillTokensPerSecond.map((r) => r / slow),
  };
  writeFileSync(file, JSON.stringify(table));
  return file;
}

/** Runs `node args…` and resolves with its stdout once it exits 0 (or with the process, once `ready` matches its stderr). */
function node(args: string[], ready?: RegExp): Promise<{ out: string; proc: ChildProcess }> {
  const proc = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  return new Promise((resolve, reject) => {
    proc.stdout!.on("data", (d: Buffer) => {
      out += d;
    });
    proc.stderr!.on("data", (d: Buffer) => {
      err = (err + d).slice(-4000);
      if (ready?.test(err)) resolve({ out, proc });
    });
    proc.once("exit", (code, signal) => {
      if (code === 0 && !ready) resolve({ out, proc });
      else reject(new Error(`${args.slice(0, 2).join(" ")} exited (${signal ?? code}): ${err.trim()}`));
    });
  });
}

interface Figures {
  requests_per_s: number;
  /** Turns dispatched again a request (a missed deadline, an abort, a fault): 0 when the deadlines suit the clock. */
  redispatches_per_request: number;
  mean_in_flight: number;
  cpu_ms_per_request: number;
  main_thread_ms_per_request: number;
  /** The kernel's part of the CPU (system time: the sockets' writes and reads, epoll, timers). */
  system_ms_per_request: number;
  gc_pause_ms_per_request: number;
  heap_kb_per_request_in_flight: number | null;
  /** Cores the simulated engines' processes used over the measured process's run (warm-up and window). */
  sim_engine_cores: number;
  /**
   * The gauge's work (bench/lib/cpu.ts's kind, a twentieth of it) timed inside the measured process
   * beside its requests (median of a reading every 2 s), and a fresh process's CPU for the whole
   * gauge read in the window's middle: the first over the second, compared between the sizes, says
   * whether what the process holds slows work that touches none of it.
   */
  gauge_ms: number;
  gauge_outside_ms: number;
}

/** One size: its engines, the requests in flight an engine, and how many times slower than the serving model they run. */
interface Size {
  name: string;
  engines: number;
  perEngine: number;
  slow: number;
}

async function runSize({ engines: n, perEngine: held, slow }: Size, census: string | null): Promise<Figures> {
  const table = slowTable(slow);
  const sims: ChildProcess[] = [];
  try {
    const urls: string[] = [];
    for (let left = n, p = 0; left > 0; p++) {
      const count = Math.min(128, left);
      left -= count;
      const args = [OOZE, "sim-engine", "--count", String(count), "--seed", String(p * 100_000), "--table", table, "--catch-up-ms", "1000", "--keep-alive-ms", String(slowKeepAlive(slow).engineMs), "--parent-pid", String(process.pid)];
      const { out, proc } = await node(args, /ready/);
      sims.push(proc);
      urls.push(...[...out.matchAll(/^(http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => m[1]!));
    }
    if (urls.length !== n) throw new Error(`expected ${n} engine URLs, got ${urls.length}`);
    // no periodic health checks: the bench isolates what requests in flight cost (a rollout's grow with its engines, and `bench scale` counts them)
    const fleet = { ...slowFleet(slow), healthIntervalMs: 0 };
    const cfg = { urls, fleet, idleCapMs: slowKeepAlive(slow).clientCapMs, groups: (n * held) / 8, warmupS, windowS, task: TASK, taskConfig: { alpha: 1.0, maxTurns, turnTokens }, baseDir: root, ...(census ? { census } : {}) };
    const prof = process.env.OOZE_BENCH_CPU_PROF;
    if (prof) Object.assign(cfg, { profile: join(prof, `inflight-${n}-engines-${Date.now()}.cpuprofile`) });
    const simCpu0 = sims.reduce((a, p) => a + processCpuSeconds(p.pid!), 0);
    const t0 = performance.now();
    // the gauge in a fresh process, read in the window's middle, beside the driver's own
    let outside: Promise<number> | null = null;
    const reading = setTimeout(() => (outside = cpuGaugeMs(3)), (warmupS + windowS / 2) * 1000);
    const { out } = await node([...nodeFlags, DRIVER, JSON.stringify(cfg)]).finally(() => clearTimeout(reading));
    const simCores = (sims.reduce((a, p) => a + processCpuSeconds(p.pid!), 0) - simCpu0) / ((performance.now() - t0) / 1000);
    const r = JSON.parse(out.trim().split("\n").at(-1)!) as Record<string, number | null> & { census?: { objects: number; bytes: number; top: string[] } };
    if (r.census) say(`heap census, a request in flight: ${r.census.objects.toFixed(1)} objects, ${(r.census.bytes / 1024).toFixed(1)} KB\n  ${r.census.top.join("\n  ")}`);
    const per = (x: number) => (1000 * x) / (r.requests as number);
    return {
      requests_per_s: r.requests_per_s as number,
      redispatches_per_request: (r.redispatches as number) / (r.requests as number),
      mean_in_flight: r.mean_in_flight as number,
      cpu_ms_per_request: per(r.cpu_s as number),
      main_thread_ms_per_request: per(r.main_thread_cpu_s as number),
      system_ms_per_request: per(r.system_cpu_s as number),
      gc_pause_ms_per_request: per(r.gc_pause_s as number),
      heap_kb_per_request_in_flight: r.heap_bytes_per_request_in_flight === null ? null : (r.heap_bytes_per_request_in_flight as number) / 1024,
      sim_engine_cores: simCores,
      gauge_ms: r.gauge_ms as number,
      gauge_outside_ms: outside === null ? NaN : await outside,
    };
  } finally {
    for (const p of sims) p.kill("SIGTERM");
  }
}

const sizes: Size[] = [
  { name: "small", engines, perEngine, slow: slowdown },
  sameInFlight
    ? { name: "large", engines: engines * factor, perEngine: perEngine / factor, slow: slowdown }
    : { name: "large", engines: engines * factor, perEngine, slow: slowdown * factor },
];
say(`sizes: ${sizes.map((s) => `${s.name} ${s.engines} engines × ${s.perEngine} in flight, slowed ${s.slow}x`).join("; ")}; ${rounds} round(s) of ${warmupS} s warm-up + ${windowS} s window`);
const results: Record<string, Figures[]> = { small: [], large: [] };
try {
  for (let round = 0; round < rounds; round++) {
    for (const s of sizes) {
      const f = await runSize(s, censusDir !== "" && round === 0 && s.name === "large" ? censusDir : null);
      results[s.name]!.push(f);
      say(
        `round ${round + 1} ${s.name}: ${f.requests_per_s.toFixed(0)} requests/s (${f.redispatches_per_request.toFixed(3)} dispatched again each), ${f.mean_in_flight.toFixed(0)} in flight, ` +
          `${f.cpu_ms_per_request.toFixed(3)} ms CPU a request (main thread ${f.main_thread_ms_per_request.toFixed(3)}, system ${f.system_ms_per_request.toFixed(3)}, GC pauses ${f.gc_pause_ms_per_request.toFixed(3)}), ` +
          `${f.heap_kb_per_request_in_flight?.toFixed(1) ?? "?"} KB a request in flight; simulated engines ${f.sim_engine_cores.toFixed(2)} cores; gauge ${f.gauge_ms.toFixed(2)} ms inside, ${f.gauge_outside_ms.toFixed(0)} ms outside`,
      );
    }
  }
} finally {
  rmSync(root, { recursive: true, force: true });
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const avg = (name: string) => {
  const fs = results[name]!;
  return Object.fromEntries(Object.keys(fs[0]!).map((k) => [k, mean(fs.map((f) => (f[k as keyof Figures] ?? NaN) as number))])) as unknown as Figures;
};
const small = avg("small");
const large = avg("large");
console.log(
  JSON.stringify({
    bench: "inflight",
    engines: { small: engines, large: engines * factor },
    per_engine: { small: sizes[0]!.perEngine, large: sizes[1]!.perEngine },
    slowdown: { small: slowdown, large: sizes[1]!.slow },
    rounds,
    node_flags: nodeFlags.join(" "),
    small,
    large,
    requests_per_s_ratio: large.requests_per_s / small.requests_per_s,
    cpu_per_request_ratio: large.cpu_ms_per_request / small.cpu_ms_per_request,
    main_thread_per_request_ratio: large.main_thread_ms_per_request / small.main_thread_ms_per_request,
    system_per_request_ratio: large.system_ms_per_request / small.system_ms_per_request,
    gauge_inside_ratio: large.gauge_ms / small.gauge_ms,
    gauge_outside_ratio: large.gauge_outside_ms / small.gauge_outside_ms,
    gc_pause_per_request_ratio: large.gc_pause_ms_per_request / small.gc_pause_ms_per_request,
  }),
);
