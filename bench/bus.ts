// Bus benchmark: two processes over an embedded nats-server. Measures actor tell throughput, ask
// latency (p50/p99), durable-mailbox throughput (publish + consume + ack of 2 KB payloads through the
// actor system) and, in the same run, raw JetStream publish + pull consume + ack of the same payload,
// with their ratio (medians over alternating rounds after a warm-up). Progress goes to stderr; one JSON
// line is printed last on stdout.
// Usage: npm run bench -- bus [--quick]      (the script re-runs itself with --role=host as the peer)
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { attachBus, createSystem, defineActor, durableRef, serveDurable, type ActorSystem } from "../src/actor/index.ts";
import { connectBus, type Bus } from "../src/transport/bus.ts";
import { jobNames } from "../src/transport/names.ts";
import { startNatsServer } from "../src/transport/nats-server.ts";

const JOB = "bench-bus";
const RAW_STREAM = "OOZE_BENCH_RAW";
const RAW_SUBJECT = "ooze.bench-bus.raw";
const PAYLOAD = 2048;
const MAX_ACK_PENDING = 512;
const args = process.argv.slice(2);
const role = args.find((a) => a.startsWith("--role="))?.slice(7) ?? "main";
const quick = args.includes("--quick");
const log = (m: string) => process.stderr.write(`[bench bus] ${m}\n`);

type HostMsg = { kind: "tell"; i: number } | { kind: "ping" } | { kind: "stats" } | { kind: "reset" };
interface HostStats {
  tells: number;
  durable: number;
  raw: number;
}

async function host(url: string, token: string): Promise<void> {
  const bus = await connectBus({ url, token, name: "bench-host" });
  const system = createSystem({ name: JOB, log: () => {} });
  await attachBus(system, bus, { events: false });
  const stats: HostStats = { tells: 0, durable: 0, raw: 0 };
  system.spawn(
    defineActor<null, HostMsg>({
      name: "peer",
      init: () => null,
      handle: (s, m, ctx) => {
        if (m.kind === "tell") stats.tells++;
        else if (m.kind === "stats") ctx.reply(stats);
        else if (m.kind === "reset") Object.assign(stats, { tells: 0, durable: 0, raw: 0 });
        else ctx.reply(null);
        return s;
      },
    }),
  );
  system.spawn(
    defineActor<null, { payload: Uint8Array }>({
      name: "dsink",
      init: () => null,
      handle: (s) => {
        stats.durable++;
        return s;
      },
    }),
  );
  await serveDurable(system, "dsink", { maxAckPending: MAX_ACK_PENDING });
  // The raw baseline: one durable pull consumer on a plain work-queue stream, ack per message.
  await bus.ensureStream(RAW_STREAM, [RAW_SUBJECT], { retention: "workqueue", storage: "file" } as never);
  const consumer = await bus.ensureConsumer(RAW_STREAM, "raw", { max_ack_pending: MAX_ACK_PENDING } as never);
  void (async () => {
    const msgs = await consumer.consume({ max_messages: 256 });
    for await (const m of msgs) {
      m.ack();
      stats.raw++;
    }
  })();
  await bus.flush();
  for (const sig of ["SIGINT", "SIGTERM"] as const) process.once(sig, () => process.exit(0));
  process.stdout.write("ready\n");
}

function startHost(url: string, token: string): Promise<ChildProcess> {
  const self = fileURLToPath(import.meta.url);
  const child = spawn(process.execPath, ["--import", "tsx", self, "--role=host", url, token], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes("ready\n")) resolve(child);
    });
    child.once("exit", (c) => reject(new Error(`bench host exited with ${c} before ready`)));
  });
}

