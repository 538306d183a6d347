// The cluster faults of ooze/testing on a real three-server NATS cluster whose routes pass through
// cut proxies (startTestNatsCluster({ partitionable: true })): a server partitioned away loses every
// route (and gains none around the proxies) while its own clients stay connected to it, the majority
// goes on with a new stream leader, and healing restores every route and replica; the meta-leader
// handle kills whichever server leads the meta group when the fault comes, and restarts that one.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectBus, type Bus } from "../../src/transport/bus.ts";
import { startTestNatsCluster, type TestNatsCluster, waitUntil } from "../harness/index.ts";

let cluster: TestNatsCluster;
const buses: Bus[] = [];

beforeAll(async () => {
  cluster = await startTestNatsCluster({ size: 3, partitionable: true });
}, 60_000);
afterAll(async () => {
  await Promise.all(buses.map((b) => b.close().catch(() => undefined)));
  await cluster?.stop();
});

const serverOf = (name: string | undefined) => cluster.servers.findIndex((_, i) => (name ?? "").endsWith(`-s${i + 1}`));

describe("cluster faults: a partitioned server, the meta leader killed", () => {
  it("a partitioned server keeps its clients but no route; the others elect a new leader and go on; healing restores every route and replica", async () => {
    await waitUntil(async () => (await cluster.routes()).every((n) => n === 2), { timeoutMs: 20_000, what: "a full mesh of routes" });
    const bus = await connectBus({ url: cluster.authUrls, replicas: 3 });
    buses.push(bus);
    await bus.ensureStream("PART", ["part.>"], { storage: "file" } as never);
    await bus.jsPublish("part.a", new Uint8Array([1]));
    const jsm = await bus.jsm();
    const leader = serverOf((await jsm.streams.info("PART")).cluster?.leader);
    expect(leader).toBeGreaterThanOrEqual(0);
    // A client of the server about to be cut off only, and one of the other two only (the first
    // client may be connected to either side).
    const minority = await connectBus({ url: cluster.servers[leader]!.url, token: cluster.token, replicas: 3 });
    buses.push(minority);
    const majority = await connectBus({ url: cluster.servers.filter((_, i) => i !== leader).map((s) => s.url).join(","), token: cluster.token, replicas: 3 });
    buses.push(majority);
    const mjsm = await majority.jsm();

    const partition = cluster.partitions[`partition-s${leader}`]!;
    partition.cut();
    try {
      await waitUntil(async () => (await cluster.routes())[leader] === 0, { timeoutMs: 10_000, what: `server ${leader + 1} without routes` });
      // The majority elects a leader among its two and takes publishes.
      await waitUntil(
        async () => {
          const l = serverOf((await mjsm.streams.info("PART").catch(() => null))?.cluster?.leader);
          return l >= 0 && l !== leader;
        },
        { timeoutMs: 30_000, intervalMs: 250, what: "a new stream leader on the majority side" },
      );
      await majority.jsPublish("part.b", new Uint8Array([2]));
      // The partitioned server still has its client, and no route came back around the proxies.
      expect(minority.isConnected()).toBe(true);
      await new Promise((r) => setTimeout(r, 3_000));
      expect((await cluster.routes())[leader]).toBe(0);
      // Its client cannot publish to the stream: no quorum where it is.
      await expect(minority.jsPublish("part.c", new Uint8Array([3]), { timeoutMs: 1_000 })).rejects.toThrow();
    } finally {
      partition.heal();
    }
    await waitUntil(async () => (await cluster.routes()).every((n) => n === 2), { timeoutMs: 30_000, what: "every route back after the heal" });
    await waitUntil(
      async () => {
        const info = await jsm.streams.info("PART").catch(() => null);
        return (info?.cluster?.replicas ?? []).length === 2 && info!.cluster!.replicas!.every((r) => r.current) && info!.state.messages === 2;
      },
      { timeoutMs: 30_000, intervalMs: 250, what: "three current replicas holding the two messages" },
    );
    await minority.jsPublish("part.d", new Uint8Array([4]));
  }, 120_000);

  it("the meta-leader handle kills the server leading the meta group then, and restarts that one", async () => {
    await cluster.waitJetStream();
    const before = await cluster.metaLeader();
    expect(before).not.toBeNull();
    await cluster.metaLeaderServer.kill("SIGKILL");
    await cluster.metaLeaderServer.waitExit();
    expect(cluster.servers[before!]!.running).toBe(false);
    await waitUntil(async () => {
      const now = await cluster.metaLeader();
      return now !== null && now !== before;
    }, { timeoutMs: 30_000, what: "a new meta leader" });
    await cluster.metaLeaderServer.restart();
    expect(cluster.servers[before!]!.running).toBe(true);
    await cluster.waitJetStream();
  }, 90_000);
});
