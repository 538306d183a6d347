// ooze/testing/job's job under test (the types and their documentation are in job-types.ts): a
// topology's training job — `ooze train`'s actors, in this process — on its own nats-server behind a
// cut proxy (or a given cluster), its engines as `ooze serve` processes behind recording engine
// fault proxies (or embedded), with the targets faults name: `trainer-worker` (the trainer's worker
// process, which the trainer restarts), the loop's actors (crashed through the runtime's
// supervision), `nats` / the cluster's servers, the link `job-nats`, `engine-K`. A composition root
// of the loop, so it may import actors/.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { serveArgs } from "../../actors/fleet/embedded.ts";
import { fleetConfig } from "../../actors/fleet/fleet-actor.ts";
import { fullyAsyncLimits, trainConfigOf, type EnginesConfig, type TrainConfig } from "../../actors/protocol/config.ts";
import { slotsPerEpisode } from "../../actors/protocol/agent-config.ts";
import { OozeError } from "../../src/errors.ts";
import { oozeBin } from "../../src/package-root.ts";
import type { ScheduleSpace } from "../../src/testing/arbitraries.ts";
import { createCutProxy, type CutProxy } from "../../src/testing/cut-proxy.ts";
import { startEngineFaultProxy, type EngineFaultProxy } from "../../src/testing/engine-fault-proxy.ts";
import { checkTargets, parseFaultSchedule, playFaults, type FaultKind, type FaultPlayer, type FaultSpec, type FaultTargets } from "../../src/testing/faults.ts";
import {
  checkInvariants,
  everyEpisodeOnce,
  everySampleOnce,
  finishesWithin,
  noActorLeftCrashed,
  noFailedSamples,
  stalenessWithin,
  versionsIncrease,
  type Invariant,
  type JobOutcome,
  type Verdict,
} from "../../src/testing/invariants.ts";
import type { JobInvariants, JobUnderTest, JobUnderTestOptions } from "./job-types.ts";
import { startTestNats } from "../../src/testing/nats.ts";
import type { FaultReport } from "../../src/testing/report.ts";
import { tokensAsSampled } from "../../src/testing/sampled-tokens.ts";
import { waitUntil } from "../../src/testing/wait.ts";
import { loadTopology } from "../../src/topology/load.ts";
import type { Topology } from "../../src/topology/schema.ts";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import { checkTrainModel, runTrainJob } from "./train-job.ts";

/** The loop's actors that `actor` faults crash. */
export const JOB_ACTORS = ["rollout", "buffer", "trainer", "weight-sync", "fleet"] as const;

let jobs = 0;

/** How long a job stopped at its deadline may take to end before it is reported stuck. */
const STOP_GRACE_MS = 30_000;

/**
 * One engine of the job under test, put behind its recording fault proxy: an `ooze serve` it starts
 * (`serve`: the command's model and limit flags) or an external URL. `fleet` names the topology's
 * fleet actor the engine belongs to (its `embedded` and `engines` config), null for `engines:`.
 */
interface EngineSlot {
  serve: string[] | null;
  url: string | null;
  fleet: string | null;
}

/**
 * The engines of a topology, in the order their proxies are named `engine-K`: the `engines:`
 * section's (URLs, then `count` started ones), or — when the topology has its own fleet actor, which
 * makes `engines:` unused — each fleet actor's `engines` URLs and `embedded` ones. Proxying a fleet
 * actor's embedded engines too means every engine the job uses is recorded and can take faults.
 */
