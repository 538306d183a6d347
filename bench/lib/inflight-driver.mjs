// The measured process of `npm run bench -- inflight` (bench/inflight.ts): a rollout's generation
// path as a rollout node runs it — the long-tail task's episodes (rolloutRange: episode, turn,
// FleetGenerator, Fleet, dispatch, engine client, HTTP exchange) against the engines whose URLs it
// is given — from the compiled dist/ with plain node, as `ooze node` runs it (not under tsx, whose
// transform adds work to every closure). Plain JavaScript for that reason. Keeps `groups` prompt
// groups of 8 in flight for `warmupS` + `windowS` seconds, then stops launching and lets them end.
// Prints one JSON line: over the window, requests and samples completed, this process's CPU (all
// threads, and the main thread alone from /proc), V8's main-thread GC pauses, the requests in flight
// (mean of readings every 250 ms); after it, the heap held a request in flight (live bytes after a
// full collection with the groups in flight, less live bytes after they all ended, over the requests
// that were in flight).
import { readFileSync } from "node:fs";
import { PerformanceObserver } from "node:perf_hooks";
import { join } from "node:path";
import { setFlagsFromString, writeHeapSnapshot } from "node:v8";
import { runInNewContext } from "node:vm";

const cfg = JSON.parse(process.argv[2]);
const dist = new URL("../../dist/", import.meta.url);
const { FleetGenerator } = await import(new URL("actors/rollout/generator.js", dist).href);
const { loadTask } = await import(new URL("actors/environment/task-loader.js", dist).href);
const { rolloutRange } = await import(new URL("actors/rollout/rollout.js", dist).href);
const { setMaxIdleMs } = await import(new URL("src/engine/http.js", dist).href);

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc");

const task = await loadTask(cfg.task, cfg.taskConfig, cfg.baseDir);
// The fleet's settings and the sockets' idle cap on the slowed clock (bench/lib/slow-clock.ts), as
// bench/inflight.ts passes them.
setMaxIdleMs(cfg.idleCapMs);
const gen = await FleetGenerator.create(cfg.urls, undefined, cfg.fleet);

// Requests counted around the generator (the same small wrapper at every size).
let inflight = 0;
let requests = 0;
/** Dispatches past the first (a turn sent to an engine again: after a missed deadline, an abort, a fault). */
let redispatches = 0;
const fleetGenerate = gen.fleet.generate.bind(gen.fleet);
gen.fleet.generate = (req) =>
  fleetGenerate(req).then((r) => {
    redispatches += r.redispatches;
    return r;
  });
const generate = gen.generate.bind(gen);
const ended = () => {
  inflight--;
  requests++;
};
gen.generate = (req) => {
  inflight++;
  const p = generate(req);
  p.then(ended, ended);
  return p;
};

let gcPauseMs = 0;
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcPauseMs += e.duration;
}).observe({ entryTypes: ["gc"] });

/** The main thread's CPU seconds (utime + stime of /proc/self/task/PID/stat, 100 ticks a second). */
function mainThreadCpuS() {
  try {
    const s = readFileSync(`/proc/self/task/${process.pid}/stat`, "utf8");
    const f = s.slice(s.lastIndexOf(")") + 2).split(" ");
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return NaN;
  }
}

/** Objects in a heap snapshot by kind ("closure onData", "object Promise", "string", …): count and bytes. */
function countsOf(file) {
  const snap = JSON.parse(readFileSync(file, "utf8"));
  const m = snap.snapshot.meta;
  const F = m.node_fields.length;
  const iType = m.node_fields.indexOf("type");
  const iName = m.node_fields.indexOf("name");
  const iSize = m.node_fields.indexOf("self_size");
  const types = m.node_types[0];
  const out = new Map();
  for (let i = 0; i < snap.nodes.length; i += F) {
    const type = types[snap.nodes[i + iType]];
    if (type === "synthetic") continue;
    const key = type === "string" || type === "concatenated string" || type === "sliced string" || type === "number" ? type : `${type} ${snap.strings[snap.nodes[i + iName]]}`;
    const c = out.get(key) ?? { n: 0, bytes: 0 };
    c.n++;
    c.bytes += snap.nodes[i + iSize];
    out.set(key, c);
  }
  return out;
}

/** What the busy snapshot holds beyond the idle one, a request in flight: the largest kinds by count. */
function censusPerRequest(busyFile, idleFile, requests) {
  const busy = countsOf(busyFile);
  const idle = countsOf(idleFile);
  const rows = [];
  let objects = 0;
  let bytes = 0;
  for (const [k, c] of busy) {
    const d = { n: c.n - (idle.get(k)?.n ?? 0), bytes: c.bytes - (idle.get(k)?.bytes ?? 0) };
    if (d.n <= 0) continue;
    objects += d.n;
    bytes += d.bytes;
    rows.push([k, d.n / requests, d.bytes / requests]);
  }
  rows.sort((a, b) => b[1] - a[1]);
  return { objects: objects / requests, bytes: bytes / requests, top: rows.slice(0, 60).map(([k, n, b]) => `${n.toFixed(2)} ${Math.round(b)}B ${k}`) };
}

