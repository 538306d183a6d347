// Isolates what the rollout's engines-registry pass does while a NATS server dies: a fresh
// three-server cluster, a KV bucket with 3 replicas and a few keys, then every 2 s (as the rollout
// does) kv.keys() + kv.get() of each key, timed; the server leading the bucket's stream is SIGKILLed
// after a few passes. Prints each pass's time or error relative to the kill.
// With --info the keys come from the stream's info (subjects filter) instead of kv.keys().
//   node --import tsx scripts/experiments/kv-failover-probe.mts [--passes N] [--victim leader|other] [--info]
import { startTestNatsCluster } from "../../src/testing/nats-cluster.ts";
import { connectBus } from "../../src/transport/bus.ts";

const args = process.argv.slice(2);
const passes = Number(args[args.indexOf("--passes") + 1] || 40);
const victimKind = args.includes("--victim") ? args[args.indexOf("--victim") + 1] : "leader";
const cluster = await startTestNatsCluster({ size: 3 });
try {
  const bus = await connectBus({ url: cluster.authUrls, replicas: 3 });
  const kv = await bus.kv("probe_engines", { history: 1 });
  for (let i = 0; i < 3; i++) await kv.put(`engine.${i}`, new TextEncoder().encode(`{"url":"http://e${i}"}`));
  const info = await (await bus.jsm()).streams.info("KV_probe_engines");
  const leader = info.cluster?.leader ?? "";
  const leaderIdx = cluster.servers.findIndex((_, i) => leader.endsWith(`-s${i + 1}`));
  const victim = victimKind === "leader" ? leaderIdx : (leaderIdx + 1) % 3;
  const conns = await cluster.connections();
  console.log(`bucket leader: server ${leaderIdx + 1}; killing server ${victim + 1}; client connections per server: ${conns.join(",")}`);
  let killedAt = 0;
  for (let p = 0; p < passes; p++) {
    if (p === 3) {
      cluster.servers[victim]!.kill("SIGKILL");
      killedAt = performance.now();
    }
    const t0 = performance.now();
    const rel = killedAt ? `+${((t0 - killedAt) / 1000).toFixed(1)} s` : "before";
    try {
      const keys: string[] = [];
      const tk = performance.now();
      if (args.includes("--info")) {
        // the keys from the stream's subjects (stream info with a subjects filter): no consumer
        const si = await (await bus.jsm()).streams.info("KV_probe_engines", { subjects_filter: "$KV.probe_engines.engine.>" });
        keys.push(...Object.keys(si.state.subjects ?? {}).map((x) => x.slice("$KV.probe_engines.".length)));
      } else for await (const k of await kv.keys("engine.>")) keys.push(k);
      const dk = performance.now() - tk;
      for (const k of keys) await kv.get(k);
      console.log(`${rel}: ok ${keys.length} keys, keys() ${dk.toFixed(0)} ms, all ${(performance.now() - t0).toFixed(0)} ms`);
    } catch (e) {
      console.log(`${rel}: FAILED after ${(performance.now() - t0).toFixed(0)} ms: ${(e as Error).message}`);
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
  await bus.close();
} finally {
  await cluster.stop();
}
