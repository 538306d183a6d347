// The training loop's stream consumer (actors/protocol/streams.ts) against a real nats-server: a
// handler that never settles (it waits on an actor that has stopped) must not keep its message once
// its consumer has stopped. Before the fix its heartbeat went on for ever: the message never came
// back to the next consumer, and the beat's timer kept the stopped process alive (`ooze fuzz` hung
// after its report, docs/reliability.md finding 13).
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { consumeStream, VersionsKv } from "../../actors/protocol/streams.ts";
import { createRegistry, defineMessage } from "../../src/codec/index.ts";
import { OozeError, TimeoutError } from "../../src/errors.ts";
import { processMetrics } from "../../src/metrics.ts";
import { JS_API_TIMEOUT_MS, jsApiBulkTimeoutMs } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();
const Work = defineMessage({ kind: "test.work", v: 1, schema: z.object({ n: z.number() }) });
const registry = createRegistry(Work);

/** A work-queue stream STREAMS_<TAG> on subject <tag>.work holding `count` Work messages (n = 0, 1, …), and a connection for it. */
async function workQueue(tag: string, count: number) {
  const bus = await nats.connect({ name: `streams-${tag}` });
  const stream = `STREAMS_${tag.toUpperCase()}`;
  const subject = `${tag}.work`;
  await bus.ensureStream(stream, [subject], { retention: "workqueue" } as never);
  for (let n = 0; n < count; n++) await bus.jsPublish(subject, Work.encode({ n }, { id: `${tag}${n}`, sender: "test" }), { msgID: `${tag}${n}` });
  return { bus, names: jobNames(`streams-${tag}`), stream, subject };
}

