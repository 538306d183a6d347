// Isolates what a KV watch does while a NATS server dies: a fresh three-server cluster, a KV bucket
// with 3 replicas; one connection watches a key (as the versions follower does), another puts a new
// value every second; the server leading the bucket's stream is SIGKILLed after a few puts. Prints
// each put's delivery delay (or that it never came) relative to the kill.
//   node --import tsx scripts/experiments/kv-watch-failover-probe.mts [--puts N] [--victim leader|other|consumer]
import { startTestNatsCluster } from "../../src/testing/nats-cluster.ts";
import { connectBus } from "../../src/transport/bus.ts";

const args = process.argv.slice(2);
const puts = Number(args[args.indexOf("--puts") + 1] || 60);
const victimKind = args.includes("--victim") ? args[args.indexOf("--victim") + 1] : "leader";
const cluster = await startTestNatsCluster({ size: 3 });
try {
  const writer = await connectBus({ url: cluster.authUrls, replicas: 3 });
  const reader = await connectBus({ url: cluster.authUrls, replicas: 3 });
  const kvw = await writer.kv("probe_versions", { history: 1 });
  const kvr = await reader.kv("probe_versions", { history: 1 });
  await kvw.put("latest", new TextEncoder().encode("0"));
  const info = await (await writer.jsm()).streams.info("KV_probe_versions");
  const leader = info.cluster?.leader ?? "";
  const leaderIdx = cluster.servers.findIndex((_, i) => leader.endsWith(`-s${i + 1}`));
  let victim = victimKind === "leader" ? leaderIdx : (leaderIdx + 1) % 3;
  console.log(`bucket leader: server ${leaderIdx + 1}; killing server ${victim + 1}; connections per server: ${(await cluster.connections()).join(",")}`);
  const putAt = new Map<number, number>();
  let killedAt = 0;
  const rel = (t: number) => (killedAt ? `+${((t - killedAt) / 1000).toFixed(1)} s` : "before");
  const it = await kvr.watch({ key: "latest" });
  if (victimKind === "consumer") {
    // the server hosting the watch's (ephemeral, one-replica) consumer
    for await (const ci of (await writer.jsm()).consumers.list("KV_probe_versions")) {
      const host = ci.cluster?.leader ?? "";
      victim = cluster.servers.findIndex((_, i) => host.endsWith(`-s${i + 1}`));
      console.log(`watch consumer ${ci.name} on server ${victim + 1}`);
    }
  }
  void (async () => {
    for await (const e of it) {
      const n = Number(new TextDecoder().decode(e.value));
      const at = putAt.get(n);
      if (at !== undefined) console.log(`${rel(at)}: put ${n} seen after ${(performance.now() - at).toFixed(0)} ms`);
    }
    console.log(`${rel(performance.now())}: watch ended`);
  })();
  for (let n = 1; n <= puts; n++) {
    if (n === 4) {
      cluster.servers[victim]!.kill("SIGKILL");
      killedAt = performance.now();
    }
    const t0 = performance.now();
    try {
      await kvw.put("latest", new TextEncoder().encode(String(n)));
      putAt.set(n, t0);
    } catch (e) {
      console.log(`${rel(t0)}: put ${n} FAILED after ${(performance.now() - t0).toFixed(0)} ms: ${(e as Error).message}`);
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  it.stop();
  await writer.close();
  await reader.close();
} finally {
  await cluster.stop();
}
