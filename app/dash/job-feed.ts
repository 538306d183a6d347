// A running job, live, for the dashboard, all from its NATS bus: lifecycle events and step metrics
// through ordered consumers on the job's EVENTS and METRICS streams (from their first message, so a
// dashboard that starts late shows the run so far, resuming after the last sequence seen if the
// consumer fails), the nodes' actors through the control `ps` request `ooze ps` makes (again after
// each lifecycle event, and every few seconds for mailbox depths), the engines KV bucket watched for
// attach/detach, the fleet actor's `list` (health, model, versions) with each engine's own load and
// prefix-cache hit rate (its /v1/loads and /server_info, through the engine client), and the
// versions KV bucket (each weight version the engines serve, with what its sync sent).
import type { JsMsg } from "@nats-io/jetstream";
import type { KvEntry } from "@nats-io/kv";
import { attachBus, createSystem, remoteRef, type ActorSystem, type LifecycleEvent } from "../../src/actor/index.ts";
import { decode, decodeMessage } from "../../src/codec/index.ts";
import { EngineClient } from "../../src/engine/client.ts";
import type { EngineEntry } from "../../src/engine/fleet/fleet.ts";
import { nodeStatus } from "../../src/topology/node.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { askFleet, type FleetMsg } from "../../actors/protocol/fleet-messages.ts";
import { metricsRegistry, versionRecord } from "../../actors/protocol/messages.ts";
import type { DashEngine, DashHub, DashMetrics } from "./hub.ts";

/** Options of followJob. */
export interface JobFeedOptions {
  bus: Bus;
  job: string;
  /** The job's hosts (node names), as its job record or topology lists them. */
  hosts: string[];
  hub: DashHub;
  /** Name of the fleet actor (default "fleet"). */
  fleetActor?: string;
  /** Refresh of `ps` and the fleet's `list`, ms (default 2000). */
  refreshMs?: number;
  log?: (line: string) => void;
}

/** A followed job. */
export interface JobFeed {
  stop(): Promise<void>;
}

const untext = new TextDecoder();
const message = (e: unknown) => (e as Error)?.message ?? String(e);

