// `ooze train` as a job of actors: the topology's loop roles (train.rollout, train.buffer,
// train.trainer, train.weight-sync) and a `fleet` actor for its engines (made from the `engines:`
// section unless the topology has one) run on an embedded nats-server and exchange their messages
// over its JetStream streams, exactly as under `ooze up`. Every host of the topology runs as a node
// in this process (each its own actor system on the bus). The trainer writes OUT/metrics.jsonl,
// batches.jsonl, reward.svg and checkpoints and stops the job after its last step; each step's
// metrics also come over the bus (the progress display). `--resume` starts a new job whose trainer
// continues at the run's latest checkpoint and whose buffer continues at the data position it
// announces. This is the composition root of the loop, so it may import actors/.
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { trainSchema, type EnginesConfig, type TrainConfig } from "../../actors/protocol/config.ts";
import { metricsRegistry } from "../../actors/protocol/messages.ts";
import { readJsonl, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { latestCheckpoint } from "../../actors/protocol/state.ts";
import { decodeMessage } from "../../src/codec/index.ts";
import { OozeError } from "../../src/errors.ts";
import { startNode, type RunningNode } from "../../src/topology/node.ts";
import type { ActorSpec, Topology } from "../../src/topology/schema.ts";
import { connectBus, type Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { startNatsServer } from "../../src/transport/nats-server.ts";
import { resolveKind } from "./kinds.ts";

/** The loop's roles: each runs once per job (the rollout may run several instances). */
const ROLES = ["train.rollout", "train.buffer", "train.trainer", "train.weight-sync"] as const;

/** Options of runTrainJob. */
export interface TrainJobOptions {
  topology: Topology;
  /** The topology's `train:` section with the command line's overrides. */
  train: TrainConfig;
  engines: EnginesConfig;
  /** Run directory. */
  out: string;
  /** Continue the run in `out` from its latest checkpoint. */
  resume?: boolean;
  /** A running NATS server or cluster (JetStream; URLs comma-separated) to use instead of an embedded one; `replicas` of the job's streams (default 1). */
  nats?: { url: string; token: string | null; replicas?: number };
  /** The job id (default: the one the run directory recorded, or the topology's name and a random suffix). */
  job?: string;
  /** Lines worth showing (warnings, errors; every actor line with `verbose`). */
  log?: (line: string) => void;
  verbose?: boolean;
  /**
   * Called once every node runs. `crashActor(name)` crashes the running actor of that name (or its
   * first instance, `name/0`) through its supervisor, as if its handler threw (fault injection);
   * false when none is running.
   */
  onStart?(info: { job: string; natsUrl: string; hosts: string[]; step: number; crashActor(name: string): boolean }): void;
  onStep?(m: StepMetrics): void;
  /** Called once the job's bus is up, before its nodes start (the dashboard); what it returns is awaited before the bus closes. */
  onBus?(job: { bus: Bus; id: string; hosts: string[] }): Promise<{ close(): Promise<void> } | null>;
  /** Aborting it drains the job and stops it (the trainer checkpoints what it trained). */
  signal?: AbortSignal;
}

/** What a run reports at its end. */
export interface TrainSummary {
  job: string;
  steps: number;
  seconds: number;
  samples: number;
  rewardFirst: number | null;
  rewardLast: number | null;
  /** Mean reward over the last 5 steps. */
  rewardTail: number | null;
  /** Mean success rate of the last 5 steps. */
  successTail: number | null;
  weightVersion: number;
  trainerRestarts: number;
  checkpoint: string | null;
  metricsPath: string;
  svgPath: string;
}

/**
 * The topology `ooze train` runs: its actors, the trainer writing to `out`, the loop's missing roles
 * added, and a fleet actor from `engines:` when it has none. Paths in it stay relative to its file.
 */
export function trainTopology(topo: Topology, train: TrainConfig, engines: EnginesConfig, out: string): Topology {
  const where = topo.file ?? "topology";
  checkTrainModel(topo, train);
  // Every node of `ooze train` runs on this machine: engines load full checkpoints from the trainer's
  // directory (weight-sync transport `directory`) unless the topology says otherwise; `ooze up` passes
  // them through the job's object store.
  const actors: ActorSpec[] = topo.actors.map((a) =>
    a.kind === "train.trainer" ? { ...a, config: { ...a.config, out } } : a.kind === "train.weight-sync" ? { ...a, config: { transport: "directory", ...a.config } } : a,
  );
  const base = (name: string, kind: string): ActorSpec => ({ name, kind, count: 1, config: {}, durable: false });
  for (const kind of ROLES) {
    const n = actors.filter((a) => a.kind === kind).length;
    if (n === 0) actors.push(kind === "train.trainer" ? { ...base("trainer", kind), config: { out } } : kind === "train.weight-sync" ? { ...base("weight-sync", kind), config: { transport: "directory" } } : base(kind.slice("train.".length), kind));
    else if (n > 1 && kind !== "train.rollout") throw new OozeError("TOPOLOGY_INVALID", `${where}: the loop runs one '${kind}' actor; the topology has ${n}`);
  }
  if (!actors.some((a) => a.kind === "fleet")) {
    const baseDir = topo.file ? dirname(topo.file) : process.cwd();
    const spec = train.model !== undefined ? { modelDir: isAbsolute(train.model) ? train.model : resolve(baseDir, train.model) } : { preset: train.preset, seed: train.seed };
    const embedded = engines.count > 0 ? { embedded: { count: engines.count, maxRunning: engines.maxRunning, cacheTokens: engines.cacheTokens, ...spec } } : {};
    // The fleet starts first: the rollout waits for its engines.
    actors.unshift({ ...base("fleet", "fleet"), config: { healthIntervalMs: 5000, engines: engines.urls, ...embedded } });
  } else if (topo.engines !== undefined) {
    throw new OozeError("TOPOLOGY_INVALID", `${where}: engines: and a fleet actor both describe the engines; keep one (the fleet actor's config: embedded, engines)`);
  }
  return { ...topo, actors, train: trainSchema.parse(train) };
}

/** Refuses a `train.model` that is not a model directory, naming it and how to make it (before anything starts). */
export function checkTrainModel(topo: Pick<Topology, "file">, train: TrainConfig): void {
  if (train.model === undefined) return;
  const dir = isAbsolute(train.model) ? train.model : resolve(topo.file ? dirname(topo.file) : process.cwd(), train.model);
  if (!existsSync(join(dir, "config.json")))
    throw new OozeError("CONFIG_INVALID", `${topo.file ?? "topology"}: train.model: ${dir} is not a model directory (no config.json); make it first (the topology's comments say how, e.g. with ooze sft or ooze model init)`);
}

/** The job id of a run directory: the one its trainer recorded (job.json), or a new one. */
function jobOf(out: string, name: string): string {
  const marker = join(out, "job.json");
  if (existsSync(marker)) {
    const j = JSON.parse(readFileSync(marker, "utf8")) as { job?: unknown };
    if (typeof j.job === "string") return j.job;
  }
  return `${name}-${randomBytes(3).toString("hex")}`;
}

/**
 * A resumed run directory belongs to the new job: its trainer then continues at the latest checkpoint
 * (trainer-actor.ts refuses a directory another job owns).
 */
function adopt(out: string, job: string): void {
  const marker = join(out, "job.json");
  if (!existsSync(marker)) return;
  const j = JSON.parse(readFileSync(marker, "utf8")) as { job: string; incarnation: number };
  if (j.job !== job) writeFileSync(marker, JSON.stringify({ ...j, job }));
}

/**
 * Checked before any actor starts, so that what cannot work fails the job here with the fix, not
 * after rollouts began: the agent sandbox (when agents run sandboxed), and for the PyTorch worker its
 * Python environment (installed on first use) and the model directory.
 */
async function preflight(train: TrainConfig, file: string | null, log: (line: string) => void): Promise<void> {
  // agent and reward commands run sandboxed unless written out otherwise: a machine that cannot make
  // the sandbox refuses the job here, saying what is missing
  if (train.agent && train.agent.sandbox !== "none") {
    const { assertSandboxWorks } = await import("../../actors/environment/agent/sandbox.ts");
    assertSandboxWorks();
  }
  if (train.trainer.backend !== "torch") return;
  const { ensureTorchEnv, checkTorchModel } = await import("../../native/worker/torch-env.ts");
  const python = await ensureTorchEnv((line) => log(`[torch setup] ${line}`));
  const model = train.model;
  if (model !== undefined) {
    const dir = isAbsolute(model) ? model : resolve(file ? dirname(file) : process.cwd(), model);
    checkTorchModel(python, dir);
  }
}

/** Runs (or resumes) a training job to its end; resolves with its summary. */
export async function runTrainJob(o: TrainJobOptions): Promise<TrainSummary> {
  const out = resolve(o.out);
  const metricsPath = join(out, "metrics.jsonl");
  if (o.resume) {
    // A run killed before its first checkpoint resumes at step 0: its trainer cuts the records back.
    if (!latestCheckpoint(out) && !existsSync(join(out, "job.json")))
      throw new OozeError("CONFIG_INVALID", `--resume ${o.out}: not a run directory (no checkpoints/latest.json, no job.json); run without --resume to start`);
  } else if (readJsonl(metricsPath).length > 0) {
    throw new OozeError("CONFIG_INVALID", `${metricsPath} already has steps; use --resume ${o.out} to continue, or another --out`);
  }
  mkdirSync(out, { recursive: true });
  const log = o.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const actorLog = (l: string) => {
    if (o.verbose || !/\] (info|debug) /.test(l)) log(l);
  };
  const job = o.job ?? jobOf(out, o.topology.name);
  if (o.resume) adopt(out, job);
  const names = jobNames(job);
  const topology = trainTopology(o.topology, o.train, o.engines, out);
  await preflight(o.train, o.topology.file ?? null, log);
  const external = topology.hosts.filter((h) => h.start === "external").map((h) => h.name);
  if (external.length > 0 && !o.nats)
    throw new OozeError("CONFIG_INVALID", `${o.topology.file ?? "topology"}: hosts ${external.join(", ")} are started elsewhere (start: external), so the job needs a NATS server they can reach too: pass --nats nats://TOKEN@HOST:PORT (ooze train's embedded server is private to it)`);
  const server = o.nats ? null : await startNatsServer({ host: topology.nats.host, maxPayload: topology.nats.maxPayload });
  const nats = o.nats ?? { url: server!.url, token: server!.token, replicas: 1 };
  const nodes: RunningNode[] = [];
  try {
    const bus = await connectBus({ url: nats.url, ...(nats.token ? { token: nats.token } : {}), name: `ooze-train-${job}`, largeBucket: names.objLarge, replicas: nats.replicas ?? 1 });
    let attached: { close(): Promise<void> } | null = null;
    try {
      attached = (await o.onBus?.({ bus, id: job, hosts: topology.hosts.map((h) => h.name) })) ?? null;
      bus.subscribe(names.trainMetrics, {
        handler: (m) => {
          try {
            const { body } = decodeMessage(m.data, metricsRegistry);
            o.onStep?.(body.metrics as unknown as StepMetrics);
          } catch (e) {
            log(`ooze train: a step's metrics could not be read: ${(e as Error).message}`);
          }
        },
      });
      // Hosts marked `start: external` join from their own `ooze node` processes (as with `ooze up`).
      if (external.length > 0) log(`ooze train: hosts ${external.join(", ")} are started elsewhere; on each run: ooze node --nats URL --job ${job} --topology ${o.topology.file ?? "FILE"} --host NAME`);
      for (const h of topology.hosts.filter((x) => x.start === "local")) {
        const node = await startNode({ topology, host: h.name, job, bus, resolveKind, log: actorLog });
        nodes.push(node);
        if (node.metricsUrl) actorLog(`[${job}/${h.name}] info metrics: ${node.metricsUrl}`);
      }
      const crashActor = (name: string): boolean => {
        for (const n of nodes) {
          const a = n.system.list().find((x) => x.path === name || x.path.startsWith(`${name}/`));
          if (a) return n.system.crash(a.path, "crashed by fault injection (ooze/testing)");
        }
        return false;
      };
      o.onStart?.({ job, natsUrl: nats.url, hosts: topology.hosts.map((h) => h.name), step: latestCheckpoint(out)?.state.step ?? 0, crashActor });
      const stop = () => void Promise.all(nodes.map((n) => n.stop()));
      o.signal?.addEventListener("abort", stop, { once: true });
      // A stop asked for while the nodes were starting (before the listener) is not lost.
      if (o.signal?.aborted) stop();
      const ends = await Promise.all(nodes.map((n) => n.stopped));
      o.signal?.removeEventListener("abort", stop);
      const failed = ends.find((e) => e.error !== null);
      if (failed?.error) throw failed.error;
    } finally {
      await Promise.all(nodes.map((n) => n.stop().catch(() => undefined)));
      await attached?.close().catch(() => undefined);
      await bus.close();
    }
  } finally {
    await server?.stop();
  }
  return summarize(job, out);
}

/** The summary of a run directory: metrics.jsonl and the latest checkpoint. */
export function summarize(job: string, out: string): TrainSummary {
  const metricsPath = join(out, "metrics.jsonl");
  const metrics = readJsonl<StepMetrics>(metricsPath);
  const rewards = metrics.map((m) => m.reward_mean);
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
  const latest = latestCheckpoint(out);
  const last = metrics.at(-1);
  return {
    job,
    steps: last?.step ?? latest?.state.step ?? 0,
    seconds: last?.seconds ?? 0,
    samples: metrics.reduce((n, m) => n + m.samples, 0),
    rewardFirst: rewards[0] ?? null,
    rewardLast: rewards.at(-1) ?? null,
    rewardTail: mean(rewards.slice(-5)),
    successTail: mean(metrics.slice(-5).map((m) => m.success_rate ?? m.reward_max_frac)),
    weightVersion: last?.weight_version ?? latest?.state.weightVersion ?? 0,
    trainerRestarts: metrics.reduce((n, m) => n + m.trainer_restarts, 0),
    checkpoint: latest?.dir ?? null,
    metricsPath,
    svgPath: join(out, "reward.svg"),
  };
}
