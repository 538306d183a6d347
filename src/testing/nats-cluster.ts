// A real NATS cluster for tests and fault schedules (ooze/testing): N nats-servers (default 3) on loopback, each started through
// startNatsServer with its own temp JetStream store, routed to the others (route user/password), one
// client token shared by all; resolves once JetStream's meta group has a leader, so streams with
// 3 replicas can be created at once. Servers are killed and restarted through their handles; each
// has an HTTP monitoring port (connections per server, to pick one that clients use). With
// `partitionable`, every route passes through a cut proxy of its own (one per ordered pair of
// servers), and `partitions` cuts one server's routes to all the others and heals them: a server
// partitioned away, its clients still connected to it.
import { randomBytes } from "node:crypto";
import { connectBus } from "../transport/bus.ts";
import { freePort, type NatsServerHandle, type NatsServerOptions, startNatsServer } from "../transport/nats-server.ts";

export { freePort };
import { createCutProxy, type CutProxy } from "./cut-proxy.ts";
import type { RestartableServer } from "./faults.ts";
import { waitUntil } from "./wait.ts";

/** A running test cluster. */
export interface TestNatsCluster {
  readonly servers: readonly NatsServerHandle[];
  /** The client token every server accepts. */
  readonly token: string;
  /** All client URLs, comma-separated, without credentials (what `--nats` takes with OOZE_NATS_TOKEN). */
  readonly urls: string;
  /** All client URLs with the token in the first: `nats://TOKEN@h:p1,nats://h:p2,…`. */
  readonly authUrls: string;
  /** Client connections each server holds now (its /connz; -1 for a server that is down). */
  connections(): Promise<number[]>;
  /** Routes each server has now (its /routez; -1 for a server that is down). */
  routes(): Promise<number[]>;
  /** The index of the server leading JetStream's meta group (from a live server's /jsz), or null when it has none. */
  metaLeader(): Promise<number | null>;
  /**
   * With `partitionable`: `partition-s{i}` cuts server i's routes to every other server (its clients
   * stay connected to it) until healed. Empty otherwise.
   */
  readonly partitions: Readonly<Record<string, { cut(): void; heal(): void }>>;
  /** For `nats-restart`: the server leading the meta group when kill() is called (kill throws when there is none), restarted later. */
  readonly metaLeaderServer: RestartableServer;
  /** Waits until JetStream answers with a meta leader (after a start, or after a server was killed). */
  waitJetStream(timeoutMs?: number): Promise<void>;
  /** Stops every server and removes their stores. */
  stop(): Promise<void>;
}

/** Options of startTestNatsCluster. */
export interface TestNatsClusterOptions extends Pick<NatsServerOptions, "maxPayload" | "readyTimeoutMs"> {
  /** Number of servers (default 3). */
  size?: number;
  /** Routes through cut proxies, so that a server can be partitioned away (see `partitions`). */
  partitionable?: boolean;
}