/** Starts following `job`; the hub fills as data arrives. */
export async function followJob(o: JobFeedOptions): Promise<JobFeed> {
  const { bus, job, hub } = o;
  const names = jobNames(job);
  const refreshMs = o.refreshMs ?? 2_000;
  const fleetActor = o.fleetActor ?? "fleet";
  const log = o.log ?? (() => undefined);
  let stopped = false;
  const stops: (() => void)[] = [];
  hub.setJob({ id: job, nats: bus.url }, null);
  stops.push(
    bus.onStatus((st) => {
      if (st.type === "disconnect" || st.type === "reconnecting") hub.setJob({ id: job, nats: bus.url }, `lost the connection to NATS at ${bus.url}; reconnecting (the job may have stopped)`);
      if (st.type === "reconnect") hub.setJob({ id: job, nats: bus.url }, null);
    }),
  );

  // Nodes: `ps` on each, after lifecycle events (debounced) and on a timer.
  let psRunning: Promise<void> | null = null;
  let psAgain = false;
  const refreshHosts = (): void => {
    if (psRunning) {
      psAgain = true;
      return;
    }
    psRunning = (async () => {
      do {
        psAgain = false;
        await Promise.all(
          o.hosts.map(async (host) => {
            try {
              const s = await nodeStatus(bus, job, host, 2_000);
              hub.setHost({ host, pid: s.pid, actors: s.actors, error: s.failure?.message ?? null, at: Date.now() });
            } catch (e) {
              const prev = hub.snapshot().hosts[host];
              hub.setHost({ host, pid: prev?.pid ?? null, actors: prev?.actors ?? [], error: `not answering: ${message(e)}`, at: Date.now() });
            }
          }),
        );
      } while (psAgain && !stopped);
      psRunning = null;
    })();
  };

  // Fleet: a `list` ask through a system of our own (no actors, serves nothing, publishes no events).
  const system: ActorSystem = createSystem({ name: `${job}-dash`, log: () => {} });
  await attachBus(system, bus, { job, serve: false, events: false });
  const fleet = remoteRef<FleetMsg>(system, fleetActor);
  let listing = false;
  let failures = 0;
  const clients = new Map<string, EngineClient>();
  const refreshFleet = async (): Promise<void> => {
    if (listing || stopped) return;
    listing = true;
    try {
      const r = await askFleet(fleet, { op: "list" }, Math.max(1_000, refreshMs));
      failures = 0;
      hub.setEngines(await Promise.all(r.engines.map((e) => engineOf(e, clients, refreshMs))), r.weightVersion, null);
    } catch (e) {
      // A fleet busy with a weight update may miss one refresh: say so from the third miss in a row.
      if (++failures < 3) return;
      const why = `fleet actor '${fleetActor}' (${names.actor(fleetActor)}) did not answer: ${message(e)}`;
      hub.setEngines(hub.snapshot().engines, hub.snapshot().fleetVersion, why);
    } finally {
      listing = false;
    }
  };

  const tick = () => {
    if (stopped) return;
    refreshHosts();
    void refreshFleet();
  };
  tick();
  const timer = setInterval(tick, refreshMs);
  stops.push(() => clearInterval(timer));

  // Streams: lifecycle events and step metrics.
  const events = followStream(bus, names.streamEvents, () => stopped, log, (m) => {
    const e = (decode(m.data) as { body?: LifecycleEvent }).body;
    if (!e?.kind) return;
    hub.addEvent({ kind: e.kind, system: e.system, actor: e.actor, at: e.at, restarts: e.restarts, error: e.error ? { code: e.error.code, message: e.error.message } : null });
    refreshHosts();
  });
  const metrics = followStream(bus, names.streamMetrics, () => stopped, log, async (m) => {
    const { body } = decodeMessage(m.data.length > 0 ? m.data : await bus.payload(m), metricsRegistry);
    hub.addMetrics({ ...(body.metrics as DashMetrics), step: body.step });
  });

  // KV: engine attach/detach, weight versions.
  const engineWatch = watchKv(bus, names.kvEngines, { history: 1 }, "engine.>", () => stopped, log, (e) => {
    const url = Buffer.from(e.key.slice("engine.".length), "base64url").toString("utf8");
    if (e.operation === "PUT") {
      const v = JSON.parse(untext.decode(e.value)) as { url?: string; source?: string; attachedAt?: number };
      hub.addEngineEvent({ at: v.attachedAt ?? e.created.getTime(), kind: "attached", url: v.url ?? url, source: v.source ?? null });
    } else hub.addEngineEvent({ at: e.created.getTime(), kind: "detached", url, source: null });
    void refreshFleet();
  });
  const versionWatch = watchKv(bus, names.kvVersions, { history: 8 }, "latest", () => stopped, log, (e) => {
    if (e.operation !== "PUT" || e.value.length === 0) return;
    const r = versionRecord.parse(JSON.parse(untext.decode(e.value)));
    hub.addVersion({ version: r.version, step: r.step, at: r.at, sync: r.sync ?? null });
  });

  return {
    async stop() {
      stopped = true;
      for (const s of stops) s();
      await Promise.allSettled([events.stop(), metrics.stop(), engineWatch.stop(), versionWatch.stop(), psRunning]);
      await system.stop().catch(() => undefined);
    },
  };
}

/**
 * One engine as the page shows it: the fleet's entry, with the load the engine itself reports
 * (/v1/loads: the rollout's requests, which the fleet actor does not route) and, for ooze engines,
 * the prefix-cache hit rate from /server_info (null where the engine does not say).
 */