describe("consumeStream", () => {
  it("a handler still running when stop's grace ends loses its heartbeat: the message goes to the next consumer", async () => {
    const { bus, names, stream, subject } = await workQueue("test", 1);
    const common = { bus, names, stream, subject, durable: "worker", registry, actor: "worker", ackWaitMs: 600, log: () => {} };

    let taken = false;
    const first = consumeStream({
      ...common,
      handle: () => {
        taken = true;
        return new Promise<void>(() => {}); // never settles
      },
    });
    await waitUntil(() => taken, { timeoutMs: 10_000, what: "the first consumer to take the message" });
    await first.stop(100);

    const seen: Array<{ n: number; deliveryCount: number }> = [];
    const second = consumeStream({
      ...common,
      handle: async (msg, info) => {
        seen.push({ n: msg.body.n, deliveryCount: info.deliveryCount });
      },
    });
    try {
      // Without the beat the server redelivers after ack_wait (600 ms); with it, never.
      await waitUntil(() => seen.length > 0, { timeoutMs: 10_000, what: "the message redelivered to the second consumer" });
      expect(seen[0]).toEqual({ n: 0, deliveryCount: 2 });
      // counted as a redelivery in this process's metrics (ooze_jetstream_redeliveries_total)
      const text = await processMetrics().metrics();
      expect(text).toMatch(/^ooze_jetstream_redeliveries_total\{stream="STREAMS_TEST",consumer="worker"\} 1$/m);
    } finally {
      await second.stop();
    }
  }, 30_000);

  it("a message delivered again while its handler still runs (its beats were late: the process stalled) is not handled twice, and is acked", async () => {
    // At 1,024 simulated engines most rollout prompts in flight were delivered again after stalls
    // longer than the ack wait, and each copy was generated again (docs/experiments/scale.md, Dec 1).
    const { bus, names, stream, subject } = await workQueue("again", 1);
    const deliveries: number[] = [];
    const c = consumeStream({
      bus, names, stream, subject, durable: "worker", registry, actor: "worker", ackWaitMs: 600, stallLimitMs: 300, concurrency: 4, log: () => {},
      handle: async (_msg, info) => {
        deliveries.push(info.deliveryCount);
        // The event loop stalls past the stall limit and the ack wait: the heartbeat worker stops
        // beating (the process is taken for hung), and the server delivers the message again.
        const until = Date.now() + 1_500;
        while (Date.now() < until);
        await new Promise((r) => setTimeout(r, 1_500)); // still handling when the copy is read
      },
    });
    try {
      await waitUntil(() => c.stats.handled === 1, { timeoutMs: 20_000, what: "the message handled" });
      const jsm = await bus.jsm();
      await waitUntil(async () => (await jsm.streams.info(stream)).state.messages === 0, { timeoutMs: 10_000, what: "the message acked (gone from the work queue)" });
      const text = await processMetrics().metrics();
      expect(text).toMatch(/^ooze_jetstream_redeliveries_total\{stream="STREAMS_AGAIN",consumer="worker"\} [1-9]/m);
      await new Promise((r) => setTimeout(r, 1_500)); // two more ack waits: no copy handled late either
      expect(deliveries).toEqual([1]);
    } finally {
      await c.stop();
    }
  }, 40_000);

  it("a stall of the event loop longer than the ack wait (and shorter than the stall limit) does not lose the messages' beats", async () => {
    // The beats go out from the bus's heartbeat worker, whose event loop does not stall with this
    // one. When they ran here, a rollout process stalled 10–52 s by the responses that come back
    // together after a weight update's pause let the server deliver hundreds of held prompt groups
    // again (60-s ack wait, 1,024 engines; Dec 1, docs/experiments/scale.md).
    const { bus, names, stream, subject } = await workQueue("stall", 3);
    const seen: { n: number; deliveryCount: number }[] = [];
    let deferredAck: (() => void) | null = null;
    const c = consumeStream({
      bus, names, stream, subject, durable: "worker", registry, actor: "worker", ackWaitMs: 600, concurrency: 2, prefetch: 3, log: () => {},
      handle: async (msg, info) => {
        seen.push({ n: msg.body.n, deliveryCount: info.deliveryCount });
        if (msg.body.n === 0) {
          deferredAck = info.defer(); // held (deferred), acked after the stall
          return;
        }
        if (msg.body.n !== 1) return;
        // Five ack waits of a blocked event loop while message 0 is held, 1 handled and 2 queued.
        const until = Date.now() + 3_000;
        while (Date.now() < until);
        await new Promise((r) => setTimeout(r, 100));
      },
    });
    try {
      await waitUntil(() => c.stats.handled === 3, { timeoutMs: 20_000, what: "the three messages handled" });
      (deferredAck as (() => void) | null)?.();
      const jsm = await bus.jsm();
      await waitUntil(async () => (await jsm.streams.info(stream)).state.messages === 0, { timeoutMs: 10_000, what: "the messages acked" });
      expect(seen.sort((x, y) => x.n - y.n)).toEqual([0, 1, 2].map((n) => ({ n, deliveryCount: 1 })));
      const text = await processMetrics().metrics();
      expect(text).not.toMatch(/^ooze_jetstream_redeliveries_total\{stream="STREAMS_STALL"/m);
    } finally {
      await c.stop();
    }
  }, 40_000);

  it("a consumer whose handlers are busy takes no more messages than it has room for: none waits unbeaten past its ack wait", async () => {
    // The rollout instances share one durable whose max_ack_pending is the job's (4,096 groups) while
    // each handles its share (1,024). nats.js's consume() kept asking for a full batch, so the server
    // sent a busy instance up to a thousand groups more than it could start; they waited unbeaten, and
    // after the ack wait the server sent them again: 732 copies in the first 3 minutes at 1,024
    // engines with a 60-s ack wait (Dec 1, docs/experiments/scale.md).
    const { bus, names, stream, subject } = await workQueue("room", 48);
    const seen: { by: string; n: number; deliveryCount: number }[] = [];
    const consumer = (by: string) =>
      consumeStream({
        bus, names, stream, subject, durable: "worker", registry, actor: by,
        ackWaitMs: 600, concurrency: 8, maxAckPending: 64, log: () => {},
        handle: async (msg, info) => {
          seen.push({ by, n: msg.body.n, deliveryCount: info.deliveryCount });
          await new Promise((r) => setTimeout(r, 1_500)); // longer than the ack wait: the handler's beats keep it
        },
      });
    const a = consumer("a");
    const b = consumer("b");
    try {
      await waitUntil(() => a.stats.handled + b.stats.handled === 48, { timeoutMs: 30_000, what: "the 48 messages handled" });
      expect(seen.map((x) => x.n).sort((x, y) => x - y)).toEqual(Array.from({ length: 48 }, (_, i) => i));
      expect(seen.filter((x) => x.deliveryCount > 1)).toEqual([]);
      const text = await processMetrics().metrics();
      expect(text).not.toMatch(/^ooze_jetstream_redeliveries_total\{stream="STREAMS_ROOM"/m);
    } finally {
      await a.stop();
      await b.stop();
    }
  }, 40_000);

  it("a pull of many messages starts its handlers a few per turn of the event loop, with timers and I/O between", async () => {
    // A pull's messages arrive as microtasks and each handler runs synchronously up to its first I/O:
    // a rollout instance started 256 prompt groups (2,048 episodes) in one run of the microtask queue,
    // 5.5 s of wall time at 1,024 engines in which no heartbeat fired (Dec 1, docs/experiments/scale.md).
    const { bus, names, stream, subject } = await workQueue("turns", 64);
    // `turn` counts turns of the event loop: a setImmediate ticker, one step per turn.
    let turn = 0;
    let ticking = true;
    const tick = () => {
      turn++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const startedIn: number[] = [];
    const c = consumeStream({
      bus, names, stream, subject, durable: "worker", registry, actor: "worker",
      concurrency: 64, log: () => {},
      handle: async () => {
        startedIn.push(turn);
        await new Promise((r) => setTimeout(r, 200));
      },
    });
    try {
      await waitUntil(() => c.stats.handled === 64, { timeoutMs: 30_000, what: "the 64 messages handled" });
      const perTurn = new Map<number, number>();
      for (const t of startedIn) perTurn.set(t, (perTurn.get(t) ?? 0) + 1);
      expect(startedIn).toHaveLength(64);
      expect(Math.max(...perTurn.values())).toBeLessThanOrEqual(16);
    } finally {
      ticking = false;
      await c.stop();
    }
  }, 40_000);

  it("a large payload whose fetch times out is delivered again, not dead-lettered as malformed", async () => {
    const bus = await nats.connect({ name: "streams-large" });
    const names = jobNames("streams-large");
    const Big = defineMessage({ kind: "test.big", v: 1, schema: z.object({ n: z.number(), pad: z.string() }) });
    await bus.ensureStream("STREAMS_LARGE", ["sl.work"], { retention: "workqueue" } as never);
    // larger than the server's max_payload: the body goes to the object store, the message carries a reference
    await bus.jsPublish("sl.work", Big.encode({ n: 9, pad: "x".repeat(9 * 1024 * 1024) }, { id: "b9", sender: "test" }), { msgID: "b9" });
    // The first fetch of the body times out, as a chunk read did on a loaded machine (Nov 30). Each
    // fetch's start and time are kept for the diagnostics.
    let fetches = 0;
    const t0 = performance.now();
    const timings: string[] = [];
    const flaky = Object.create(bus) as typeof bus;
    flaky.payload = async (m) => {
      const n = ++fetches, at = performance.now();
      const took = (how: string) => timings.push(`fetch ${n} at ${((at - t0) / 1000).toFixed(1)} s: ${how} after ${((performance.now() - at) / 1000).toFixed(1)} s`);
      if (n === 1) {
        took("the injected timeout");
        throw new TimeoutError("reading chunk 1 of 2 of large payload: timed out");
      }
      try {
        const body = await bus.payload(m);
        took(`${body.length} bytes`);
        return body;
      } catch (e) {
        took(`failed (${(e as Error).message})`);
        throw e;
      }
    };
    const seen: Array<{ n: number; deliveryCount: number }> = [];
    const log: string[] = [];
    const c = consumeStream({
      bus: flaky, names, stream: "STREAMS_LARGE", subject: "sl.work", durable: "worker", registry: createRegistry(Big), actor: "worker", ackWaitMs: 5_000, log: (l) => log.push(l),
      handle: async (msg, info) => void seen.push({ n: msg.body.n, deliveryCount: info.deliveryCount }),
    });
    try {
      // A real fetch may take its deadlines on a loaded machine: the meta read's 2 s and each of the
      // two chunks' (jsApiBulkTimeoutMs: 10 s for 8 MiB), after the 1-s nak; the wait allows two such
      // fetches (a fresh-clone run's 15 s, Dec 2, ended inside the first one).
      const fetchMs = JS_API_TIMEOUT_MS + 2 * jsApiBulkTimeoutMs(nats.server.maxPayload);
      await waitUntil(() => seen.length > 0, { timeoutMs: 1_000 + 2 * fetchMs, what: "the message handled once its body could be fetched", diagnostics: () => [...log, ...timings].join("\n") });
      // Delivered again after the timeout (a second delivery's real fetch may time out too on a loaded
      // machine: a fresh-clone run saw delivery 3), handled once, never dead-lettered.
      expect(seen).toHaveLength(1);
      expect(seen[0]!.n).toBe(9);
      expect(seen[0]!.deliveryCount).toBeGreaterThanOrEqual(2);
      expect(c.stats.malformed).toBe(0);
      expect(log.join("\n")).toMatch(/fetching the body of a message on sl\.work failed \(delivery 1; retrying\): reading chunk 1 of 2 of large payload: timed out/);
    } finally {
      await c.stop();
      await flaky.heartbeats().close(); // the wrapper started a heartbeat worker of its own
    }
  }, 75_000);

  it("a version watch that goes quiet (its consumer gone, none can be made) still sees new records: it reads the record every second", async () => {
    const bus = await nats.connect({ name: "versions-quiet" });
    const names = jobNames("versions-quiet");
    const kv = await VersionsKv.open(bus, names);
    await kv.advance({ version: 1, step: 1, modelDir: "/m1", at: Date.now() });
    const f = await kv.follow();
    expect((await f.until(1)).step).toBe(1);
    // From now on a consumer cannot be made (as when the cluster places it on a dead server: the
    // request is never answered), and the watch's own consumer is deleted under it.
    type Request = (subject: string, data?: unknown, opts?: unknown) => Promise<unknown>;
    const nc = bus.nc as unknown as { request: Request };
    const real = nc.request.bind(nc);
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    nc.request = async (subject, data, opts) => {
      if (!subject.startsWith("$JS.API.CONSUMER.CREATE.")) return real(subject, data, opts);
      await released;
      throw new Error("held consumer create");
    };
    const jsm = await bus.jsm();
    const stream = `KV_${names.kvVersions}`;
    for await (const c of jsm.consumers.list(stream)) await jsm.consumers.delete(stream, c.name);
    try {
      const other = await nats.connect({ name: "versions-writer" });
      await (await VersionsKv.open(other, names)).advance({ version: 2, step: 2, modelDir: "/m2", at: Date.now() });
      const seen = await Promise.race([f.until(2), new Promise<null>((r) => setTimeout(() => r(null), 10_000))]);
      expect(seen?.modelDir, "the record of step 2 reached the follower within 10 s").toBe("/m2");
    } finally {
      release();
      nc.request = real;
      await f.stop();
    }
  }, 30_000);

  it("a stopped version watch rejects the waits still pending (a trainer's stop does not wait for a version nobody will record)", async () => {
    const bus = await nats.connect({ name: "versions" });
    const kv = await VersionsKv.open(bus, jobNames("versions-test"));
    await kv.advance({ version: 1, step: 1, modelDir: "/nowhere", at: Date.now() });
    const f = await kv.follow();
    expect((await f.until(1)).step).toBe(1);
    const pending = f.until(2);
    await f.stop();
    const e = await pending.catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OozeError);
    expect((e as OozeError).code).toBe("ACTOR_STOPPED");
    expect((e as OozeError).message).toContain("step 2");
    await expect(f.until(3)).rejects.toThrow(/stopped while waiting for the version of step 3/);
  });
});
