// `ooze up FILE`: runs a topology — starts (or joins) NATS, starts one `ooze node` child process per
// local host, supervises them (a node process that dies is restarted with backoff, within the
// topology's restart intensity, else the job stops with a readable error), prints lifecycle events,
// and on Ctrl-C / SIGTERM / `ooze down` drains every node and stops.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { basename } from "node:path";
import type { Command } from "commander";
import { decode } from "../../../src/codec/index.ts";
import type { LifecycleEvent } from "../../../src/actor/index.ts";
import { OozeError } from "../../../src/errors.ts";
import { oozeBin } from "../../../src/package-root.ts";
import { resolvePolicy, RestartTracker } from "../../../src/supervisor/policy.ts";
import { loadTopology } from "../../../src/topology/load.ts";
import { nodeDown, nodeStatus } from "../../../src/topology/node.ts";
import { connectBus, resolveNatsUrl, resolveReplicas, type Bus } from "../../../src/transport/bus.ts";
import { jobNames } from "../../../src/transport/names.ts";
import { startNatsServer, type NatsServerHandle } from "../../../src/transport/nats-server.ts";
import { removeJob, writeJob } from "../job-records.ts";
import { ensureJobAssets, nodeUsers, removeHostCredentials, writeHostCredentials } from "../node-credentials.ts";
import { dashFromTopology } from "./dash.ts";

interface UpOptions {
  nats?: string;
  replicas?: string;
  job?: string;
  duration?: string;
  quiet?: boolean;
  dash?: boolean;
  dashPort?: string;
}

export function register(program: Command) {
  program
    .command("up")
    .description("run a topology: NATS, one process per host, supervised; Ctrl-C drains and stops")
    .argument("<file>", "topology YAML file")
    .option("--nats <urls>", "use this NATS server (nats://token@host:port), or a cluster's servers comma-separated, instead of an embedded one")
    .option("--replicas <n>", "replicas of the job's streams, KV buckets and object stores (default 1; 3 with three or more --nats servers)")
    .option("--job <name>", "job id (default: topology name + random suffix)")
    .option("--duration <seconds>", "drain and stop after this many seconds")
    .option("--quiet", "do not print lifecycle events")
    .option("--dash", "serve the dashboard (app/dash) while the job runs; its URL is printed")
    .option("--dash-port <n>", "port of the dashboard (implies --dash)")
    .action(async (file: string, opts: UpOptions) => {
      process.exitCode = await up(file, opts);
    });
}