async function waitCount(sys: ActorSystem, key: keyof HostStats, n: number, timeoutMs = 120_000): Promise<void> {
  const peer = sys.remoteRef<HostMsg>("peer");
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = await peer.ask<HostStats>({ kind: "stats" }, { timeoutMs: 30_000 });
    if (s[key] >= n) return;
    if (Date.now() > deadline) throw new Error(`bench: peer saw ${s[key]} of ${n} ${key} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** Runs `send(i)` for i < n with at most `window` in flight. */
async function pipelined(n: number, window: number, send: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < n) await send(next++);
  };
  await Promise.all(Array.from({ length: window }, worker));
}

async function main(): Promise<void> {
  const server = await startNatsServer({ maxPayload: 8 * 1024 * 1024 });
  log(`nats-server ${server.url}, peer process starting`);
  const child = await startHost(server.url, server.token);
  const bus: Bus = await connectBus({ url: server.url, token: server.token, name: "bench-main" });
  const sys = createSystem({ name: JOB, log: () => {} });
  await attachBus(sys, bus, { events: false });
  const peer = sys.remoteRef<HostMsg>("peer");
  const result: Record<string, number | string> = { bench: "bus", payload_bytes: PAYLOAD, quick: quick ? 1 : 0 };
  try {
    // tell throughput
    const tells = quick ? 20_000 : 200_000;
    await peer.ask({ kind: "reset" });
    let t0 = performance.now();
    // Core NATS is at-most-once: an ask every 2000 tells keeps the peer from falling behind (flow
    // control; replies come after every earlier tell, as the actor handles messages in order).
    for (let i = 0; i < tells; i++) {
      peer.tell({ kind: "tell", i });
      if (i % 2000 === 1999) await peer.ask({ kind: "ping" }, { timeoutMs: 30_000 });
    }
    await waitCount(sys, "tells", tells);
    result.tell_msgs_per_s = Math.round(tells / ((performance.now() - t0) / 1000));
    log(`tell: ${result.tell_msgs_per_s} msgs/s (${tells} tells)`);

    // ask latency, sequential
    const warm = quick ? 500 : 2_000;
    const asks = quick ? 2_000 : 10_000;
    for (let i = 0; i < warm; i++) await peer.ask({ kind: "ping" });
    const lat = new Float64Array(asks);
    for (let i = 0; i < asks; i++) {
      const s = performance.now();
      await peer.ask({ kind: "ping" });
      lat[i] = performance.now() - s;
    }
    lat.sort();
    result.ask_p50_ms = Number(lat[Math.floor(asks * 0.5)]!.toFixed(4));
    result.ask_p99_ms = Number(lat[Math.floor(asks * 0.99)]!.toFixed(4));
    log(`ask: p50 ${result.ask_p50_ms} ms, p99 ${result.ask_p99_ms} ms (${asks} sequential asks)`);

    // durable vs raw JetStream, same payload, same window, alternating rounds; best of each
    const n = quick ? 5_000 : 20_000;
    const window = 256;
    const payload = new Uint8Array(PAYLOAD).map((_, i) => i & 0xff);
    const dref = await durableRef<{ payload: Uint8Array }>(sys, "dsink");
    // Warm-up of both paths (JIT, stream and consumer creation), not measured.
    const warmN = quick ? 1_000 : 3_000;
    await peer.ask({ kind: "reset" });
    await pipelined(warmN, window, () => bus.js.publish(RAW_SUBJECT, payload));
    await pipelined(warmN, window, () => dref.send({ payload }));
    await waitCount(sys, "raw", warmN);
    await waitCount(sys, "durable", warmN);
    log(`warm-up done (${warmN} messages each)`);
    const raws: number[] = [];
    const durables: number[] = [];
    const ratios: number[] = [];
    const rounds = quick ? 1 : 4;
    for (let round = 0; round < rounds; round++) {
      await peer.ask({ kind: "reset" });
      t0 = performance.now();
      await pipelined(n, window, () => bus.js.publish(RAW_SUBJECT, payload));
      await waitCount(sys, "raw", n);
      const raw = n / ((performance.now() - t0) / 1000);
      t0 = performance.now();
      await pipelined(n, window, () => dref.send({ payload }));
      await waitCount(sys, "durable", n);
      const durable = n / ((performance.now() - t0) / 1000);
      raws.push(raw);
      durables.push(durable);
      ratios.push(durable / raw);
      log(`round ${round + 1}: raw JetStream ${Math.round(raw)} msgs/s, durable mailbox ${Math.round(durable)} msgs/s, ratio ${(durable / raw).toFixed(3)}`);
    }
    // Medians: the machine is shared, so rounds vary; each ratio compares two runs adjacent in time.
    result.durable_msgs_per_s = Math.round(median(durables));
    result.raw_jetstream_msgs_per_s = Math.round(median(raws));
    result.durable_vs_raw = Number(median(ratios).toFixed(3));
    result.durable_best_msgs_per_s = Math.round(Math.max(...durables));
    result.raw_best_msgs_per_s = Math.round(Math.max(...raws));
    result.messages_per_round = n;
    result.rounds = rounds;
    result.stream = jobNames(JOB).streamMailboxes;
  } finally {
    child.kill("SIGKILL");
    await sys.stop();
    await bus.close();
    await server.stop();
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

if (role === "host") {
  await host(args[1] ?? "", args[2] ?? "");
} else {
  await main();
  process.exit(0);
}
