// The bus against a real nats-server with the server's default 1 MiB max_payload: request deadline,
// no responders, 5 MB payloads over core NATS, request/reply and JetStream, typed-array messages
// through a stream, a connection cut by a proxy and healed, dead letters, and NATS URL resolution.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { createRegistry, type DeadLetter, deadLetter, decode, decodeMessage, defineMessage, encode, malformedCount, zFloat32Array, zInt32Array, zUint8Array } from "../../src/codec/index.ts";
import { MalformedMessageError, OozeError, TimeoutError, TransportError } from "../../src/errors.ts";
import { jobNames } from "../../src/transport/names.ts";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { connectBus, LARGE_HEADER, resolveNatsUrl, splitNatsUrl } from "../../src/transport/bus.ts";
import { createCutProxy, nextMessage, nextStatus, startTestNats, useNats, waitUntil } from "../harness/index.ts";

const MiB = 1024 * 1024;
const nats = useNats({ maxPayload: null }); // the server's own default max_payload: 1 MiB

const Rollout = defineMessage({
  kind: "test.rollout",
  v: 1,
  schema: z.object({ tokens: zInt32Array(), logprobs: zFloat32Array(), mask: zUint8Array() }),
});
const registry = createRegistry(Rollout);

function sample5MB(): Float32Array {
  const xs = new Float32Array(1_250_000);
  for (let i = 0; i < xs.length; i++) xs[i] = i * 0.25 - 7;
  return xs;
}

function sameBytes(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;
}

