// A real NATS cluster for tests and fault schedules (ooze/testing): N nats-servers (default 3) on loopback, each started through
// startNatsServer with its own temp JetStream store, routed to the others (route user/password), one
// client token shared by all; resolves once JetStream's meta group has a leader, so streams with
// 3 replicas can be created at once. Servers are killed and restarted through their handles; each
// has an HTTP monitoring port (connections per server, to pick one that clients use).
import { randomBytes } from "node:crypto";
import { connectBus } from "../transport/bus.ts";
import { freePort, type NatsServerHandle, type NatsServerOptions, startNatsServer } from "../transport/nats-server.ts";

export { freePort };
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
  /** Waits until JetStream answers with a meta leader (after a start, or after a server was killed). */
  waitJetStream(timeoutMs?: number): Promise<void>;
  /** Stops every server and removes their stores. */
  stop(): Promise<void>;
}

/** Options of startTestNatsCluster. */
export interface TestNatsClusterOptions extends Pick<NatsServerOptions, "maxPayload" | "readyTimeoutMs"> {
  /** Number of servers (default 3). */
  size?: number;
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
          cluster: { name, port, user, pass, routes: routePorts.filter((_, j) => j !== i).map((p) => `nats-route://127.0.0.1:${p}`) },
        }),
      ),
    );
    for (const s of started) if (s.status === "fulfilled") servers.push(s.value);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
  } catch (e) {
    await Promise.all(servers.map((s) => s.stop()));
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