async function up(file: string, opts: UpOptions): Promise<number> {
  const topology = loadTopology(file);
  const job = opts.job ?? `${topology.name}-${randomBytes(3).toString("hex")}`;
  const say = (line: string) => process.stderr.write(`[ooze] ${line}\n`);
  const target = resolveNatsUrl(opts.nats, process.env, topology.nats);
  let server: NatsServerHandle | null = null;
  let natsUrl: string;
  // ooze up's own credentials; with the embedded server, each host's node gets a user of its own,
  // confined to the job's subjects and streams (node-credentials.ts)
  let auth: { token: string | null; user: string | null; pass: string | null };
  const hostUsers = target ? null : nodeUsers(job, topology);
  if (target) {
    natsUrl = target.url;
    auth = { token: target.token, user: target.user, pass: target.pass };
    say(`job ${job}: using NATS at ${natsUrl} (${target.source})`);
  } else {
    server = await startNatsServer({ host: topology.nats.host, maxPayload: topology.nats.maxPayload, users: [...hostUsers!.values()] });
    natsUrl = server.url;
    auth = { token: null, user: server.user, pass: server.token };
    say(`job ${job}: embedded nats-server at ${natsUrl} (JetStream, a NATS user per host limited to the job's subjects, store ${server.storeDir})`);
  }
  const replicas = resolveReplicas(natsUrl, server !== null, opts.replicas, topology.nats.replicas);
  if (replicas > 1) say(`job ${job}: streams, KV buckets and object stores with ${replicas} replicas`);
  const busAuth = auth.user !== null && auth.pass !== null ? { user: auth.user, pass: auth.pass } : auth.token ? { token: auth.token } : {};
  const bus = await connectBus({ url: natsUrl, ...busAuth, name: `ooze-up-${job}`, largeBucket: jobNames(job).objLarge, replicas });
  const names = jobNames(job);
  // The nodes' users may not create streams: make the job's now.
  if (hostUsers !== null) await ensureJobAssets(bus, topology, job);
  if (!opts.quiet) {
    bus.subscribe(names.eventsAll, {
      handler: (m) => {
        try {
          const env = decode(m.data) as { body?: LifecycleEvent };
          const e = env.body;
          if (e?.kind) say(`${e.actor}: ${e.kind}${e.error ? ` (${e.error.code}: ${e.error.message})` : ""}`);
        } catch {
          // not an event we know how to print
        }
      },
    });
  }

  const local = topology.hosts.filter((h) => h.start === "local").map((h) => h.name);
  const external = topology.hosts.filter((h) => h.start === "external").map((h) => h.name);
  writeJob({ job, natsUrl, token: auth.token, user: auth.user, password: auth.pass, pid: process.pid, topology: topology.file, hosts: topology.hosts.map((h) => h.name), startedAt: new Date().toISOString() });
  if (external.length && hostUsers !== null) {
    for (const h of external) {
      const envFile = writeHostCredentials(job, h, natsUrl, hostUsers.get(h)!);
      say(`host ${h} is started elsewhere: copy ${envFile} (its NATS user; owner-only) there and run: (set -a; . ./${basename(envFile)}; ooze node --job ${job} --topology ${file} --host ${h})`);
    }
  } else if (external.length)
    say(`hosts started elsewhere: ${external.join(", ")} — on each run: ooze node --nats nats://TOKEN@HOST:PORT --job ${job} --topology ${file} --host NAME`);

  const dash = await dashFromTopology(topology, opts, { bus, id: job, hosts: topology.hosts.map((h) => h.name) }, {}, say);
  const policy = resolvePolicy(topology.supervision);
  const children = new Map<string, ChildProcess>();
  let shuttingDown = false;
  let failure: OozeError | null = null;
  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));

  const nodeEnv = (host: string): NodeJS.ProcessEnv => {
    const { OOZE_NATS_TOKEN: _t, OOZE_NATS_USER: _u, OOZE_NATS_PASSWORD: _p, ...env } = process.env;
    const u = hostUsers?.get(host);
    if (u !== undefined) return { ...env, OOZE_NATS_USER: u.user, OOZE_NATS_PASSWORD: u.password };
    if (auth.user !== null && auth.pass !== null) return { ...env, OOZE_NATS_USER: auth.user, OOZE_NATS_PASSWORD: auth.pass };
    return { ...env, ...(auth.token ? { OOZE_NATS_TOKEN: auth.token } : {}) };
  };
  const startHost = (host: string, tracker: RestartTracker) => {
    const child = spawn(process.execPath, [oozeBin(), "node", "--nats", natsUrl, "--replicas", String(replicas), "--job", job, "--topology", topology.file!, "--host", host, "--parent-pid", String(process.pid)], {
      stdio: ["ignore", "inherit", "inherit"],
      env: nodeEnv(host),
    });
    children.set(host, child);
    child.on("exit", (code, signal) => {
      children.delete(host);
      if (shuttingDown || code === 0) {
        // a clean exit is a node told to stop (`down`), not a crash
        if (!shuttingDown) say(`node ${host} stopped`);
        if (children.size === 0) resolveDone();
        return;
      }
      const why = signal ? `killed by ${signal}` : `exited with code ${code}`;
      // exit code 78 (EX_CONFIG): the node failed in a way a restart cannot cure
      const err = new OozeError("WORKER_DIED", `node '${host}' ${why}`, { retryable: code !== 78 });
      const decision = tracker.onCrash(err);
      if (decision.kind === "restart") {
        say(`node ${host} ${why}; restarting in ${Math.round(decision.delayMs)} ms (restart ${decision.attempt})`);
        setTimeout(() => !shuttingDown && startHost(host, tracker), decision.delayMs);
      } else {
        failure = new OozeError("ACTOR_ESCALATED", `node '${host}' ${why} and exceeded ${policy.maxRestarts} restarts in ${policy.periodMs} ms; stopping job ${job}`);
        say(failure.message);
        void shutdown();
      }
    });
  };

  const shutdown = async () => {
    if (shuttingDown) return;
    shuttingDown = true;
    say(`draining and stopping job ${job}…`);
    // Local nodes drain on SIGTERM (even one still starting); external ones are told over NATS.
    children.forEach((c) => c.kill("SIGTERM"));
    await Promise.allSettled(external.map((h) => nodeDown(bus, job, h)));
    if (children.size === 0) resolveDone();
    const killer = setTimeout(() => children.forEach((c) => c.kill("SIGKILL")), 15_000);
    await done;
    clearTimeout(killer);
    await dash?.close();
    await bus.close();
    await server?.stop();
    removeJob(job);
    removeHostCredentials(job, external);
    say(`job ${job} stopped`);
  };

  for (const host of local) startHost(host, new RestartTracker(policy));
  process.once("SIGINT", () => void shutdown());
  process.once("SIGTERM", () => void shutdown());
  if (local.length === 0) say("no local hosts: waiting for external nodes (Ctrl-C to stop)");
  void waitReady(bus, job, [...local, ...external], () => shuttingDown).then((ok) => {
    if (!ok) return;
    say(`all ${local.length + external.length} node(s) running; ${opts.duration ? `stopping in ${opts.duration} s` : "Ctrl-C or 'ooze down' to stop"}`);
    if (opts.duration !== undefined) setTimeout(() => void shutdown(), Number(opts.duration) * 1000);
  });
  await done;
  await shutdown();
  return failure ? 1 : 0;
}

/** Polls every node until it answers `ps` (true), or until `cancelled()` (false). */
async function waitReady(bus: Bus, job: string, hosts: string[], cancelled: () => boolean): Promise<boolean> {
  const pending = new Set(hosts);
  while (pending.size > 0) {
    if (cancelled()) return false;
    for (const h of [...pending]) {
      try {
        await nodeStatus(bus, job, h, 500);
        pending.delete(h);
      } catch {
        // not up yet
      }
    }
    if (pending.size > 0) await new Promise((r) => setTimeout(r, 100));
  }
  return !cancelled();
}