async function engineOf(e: EngineEntry, clients: Map<string, EngineClient>, timeoutMs: number): Promise<DashEngine> {
  let client = clients.get(e.url);
  if (!client) clients.set(e.url, (client = new EngineClient(e.url, { retries: 0, timeoutMs: Math.max(500, timeoutMs) })));
  const [load, info] = await Promise.all([client.loads().catch(() => null), client.serverInfo().catch(() => null)]);
  return {
    url: e.url,
    healthy: e.healthy,
    inFlight: e.inFlight,
    weightVersion: e.weightVersion,
    source: e.source,
    lastError: e.lastError,
    attachedAt: e.attachedAt,
    model: e.model,
    load: load ? { running: load.running, waiting: load.waiting } : null,
    cacheHitRate: info ? hitRate(info) : null,
  };
}

/** hitTokens / promptTokens of an ooze engine's /server_info (internal_states[0].cache), or null. */
function hitRate(info: Record<string, unknown>): number | null {
  const states = info.internal_states;
  const cache = Array.isArray(states) ? (states[0] as { cache?: { promptTokens?: unknown; hitTokens?: unknown } } | undefined)?.cache : undefined;
  if (typeof cache?.promptTokens !== "number" || typeof cache.hitTokens !== "number") return null;
  return cache.promptTokens > 0 ? cache.hitTokens / cache.promptTokens : 0;
}

/**
 * Runs `open` (which returns an iterable it may stop, and the loop over it) again and again until
 * stopped: after a failure, or when the iteration ends, it waits 500 ms; a failure is logged once
 * per distinct message. Returns the stop function, which ends the current iteration.
 */
function retrying(what: string, stopped: () => boolean, log: (l: string) => void, open: () => Promise<{ it: { stop(): void }; run: Promise<void> }>) {
  let current: { stop(): void } | null = null;
  let lastError = "";
  const loop = (async () => {
    while (!stopped()) {
      try {
        const { it, run } = await open();
        current = it;
        if (stopped()) it.stop();
        await run;
      } catch (e) {
        // The stream or bucket is not there yet (the job is starting), or the connection was lost.
        const why = message(e);
        if (why !== lastError && !stopped()) log(`dashboard: ${what}: ${why}; trying again`);
        lastError = why;
      }
      current = null;
      if (!stopped()) await new Promise((r) => setTimeout(r, 500));
    }
  })();
  return {
    stop: async () => {
      current?.stop();
      await loop;
    },
  };
}

/**
 * Reads a stream from its first message with an ordered consumer, calling `on` for each (a message
 * `on` cannot read is logged and skipped); waits for a stream that does not exist yet, and after a
 * failure continues after the last sequence it saw.
 */
function followStream(bus: Bus, stream: string, stopped: () => boolean, log: (l: string) => void, on: (m: JsMsg) => void | Promise<void>) {
  let lastSeq = 0;
  return retrying(`reading ${stream}`, stopped, log, async () => {
    const start = lastSeq === 0 ? { deliver_policy: "all" } : { deliver_policy: "by_start_sequence", opt_start_seq: lastSeq + 1 };
    const msgs = await (await bus.js.consumers.get(stream, start as never)).consume();
    const run = (async () => {
      for await (const m of msgs) {
        lastSeq = m.seq;
        try {
          await on(m);
        } catch (e) {
          log(`dashboard: skipped message ${m.seq} of ${stream}: ${message(e)}`);
        }
      }
    })();
    return { it: msgs, run };
  });
}

/** Watches keys of a KV bucket (its history included), calling `on` for each entry; watches again after a failure. */
function watchKv(bus: Bus, bucket: string, opts: { history: number }, key: string, stopped: () => boolean, log: (l: string) => void, on: (e: KvEntry) => void) {
  let lastRevision = 0;
  return retrying(`watching ${bucket}`, stopped, log, async () => {
    const kv = await bus.kv(bucket, opts);
    const it = await kv.watch(lastRevision === 0 ? { key, include: "history" } : { key, resumeFromRevision: lastRevision + 1 });
    const run = (async () => {
      for await (const e of it) {
        lastRevision = e.revision;
        try {
          on(e);
        } catch (err) {
          log(`dashboard: skipped ${bucket} entry ${e.key}: ${message(err)}`);
        }
      }
    })();
    return { it, run };
  });
}