describe("bus", () => {
  it("request: a reply within the deadline, TimeoutError past it, ACTOR_NOT_FOUND with no responder", async () => {
    const bus = await nats.connect({ name: "req" });
    bus.subscribe("t.echo", { handler: (m) => m.respond(m.data) });
    bus.subscribe("t.silent", { handler: () => {} });
    await bus.flush();
    const r = await bus.request("t.echo", encode({ a: new Int32Array([1, 2]) }), { timeoutMs: 5_000 });
    expect(decode(r.data)).toEqual({ a: new Int32Array([1, 2]) });
    const late = await bus.request("t.silent", encode(1), { timeoutMs: 200 }).catch((e: unknown) => e);
    expect(late).toBeInstanceOf(TimeoutError);
    expect((late as TimeoutError).retryable).toBe(true);
    expect((late as TimeoutError).message).toContain("t.silent");
    const nobody = await bus.request("t.nobody", encode(1), { timeoutMs: 5_000 }).catch((e: unknown) => e);
    expect(nobody).toBeInstanceOf(OozeError);
    expect((nobody as OozeError).code).toBe("ACTOR_NOT_FOUND");
  });

  it("carries a 5 MB Float32Array over core NATS through a 1 MiB max_payload server, in order", async () => {
    const bus = await nats.connect({ name: "large" });
    expect(bus.maxPayload).toBe(MiB);
    const xs = sample5MB();
    const sub = bus.subscribe("t.large");
    await bus.flush();
    await bus.publish("t.large", encode({ n: 1, xs }));
    await bus.publish("t.large", encode({ n: 2 }));
    const got: { n: number; xs?: Float32Array }[] = [];
    for await (const m of sub) {
      got.push(decode(m.data) as { n: number; xs?: Float32Array });
      if (got.length === 2) break;
    }
    expect(got.map((g) => g.n)).toEqual([1, 2]);
    expect(got[0]!.xs).toBeInstanceOf(Float32Array);
    expect(sameBytes(got[0]!.xs!, xs)).toBe(true);
  });

  it("carries large requests and large replies", async () => {
    const bus = await nats.connect({ name: "large-req" });
    bus.subscribe("t.sum", {
      handler: async (m) => {
        const { xs } = decode(m.data) as { xs: Float32Array };
        await m.respond(encode({ len: xs.length, back: xs }));
      },
    });
    await bus.flush();
    const xs = sample5MB();
    const r = await bus.request("t.sum", encode({ xs }), { timeoutMs: 20_000 });
    expect(r.header(LARGE_HEADER)).not.toBeNull();
    const body = decode(r.data) as { len: number; back: Float32Array };
    expect(body.len).toBe(xs.length);
    expect(sameBytes(body.back, xs)).toBe(true);
  });

  it("refuses a plain publish that is too large only with a TransportError, never silently", async () => {
    const bus = await nats.connect({ name: "raw" });
    // The raw nats.js connection rejects oversize bodies; the bus's publish routes them instead.
    expect(() => bus.nc.publish("t.raw", new Uint8Array(2 * MiB))).toThrow();
    await expect(bus.publish("t.raw", new Uint8Array(2 * MiB))).resolves.toBeUndefined();
  });

  it("moves typed-array messages and a 5 MB message through a JetStream stream", async () => {
    const bus = await nats.connect({ name: "js" });
    const names = jobNames("bustest");
    await bus.ensureStream(names.streamSamples, [`${names.prefix}.samples.>`]);
    await bus.ensureStream(names.streamSamples, [`${names.prefix}.samples.>`]); // idempotent
    const msg = Rollout.encode({ tokens: new Int32Array([5, 6, 7]), logprobs: new Float32Array([-0.1, -0.2]), mask: new Uint8Array([1, 1]) }, { sender: "rollout-0", weightVersion: 2 });
    const ack = await bus.jsPublish(`${names.prefix}.samples.a`, msg, { msgID: "m1" });
    const dup = await bus.jsPublish(`${names.prefix}.samples.a`, msg, { msgID: "m1" });
    expect(dup.duplicate).toBe(true);
    expect(dup.seq).toBe(ack.seq);
    const xs = sample5MB();
    await bus.jsPublish(`${names.prefix}.samples.b`, encode({ xs }));
    const consumer = await bus.ensureConsumer(names.streamSamples, names.consumer("buffer"));
    const seen: unknown[] = [];
    const messages = await consumer.consume({ max_messages: 10 });
    for await (const jm of messages) {
      const data = await bus.payload(jm);
      seen.push(seen.length === 0 ? decodeMessage(data, registry) : decode(data));
      jm.ack();
      if (seen.length === 2) break;
    }
    await messages.close();
    const first = seen[0] as ReturnType<typeof Rollout.make>;
    expect(first.kind).toBe("test.rollout");
    expect(first.body.tokens).toEqual(new Int32Array([5, 6, 7]));
    expect(first.body.logprobs).toBeInstanceOf(Float32Array);
    expect(first.weightVersion).toBe(2);
    expect(sameBytes((seen[1] as { xs: Float32Array }).xs, xs)).toBe(true);
  });

  it("sees a cut connection as a disconnect and reconnects when healed", async () => {
    const proxy = await createCutProxy(nats.server.port);
    try {
      const bus = await nats.connect({ url: proxy.url, name: "cut" });
      const other = await nats.connect({ name: "peer" });
      other.subscribe("t.cut", { handler: (m) => m.respond(encode("pong")) });
      await other.flush();
      expect(decode((await bus.request("t.cut", encode("ping"), { timeoutMs: 5_000 })).data)).toBe("pong");
      const disconnected = nextStatus(bus, "disconnect");
      proxy.cut();
      await disconnected;
      expect(bus.isConnected()).toBe(false);
      const failed = await bus.request("t.cut", encode("ping"), { timeoutMs: 300 }).catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(OozeError);
      expect((failed as OozeError).retryable).toBe(true);
      const reconnected = nextStatus(bus, "reconnect");
      proxy.heal();
      await reconnected;
      await waitUntil(() => bus.isConnected(), { what: "the bus to be connected after heal", diagnostics: () => `proxy connections: ${proxy.connections}` });
      expect(decode((await bus.request("t.cut", encode("ping"), { timeoutMs: 5_000 })).data)).toBe("pong");
    } finally {
      await proxy.close();
    }
  });

  it("keeps its subscriptions across a nats-server crash and restart", async () => {
    const server = await startTestNats({ maxPayload: null });
    try {
      const bus = await connectBus({ url: server.authUrl, reconnectWaitMs: 50, name: "crash" });
      const got: number[] = [];
      bus.subscribe("t.survive", { handler: (m) => void got.push(decode(m.data) as number) });
      await bus.flush();
      await bus.publish("t.survive", encode(1));
      await waitUntil(() => got.length === 1, { what: "the first message", diagnostics: () => JSON.stringify(got) });
      const down = nextStatus(bus, "disconnect");
      server.kill("SIGKILL");
      await down;
      const up = nextStatus(bus, "reconnect");
      await server.restart();
      await up;
      await bus.flush();
      await bus.publish("t.survive", encode(2));
      await waitUntil(() => got.length === 2, { what: "a message after the restart", diagnostics: () => `${JSON.stringify(got)}\n${server.logTail()}` });
      expect(got).toEqual([1, 2]);
      await bus.close();
    } finally {
      await server.stop();
    }
  });

  it("resendOnReconnect: a request lost with a crashed nats-server is sent again once the connection is back", async () => {
    const server = await startTestNats({ maxPayload: null });
    try {
      const bus = await connectBus({ url: server.authUrl, reconnectWaitMs: 50, name: "resend" });
      // The first request is lost (never answered, as if it died with the server); later ones are answered.
      const seen: string[] = [];
      bus.subscribe("t.idem", { handler: (m) => (seen.push(decode(m.data) as string), seen.length > 1 ? m.respond(encode("done")) : undefined) });
      await bus.flush();
      const lost = bus.request("t.idem", encode("lost"), { timeoutMs: 60_000, resendOnReconnect: true });
      await waitUntil(() => seen.length === 1, { what: "the request to lose", diagnostics: () => JSON.stringify(seen) });
      const up = nextStatus(bus, "reconnect");
      server.kill("SIGKILL");
      await server.waitExit();
      await server.restart();
      await up;
      expect(decode((await lost).data)).toBe("done"); // without the resend: a TimeoutError after 60 s
      expect(seen).toEqual(["lost", "lost"]);
      await bus.close();
    } finally {
      await server.stop();
    }
  });

  it("reports handler failures and missing large payloads to onError, and keeps delivering", async () => {
    const bus = await nats.connect({ name: "errors" });
    const errors: OozeError[] = [];
    const seen: string[] = [];
    bus.subscribe("t.err", {
      handler: (m) => {
        const s = decode(m.data) as string;
        if (s === "boom") throw new Error("handler exploded");
        seen.push(s);
      },
      onError: (e) => errors.push(e),
    });
    await bus.flush();
    await bus.publish("t.err", encode("boom"));
    // A reference to a large payload that is not in the object store.
    await bus.obj(bus.largeBucket);
    const ref = natsHeaders();
    ref.set(LARGE_HEADER, `${bus.largeBucket}/gone`);
    bus.nc.publish("t.err", new Uint8Array(0), { headers: ref });
    await bus.publish("t.err", encode("after"));
    await waitUntil(() => seen.length === 1 && errors.length === 2, { what: "one delivery and two errors", diagnostics: () => `${seen} / ${errors.map((e) => e.message)}` });
    expect(seen).toEqual(["after"]);
    expect(errors[0]!.message).toContain("handler exploded");
    expect(errors[1]).toBeInstanceOf(TransportError);
    expect(errors[1]!.message).toContain("missing from the object store");
  });

  it("dead-letters a malformed frame with its error and counts it", async () => {
    const bus = await nats.connect({ name: "dead" });
    const names = jobNames("bustest");
    const raw = new Uint8Array([0xde, 0xad, 0xbe, 0xef]);
    const letter = nextMessage(bus, names.deadLetter("buffer"));
    await bus.flush();
    let error: unknown = null;
    try {
      decodeMessage(raw, registry);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(MalformedMessageError);
    const before = malformedCount("buffer");
    expect(await deadLetter(bus, names, "buffer", raw, error, "ooze.bustest.actor.buffer")).toBe(true);
    expect(malformedCount("buffer")).toBe(before + 1);
    const got = decode((await letter).data) as DeadLetter;
    expect(got.raw).toEqual(raw);
    expect(got.actor).toBe("buffer");
    expect(got.subject).toBe("ooze.bustest.actor.buffer");
    expect(got.error.code).toBe("MALFORMED_MESSAGE");
  });

  it("wraps failures as TransportError: unreachable server, closed connection", async () => {
    const err = await connectBus({ url: "nats://127.0.0.1:1", reconnect: false, connectTimeoutMs: 2_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TransportError);
    expect((err as TransportError).message).toContain("127.0.0.1:1");
    const bus = await nats.connect({ name: "closing" });
    await bus.close();
    expect(await bus.closed).toBeNull();
    await expect(bus.publish("t.x", new Uint8Array(1))).rejects.toBeInstanceOf(TransportError);
    await expect(bus.request("t.x", new Uint8Array(1), { timeoutMs: 100 })).rejects.toBeInstanceOf(OozeError);
  });

  it("KV and object store helpers work", async () => {
    const bus = await nats.connect({ name: "kv" });
    const kv = await bus.kv(jobNames("bustest").kvVersions);
    await kv.put("latest", encode({ v: 3 }));
    expect(decode((await kv.get("latest"))!.value)).toEqual({ v: 3 });
    const store = await bus.obj(jobNames("bustest").objWeights);
    await store.putBlob({ name: "w" }, new Uint8Array([9, 8]));
    expect(Array.from((await store.getBlob("w"))!)).toEqual([9, 8]);
  });
});

describe("resolveNatsUrl", () => {
  it("prefers the flag, then OOZE_NATS_URL, then the topology; null means embedded", () => {
    const none = { user: null, pass: null };
    expect(resolveNatsUrl("nats://tok@h:1", { OOZE_NATS_URL: "nats://e:2" }, { url: "nats://t:3" })).toEqual({ url: "nats://h:1", token: "tok", ...none, source: "flag" });
    expect(resolveNatsUrl(undefined, { OOZE_NATS_URL: "nats://e:2", OOZE_NATS_TOKEN: "et" }, { url: "nats://t:3" })).toEqual({ url: "nats://e:2", token: "et", ...none, source: "env" });
    expect(resolveNatsUrl(null, {}, { url: "nats://t:3", token: "tt" })).toEqual({ url: "nats://t:3", token: "tt", ...none, source: "topology" });
    // a user and password (a node's user of `ooze up`'s embedded server): from the URL, or from the environment
    expect(resolveNatsUrl("nats://u:p@h:1", { OOZE_NATS_TOKEN: "et" })).toEqual({ url: "nats://h:1", token: null, user: "u", pass: "p", source: "flag" });
    expect(resolveNatsUrl("nats://h:1", { OOZE_NATS_USER: "u", OOZE_NATS_PASSWORD: "p", OOZE_NATS_TOKEN: "et" })).toEqual({ url: "nats://h:1", token: null, user: "u", pass: "p", source: "flag" });
    expect(resolveNatsUrl(undefined, {}, {})).toBeNull();
    expect(resolveNatsUrl(undefined, {})).toBeNull();
  });
  it("splits credentials and defaults the port", () => {
    expect(splitNatsUrl("127.0.0.1")).toEqual({ url: "nats://127.0.0.1:4222", token: null, user: null, pass: null });
    expect(splitNatsUrl("nats://u:p@h:5")).toEqual({ url: "nats://h:5", token: null, user: "u", pass: "p" });
    expect(() => splitNatsUrl("nats://[bad")).toThrow(/not a valid URL/);
  });
});