/** A V8 CPU profile of this thread (the inspector's profiler), for the window alone. */
async function startProfile() {
  const { Session } = await import("node:inspector");
  const { writeFileSync } = await import("node:fs");
  const session = new Session();
  session.connect();
  const post = (method, params) => new Promise((resolve, reject) => session.post(method, params ?? {}, (e, r) => (e ? reject(e) : resolve(r))));
  await post("Profiler.enable");
  await post("Profiler.start");
  return {
    async stop(file) {
      const { profile } = await post("Profiler.stop");
      writeFileSync(file, JSON.stringify(profile));
      session.disconnect();
    },
  };
}

let samples = 0;
let launching = true;
let next = 0;
let open = 0;
let failure = null;
let allEnded = () => {};
const launch = () => {
  const p = next++;
  open++;
  rolloutRange(task, gen, { firstPrompt: p, prompts: 1, samplesPerPrompt: 8, firstSample: p * 8 }, { seed: 0, temperature: 1 }).then(
    (r) => {
      samples += r.samples.length;
      open--;
      if (launching) launch();
      else if (open === 0) allEnded();
    },
    (e) => {
      failure ??= e;
      open--;
      if (open === 0) allEnded();
    },
  );
};
for (let i = 0; i < cfg.groups; i++) launch();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
await sleep(cfg.warmupS * 1000);
if (failure) throw failure;
const profiler = cfg.profile ? await startProfile() : null;
const t0 = { wall: performance.now(), cpu: process.cpuUsage(), main: mainThreadCpuS(), requests, samples, gc: gcPauseMs, redispatches };
let readings = 0;
let inflightSum = 0;
const sampler = setInterval(() => {
  readings++;
  inflightSum += inflight;
}, 250);
// An in-process gauge: the same small piece of work (JSON bodies of token ids built and parsed, as
// bench/lib/cpu.ts's gauge does) timed every 2 s on this process's own thread, beside its requests.
// Against the same work in a fresh process (the bench reads that beside the run), it says whether
// the process's state (its heap, the collector's marking) slows work that touches none of it.
const gaugeMs = [];
const gauge = setInterval(() => {
  const t = performance.now();
  let keep = 0;
  for (let i = 0; i < 20; i++) {
    const ids = new Int32Array(1024);
    for (let j = 0; j < ids.length; j++) ids[j] = (i * 7919 + j * 104729) % 32000;
    const back = JSON.parse(JSON.stringify({ input_ids: Array.from(ids), sampling_params: { max_new_tokens: 128 }, rid: "g" + i }));
    keep += back.input_ids.length;
  }
  if (keep > 0) gaugeMs.push(performance.now() - t);
}, 2000);
await sleep(cfg.windowS * 1000);
clearInterval(sampler);
clearInterval(gauge);
gaugeMs.sort((a, b) => a - b);
if (profiler) await profiler.stop(cfg.profile);
const wall = (performance.now() - t0.wall) / 1000;
const cpu = process.cpuUsage(t0.cpu);
const main = mainThreadCpuS() - t0.main;
const window = { requests: requests - t0.requests, samples: samples - t0.samples, gcPauseMs: gcPauseMs - t0.gc, redispatches: redispatches - t0.redispatches };
if (failure) throw failure;

// The heap a request in flight holds: a full collection now, and again once every group has ended.
gc();
const heldNow = inflight;
const liveInFlight = process.memoryUsage().heapUsed;
const snapBusy = cfg.census ? writeHeapSnapshot(join(cfg.census, "busy.heapsnapshot")) : null;
launching = false;
await new Promise((r) => {
  allEnded = r;
  if (open === 0) r();
});
gc();
gc();
const liveIdle = process.memoryUsage().heapUsed;
const snapIdle = cfg.census ? writeHeapSnapshot(join(cfg.census, "idle.heapsnapshot")) : null;
await gen.close();
if (failure) throw failure;
const census = snapBusy && snapIdle ? censusPerRequest(snapBusy, snapIdle, heldNow) : undefined;

process.stdout.write(
  `${JSON.stringify({
    wall_s: wall,
    requests: window.requests,
    samples: window.samples,
    requests_per_s: window.requests / wall,
    redispatches: window.redispatches,
    mean_in_flight: inflightSum / Math.max(1, readings),
    cpu_s: (cpu.user + cpu.system) / 1e6,
    system_cpu_s: cpu.system / 1e6,
    gauge_ms: gaugeMs.length > 0 ? gaugeMs[gaugeMs.length >> 1] : null,
    main_thread_cpu_s: main,
    gc_pause_s: window.gcPauseMs / 1000,
    in_flight_at_heap_reading: heldNow,
    heap_bytes_per_request_in_flight: heldNow > 0 ? (liveInFlight - liveIdle) / heldNow : null,
    ...(census ? { census } : {}),
  })}\n`,
);
process.exit(0);