function engineSlots(topology: Topology, train: TrainConfig, engines: EnginesConfig, baseDir: string): EngineSlot[] {
  const fleets = topology.actors.filter((a) => a.kind === "fleet");
  if (fleets.length === 0) {
    const model = train.model !== undefined ? { modelDir: resolve(baseDir, train.model) } : { preset: train.preset, seed: train.seed };
    const serve = serveArgs({ ...model, maxRunning: engines.maxRunning, cacheTokens: engines.cacheTokens });
    return [...engines.urls.map((url) => ({ serve: null, url, fleet: null })), ...Array.from({ length: engines.count }, () => ({ serve, url: null, fleet: null }))];
  }
  const slots: EngineSlot[] = [];
  for (const a of fleets) {
    const parsed = fleetConfig.safeParse(a.config ?? {});
    if (!parsed.success) throw new OozeError("CONFIG_INVALID", `${topology.file ?? "topology"}: actor '${a.name}' (fleet): config: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
    const cfg = parsed.data;
    for (const e of cfg.engines) slots.push({ serve: null, url: typeof e === "string" ? e : e.url, fleet: a.name });
    const e = cfg.embedded;
    // on loopback, whatever host the topology binds them to: the proxies stand in front of them
    const serve = e ? serveArgs({ ...e, host: undefined }) : [];
    for (let i = 0; i < (e?.count ?? 0); i++) slots.push({ serve, url: null, fleet: a.name });
  }
  return slots;
}

/** `ooze serve` with `args` (model and limits) on a free port; resolves once it serves. */
async function startServe(args: string[]): Promise<{ url: string; child: ChildProcess; log: () => string }> {
  const child = spawn(process.execPath, [oozeBin(), "serve", ...args, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout!.on("data", (d) => (log = (log + d).slice(-20_000)));
  child.stderr!.on("data", (d) => (log = (log + d).slice(-20_000)));
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  try {
    const url = await Promise.race([
      waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "ooze serve to print its URL", diagnostics: () => log }),
      exited.then(() => {
        throw new OozeError("ENGINE_UNAVAILABLE", `ooze serve exited before serving: ${log.trim()}`);
      }),
    ]);
    return { url, child, log: () => log };
  } catch (e) {
    child.kill("SIGKILL");
    throw e;
  }
}

async function stopChild(c: ChildProcess): Promise<void> {
  if (c.exitCode !== null || c.signalCode !== null) return;
  const gone = new Promise((r) => c.once("exit", r));
  c.kill("SIGCONT");
  c.kill("SIGTERM");
  const t = setTimeout(() => c.kill("SIGKILL"), 5_000);
  await gone;
  clearTimeout(t);
}

/** The names of a job's targets, by kind of target (`nats`: whether there is a lone nats-server). */
type TargetNames = { [K in Exclude<keyof FaultTargets, "nats">]: string[] } & { nats: boolean };

const namesOf = (t: FaultTargets): TargetNames => ({
  processes: Object.keys(t.processes ?? {}),
  links: Object.keys(t.links ?? {}),
  engines: Object.keys(t.engines ?? {}),
  actors: Object.keys(t.actors ?? {}),
  commands: Object.keys(t.commands ?? {}),
  disks: Object.keys(t.disks ?? {}),
  natsServers: Object.keys(t.natsServers ?? {}),
  nats: t.nats !== undefined,
});

/** The schedule space over a job's targets. */
function spaceOf(n: TargetNames, kinds: readonly FaultKind[], s: { horizonMs: number; maxForMs?: number; maxFaults?: number }): ScheduleSpace {
  return {
    kinds,
    processes: n.processes,
    links: n.links,
    engines: n.engines,
    actors: n.actors,
    commands: n.commands,
    disks: n.disks,
    ...(n.natsServers.length > 0 ? { natsServers: n.natsServers } : { nats: n.nats && kinds.includes("nats-restart") }),
    horizonMs: s.horizonMs,
    maxForMs: s.maxForMs ?? Math.floor(s.horizonMs / 2),
    maxFaults: s.maxFaults ?? 3,
  };
}

/** The topology of `o` with its `train` overrides, its directory and its checked train/engines sections. */
function jobConfig(o: JobUnderTestOptions): { topology: Topology; baseDir: string; train: TrainConfig; engines: EnginesConfig } {
  const topo = typeof o.topology === "string" ? loadTopology(o.topology) : o.topology;
  const baseDir = typeof o.topology === "string" ? resolve(o.topology, "..") : topo.file ? resolve(topo.file, "..") : process.cwd();
  const topology = { ...topo, train: { ...(topo.train ?? {}), ...(o.train ?? {}) } };
  const config = trainConfigOf(topology);
  checkTrainModel(topology, config.train); // a missing model is the topology's, not a fault's: refused before any engine starts
  return { topology, baseDir, ...config };
}

/** The names of the targets the job `o` would start with, without starting it. */
function jobTargetNames(o: JobUnderTestOptions): TargetNames {
  const { topology, baseDir, train, engines } = jobConfig(o);
  const own = namesOf(o.targets ?? {});
  const cluster = o.nats?.cluster;
  const proxied = (o.engines ?? "proxied") === "proxied";
  return {
    ...own,
    processes: ["trainer-worker", ...own.processes],
    links: cluster ? [...Object.keys(cluster.partitions), ...own.links] : ["job-nats", ...own.links],
    engines: proxied ? [...engineSlots(topology, train, engines, baseDir).map((_, k) => `engine-${k}`), ...own.engines] : own.engines,
    actors: [...JOB_ACTORS, ...own.actors],
    natsServers: cluster ? [...cluster.servers.map((_, i) => `s${i}`), "meta-leader"] : [],
    nats: !cluster,
  };
}

/**
 * The schedule space of the job `o` would start, without starting it (what startJobUnderTest's
 * `space` gives once it runs; `ooze fuzz` draws from it before the first job).
 */
export function jobScheduleSpace(o: JobUnderTestOptions, kinds: readonly FaultKind[], s: { horizonMs: number; maxForMs?: number; maxFaults?: number }): ScheduleSpace {
  return spaceOf(jobTargetNames(o), kinds, s);
}

/** Checks a schedule's names against the job `o` would start, before anything starts (checkTargets reads only the names). */
function checkScheduleNames(schedule: readonly FaultSpec[], o: JobUnderTestOptions): void {
  const n = jobTargetNames(o);
  const named = (xs: string[]) => Object.fromEntries(xs.map((x) => [x, true]));
  const placeholders = {
    processes: named(n.processes), links: named(n.links), engines: named(n.engines), actors: named(n.actors),
    commands: named(n.commands), disks: named(n.disks), natsServers: named(n.natsServers), ...(n.nats ? { nats: true } : {}),
  };
  checkTargets(schedule, placeholders as unknown as FaultTargets);
}

/** Starts a topology's job under test; see job-types.ts. */
export async function startJobUnderTest(o: JobUnderTestOptions): Promise<JobUnderTest> {
  const { topology: overridden, baseDir, train: train0, engines } = jobConfig(o); // errors name the field, before anything starts
  const proxied = (o.engines ?? "proxied") === "proxied";
  const train: TrainConfig = { ...train0, recordTokens: proxied || train0.recordTokens };
  const out = resolve(o.out);
  rmSync(out, { recursive: true, force: true });
  mkdirSync(join(out, "engine-outputs"), { recursive: true });
  const lines: string[] = [];
  let clock = Date.now(); // from the job's start on: the faults' clock (their `at`)
  const log = (l: string) => {
    const line = `${Date.now() - clock} ms ${l}`;
    lines.push(line);
    o.log?.(line);
  };
  const started: { nats: NatsServerHandle | null; link: CutProxy | null; serves: Awaited<ReturnType<typeof startServe>>[]; proxies: EngineFaultProxy[] } = { nats: null, link: null, serves: [], proxies: [] };
  const closeAll = async () => {
    for (const p of started.proxies) await p.close();
    for (const s of started.serves) await stopChild(s.child);
    await started.link?.close();
    await started.nats?.stop();
  };
  let natsTarget: { url: string; token: string | null; replicas?: number };
  const targets: FaultTargets = { ...(o.targets ?? {}) };
  try {
    if (o.nats?.cluster) {
      const c = o.nats.cluster;
      await c.waitJetStream();
      natsTarget = { url: c.urls, token: c.token, replicas: o.nats.replicas ?? 3 };
      targets.natsServers = { ...Object.fromEntries(c.servers.map((s, i) => [`s${i}`, s])), "meta-leader": c.metaLeaderServer, ...(o.targets?.natsServers ?? {}) };
      targets.links = { ...c.partitions, ...(o.targets?.links ?? {}) };
    } else {
      started.nats = await startTestNats();
      started.link = await createCutProxy(started.nats.port);
      natsTarget = { url: `nats://127.0.0.1:${started.link.port}`, token: started.nats.token };
      targets.nats = started.nats;
      targets.links = { "job-nats": started.link, ...(o.targets?.links ?? {}) };
    }
    let jobEngines = engines;
    let topology = overridden;
    if (proxied) {
      const slots = engineSlots(overridden, train, engines, baseDir);
      const proxyOf = new Map<EngineSlot, string>();
      for (const [k, slot] of slots.entries()) {
        let url = slot.url;
        if (slot.serve) {
          started.serves.push(await startServe(slot.serve));
          url = started.serves.at(-1)!.url;
        }
        started.proxies.push(await startEngineFaultProxy(url!, { kind: null }, { record: join(out, "engine-outputs", `engine-${k}.jsonl`) }));
        proxyOf.set(slot, started.proxies.at(-1)!.url);
      }
      const proxiesOf = (fleet: string | null) => slots.filter((x) => x.fleet === fleet).map((x) => proxyOf.get(x)!);
      jobEngines = { ...engines, count: 0, urls: proxiesOf(null) };
      // A fleet actor reaches its engines, embedded ones included, through their proxies only.
      topology = {
        ...overridden,
        actors: overridden.actors.map((a) => {
          if (a.kind !== "fleet") return a;
          const { embedded: _embedded, ...config } = a.config ?? {};
          return { ...a, config: { ...config, engines: proxiesOf(a.name) } };
        }),
      };
      targets.engines = { ...Object.fromEntries(started.proxies.map((p, k) => [`engine-${k}`, p])), ...(o.targets?.engines ?? {}) };
    }
    let crashActor: ((name: string) => boolean) | null = null;
    targets.actors = { ...Object.fromEntries(JOB_ACTORS.map((a) => [a, () => crashActor?.(a) ?? false])), ...(o.targets?.actors ?? {}) };
    // The worker's latest pid (logged at start and after each restart), and only while that process
    // is still a trainer worker: pids are reused (pid_max can be 32768), and a stale one must never
    // send a fault to whatever process took it over.
    const workerPid = () => {
      const pids = lines.map((l) => /trainer: worker pid (\d+)/.exec(l)?.[1]).filter(Boolean);
      const pid = pids.length > 0 ? Number(pids.at(-1)) : null;
      return pid !== null && isTrainerWorker(pid) ? pid : null;
    };
    targets.processes = { "trainer-worker": workerPid, ...(o.targets?.processes ?? {}) };

    const bound = train.mode === "sync" ? 0 : train.mode === "async" ? 1 : fullyAsyncLimits(train).maxStaleness;
    const invariants: Invariant[] = [
      slotsPerEpisode(train) > 1 ? everyEpisodeOnce(slotsPerEpisode(train)) : everySampleOnce,
      noFailedSamples,
      versionsIncrease,
      stalenessWithin(bound),
      ...(proxied ? [tokensAsSampled()] : []),
      noActorLeftCrashed,
      finishesWithin(o.deadlineMs),
    ];

    const ctl = new AbortController();
    let timedOut = false;
    let onStarted!: () => void;
    let startFailed!: (e: unknown) => void;
    const startedP = new Promise<void>((res, rej) => ((onStarted = res), (startFailed = rej)));
    startedP.catch(() => undefined); // also observed through outcome
    const t0 = Date.now();
    const deadline = setTimeout(() => {
      timedOut = true;
      ctl.abort();
    }, o.deadlineMs);
    let running = true;
    const jobRun = runTrainJob({
      topology,
      train,
      engines: jobEngines,
      out,
      job: o.job ?? `test-${process.pid}-${jobs++}`,
      nats: natsTarget,
      verbose: true,
      log,
      signal: ctl.signal,
      onStart: (info) => {
        clock = Date.now();
        crashActor = info.crashActor;
        onStarted();
      },
    }).then(
      () => null,
      (e: unknown) => (e instanceof Error ? e.message : String(e)),
    );
    // Stopped at its deadline, a job gets STOP_GRACE_MS to end; one stuck stopping (a NATS cluster
    // re-electing, say) is reported as such, and close() then takes its servers away under it.
    const ended = new Promise<string | null>((resolveEnd) => {
      void jobRun.then(resolveEnd);
      ctl.signal.addEventListener("abort", () => setTimeout(() => resolveEnd(`the job did not stop within ${STOP_GRACE_MS} ms of its deadline`), STOP_GRACE_MS).unref(), { once: true });
    });
    const outcome: Promise<JobOutcome> = ended.then((error) => {
      running = false;
      clearTimeout(deadline);
      startFailed(new OozeError("INTERNAL", `the job under test did not start: ${error ?? "it ended before its actors ran"}`));
      return { dir: out, finished: !timedOut, durationMs: Date.now() - t0, error };
    });

    return {
      out,
      targets,
      invariants,
      started: startedP,
      outcome,
      space: (kinds, s) => spaceOf(namesOf(targets), kinds, s),
      logs: () => ({
        job: lines.join("\n"),
        ...Object.fromEntries(started.serves.map((s, k) => [`engine-${k}`, s.log()])),
        ...(started.nats ? { "nats-server": started.nats.logTail() } : {}),
      }),
      async close() {
        if (running) ctl.abort();
        await outcome;
        await closeAll();
        await Promise.race([jobRun, new Promise((r) => setTimeout(r, STOP_GRACE_MS).unref())]);
      },
    };
  } catch (e) {
    await closeAll();
    throw e;
  }
}