/** Starts a cluster of real nats-servers on 127.0.0.1 with JetStream, routes and token auth. */
export async function startTestNatsCluster(opts: TestNatsClusterOptions = {}): Promise<TestNatsCluster> {
  const size = opts.size ?? 3;
  const token = randomBytes(24).toString("hex");
  const user = "route";
  const pass = randomBytes(16).toString("hex");
  const name = `ooze-test-${randomBytes(3).toString("hex")}`;
  const routePorts: number[] = [];
  const clientPorts: number[] = [];
  const monitorPorts: number[] = [];
  for (let i = 0; i < size; i++) {
    routePorts.push(await freePort());
    clientPorts.push(await freePort());
    monitorPorts.push(await freePort());
  }
  // With partitionable: the route from server i to server j through proxy `${i}>${j}`.
  const proxies = new Map<string, CutProxy>();
  if (opts.partitionable)
    for (let i = 0; i < size; i++) for (let j = 0; j < size; j++) if (i !== j) proxies.set(`${i}>${j}`, await createCutProxy(routePorts[j]!));
  const routeTo = (i: number, j: number) => `nats-route://127.0.0.1:${proxies.get(`${i}>${j}`)?.port ?? routePorts[j]}`;
  const servers: NatsServerHandle[] = [];
  try {
    // Started together: a JetStream cluster elects its meta leader once a quorum is up.
    const started = await Promise.allSettled(
      routePorts.map((port, i) =>
        startNatsServer({
          host: "127.0.0.1",
          port: clientPorts[i]!,
          token,
          serverName: `${name}-s${i + 1}`,
          monitorPort: monitorPorts[i]!,
          ...(opts.maxPayload !== undefined ? { maxPayload: opts.maxPayload } : {}),
          ...(opts.readyTimeoutMs !== undefined ? { readyTimeoutMs: opts.readyTimeoutMs } : {}),
          cluster: {
            name,
            port,
            user,
            pass,
            routes: routePorts.flatMap((_, j) => (j === i ? [] : [routeTo(i, j)])),
            // nothing listens on port 1: a route learned by gossip cannot go around the proxies
            ...(opts.partitionable ? { advertise: "127.0.0.1:1" } : {}),
          },
        }),
      ),
    );
    for (const s of started) if (s.status === "fulfilled") servers.push(s.value);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
  } catch (e) {
    await Promise.all(servers.map((s) => s.stop()));
    await Promise.all([...proxies.values()].map((p) => p.close()));
    throw e;
  }
  const urls = servers.map((s) => s.url).join(",");
  // The meta group as each server's monitoring endpoint reports it (nats-server's /jsz).
  type Jsz = { meta_cluster?: { leader?: string; replicas?: { name: string; current: boolean; offline?: boolean }[] } };
  let lastMeta = "";
  const metaPeersCurrent = async (): Promise<boolean> => {
    const live = servers.map((s, i) => ({ s, i, name: `${name}-s${i + 1}` })).filter((x) => x.s.running);
    const jsz = async (i: number): Promise<Jsz | null> => {
      try {
        return (await (await fetch(`http://127.0.0.1:${monitorPorts[i]}/jsz`)).json()) as Jsz;
      } catch {
        return null;
      }
    };
    const leaderName = (await jsz(live[0]!.i))?.meta_cluster?.leader;
    const leader = live.find((x) => x.name === leaderName);
    if (!leader) {
      lastMeta = `meta leader '${leaderName ?? "none"}' is not a live server`;
      return false;
    }
    const replicas = (await jsz(leader.i))?.meta_cluster?.replicas ?? [];
    const current = live.filter((x) => x !== leader && replicas.some((r) => r.name === x.name && r.current && !r.offline));
    lastMeta = `leader ${leader.name}; current peers: ${current.map((x) => x.name).join(", ") || "none"}; replicas ${JSON.stringify(replicas)}`;
    return current.length === live.length - 1;
  };
  const cluster: TestNatsCluster = {
    servers,
    token,
    urls,
    authUrls: servers.map((s, i) => (i === 0 ? s.authUrl : s.url)).join(","),
    async connections() {
      return Promise.all(
        servers.map(async (s, i) => {
          if (!s.running) return -1;
          try {
            const r = await fetch(`http://127.0.0.1:${monitorPorts[i]}/connz`);
            return ((await r.json()) as { num_connections: number }).num_connections;
          } catch {
            return -1;
          }
        }),
      );
    },
    async routes() {
      return Promise.all(
        servers.map(async (s, i) => {
          if (!s.running) return -1;
          try {
            return ((await (await fetch(`http://127.0.0.1:${monitorPorts[i]}/routez`)).json()) as { num_routes: number }).num_routes;
          } catch {
            return -1;
          }
        }),
      );
    },
    async metaLeader() {
      for (const [i, s] of servers.entries()) {
        if (!s.running) continue;
        try {
          const leader = ((await (await fetch(`http://127.0.0.1:${monitorPorts[i]}/jsz`)).json()) as Jsz).meta_cluster?.leader;
          const at = servers.findIndex((_, j) => `${name}-s${j + 1}` === leader);
          return at >= 0 ? at : null;
        } catch {
          // this one is not answering: ask the next
        }
      }
      return null;
    },
    partitions: Object.fromEntries(
      opts.partitionable
        ? servers.map((_, i) => {
            const own = [...proxies].filter(([k]) => k.split(">").includes(String(i))).map(([, p]) => p);
            return [`partition-s${i}`, { cut: () => own.forEach((p) => p.cut()), heal: () => own.forEach((p) => p.heal()) }];
          })
        : [],
    ),
    metaLeaderServer: (() => {
      let chosen: NatsServerHandle | null = null;
      return {
        async kill(signal?: NodeJS.Signals) {
          const i = await cluster.metaLeader();
          if (i === null) throw new Error("the cluster has no JetStream meta leader to kill");
          chosen = servers[i]!;
          chosen.kill(signal);
        },
        waitExit: async () => chosen?.waitExit(),
        restart: async () => chosen?.restart(),
      };
    })(),
    async waitJetStream(timeoutMs = 30_000) {
      // Then every live server a current JetStream peer of the meta group, as its leader sees it: a
      // meta leader alone can refuse a replicated stream ("no suitable peers for placement") while
      // the other servers have not caught up.
      await waitUntil(metaPeersCurrent, {
        timeoutMs,
        intervalMs: 200,
        what: "every live server a current peer of the JetStream meta group",
        diagnostics: () => `last: ${lastMeta}`,
      });
      const live = servers.filter((s) => s.running).map((s) => s.url).join(",");
      const bus = await connectBus({ url: live, token, reconnectWaitMs: 100 });
      let last = "";
      try {
        await waitUntil(
          async () => {
            try {
              await (await bus.jsm()).getAccountInfo();
              return true;
            } catch (e) {
              last = (e as Error).message;
              return false;
            }
          },
          {
            timeoutMs,
            intervalMs: 200,
            what: `a JetStream meta leader on ${live}`,
            diagnostics: () => `last error: ${last}\n${servers.map((s) => `${s.url}:\n${s.logTail().split("\n").slice(-4).join("\n")}`).join("\n---\n")}`,
          },
        );
      } finally {
        await bus.close();
      }
    },
    async stop() {
      await Promise.all(servers.map((s) => s.stop()));
      await Promise.all([...proxies.values()].map((p) => p.close()));
    },
  };
  try {
    await cluster.waitJetStream();
  } catch (e) {
    await cluster.stop();
    throw e;
  }
  return cluster;
}