/** Runs the job once under a schedule and checks its invariants; see job-types.ts. */
export async function runJobSchedule(o: JobUnderTestOptions, schedule: FaultSpec[], invariants?: JobInvariants): Promise<FaultReport> {
  let verdicts: Verdict[];
  let applied: FaultReport["applied"] = [];
  let logs: Record<string, string> = {};
  let job: JobUnderTest | null = null;
  schedule = parseFaultSchedule(schedule); // a malformed spec or a missing target fails before anything starts
  checkScheduleNames(schedule, o);
  try {
    job = await startJobUnderTest(o);
    let player: FaultPlayer | null = null;
    const j = job;
    void j.started.then(
      () => (player = playFaults(schedule, j.targets)),
      () => undefined,
    );
    const outcome = await job.outcome;
    applied = player ? await (player as FaultPlayer).stop() : [];
    if (player === null && outcome.error !== null) throw new OozeError("INTERNAL", `the job did not start, so no fault was injected: ${outcome.error}`);
    verdicts = await checkInvariants(outcome, typeof invariants === "function" ? invariants(job.invariants) : (invariants ?? job.invariants));
  } catch (e) {
    if (e instanceof OozeError && e.code === "CONFIG_INVALID") {
      await job?.close();
      throw e; // a bad topology, override or schedule: the caller's error, not the job's
    }
    verdicts = [{ name: "the job under test starts", ok: false, detail: e instanceof Error ? e.message : String(e) }];
  }
  if (job) {
    logs = job.logs();
    await job.close();
    logs = { ...logs, ...job.logs() }; // the engines' last lines, written while they stopped
  }
  return { schedule, applied, verdicts, logs, seed: null, path: null, replay: null };
}

/** Whether `pid` runs a trainer worker (the native one's worker/main, or the PyTorch one's ooze_torch), by its command line. */
function isTrainerWorker(pid: number): boolean {
  try {
    const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
    return /worker[/\\]main\.(ts|js)|ooze_torch/.test(cmd);
  } catch {
    return false;
  }
}
