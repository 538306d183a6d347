// Heartbeats of JetStream messages, sent from a worker thread over a NATS connection of its own.
//
// A consumer that holds a message for long beats it ("+WPI" to the delivery's reply subject) so the
// server does not send it again after ack_wait. When those beats ran on the process's event loop, a
// stall of that loop longer than ack_wait (a saturated machine going through thousands of responses
// at once: 10–52 s at 1,024 engines, Dec 1, docs/experiments/scale.md) let the server deliver
// hundreds of held prompt groups again. The worker's loop does not stall with the main one, so the
// beats go on; but a main thread that has not run for `stallLimitMs` is taken for hung, and the
// worker stops beating its messages until it runs again, so they come back to another consumer
// (a killed process loses its worker with it: its messages come back after ack_wait, as before).
//
// The same worker renews entries that must outlive such a stall: `keep` republishes a payload to a
// subject (a JetStream request, e.g. a KV entry's put to $KV.<bucket>.<key>) on a period, under the
// same rule. A rollout instance's membership entry (actors/rollout/shard.ts, 10-s TTL) expired in
// stalls of 10–57 s at 1,024 engines, and the instances reshuffled their shares of the engines.
//
// The worker is evaluated from a string (plain JavaScript: under tsx on Node 20 a worker cannot load
// TypeScript) and requires the nats.js client from the path the main thread resolved.
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/** How the worker connects: the main connection's servers and credentials, all structured-cloneable. */
export interface HeartbeatConnect {
  servers: string[];
  tls: { caFile?: string; certFile?: string; keyFile?: string } | null;
  /** A credentials file's bytes (JWT + NKey seed), or null. */
  creds: Uint8Array | null;
  token: string | null;
  user: string | null;
  pass: string | null;
  name: string;
  reconnectTimeWait: number;
  /** The main connection's inbox prefix (replies to the worker's requests come under it), or null for the default. */
  inboxPrefix: string | null;
}

/** Beats held JetStream deliveries from a worker thread. */
export interface Heartbeats {
  /**
   * Beats the delivery whose reply subject is `reply` every `ackWaitMs / 3`, while the main thread
   * has run within `stallLimitMs`, until `release` is called as often as `hold` was.
   */
  hold(reply: string, ackWaitMs: number, stallLimitMs: number): void;
  release(reply: string): void;
  /**
   * Publishes `payload` to `subject` as a JetStream request every `everyMs` (one at a time), while
   * the main thread has run within `stallLimitMs`, until `unkeep(subject)`; replaces an earlier keep
   * of the subject. The worker's failures to renew (no answer, a refusal) go to `onError`, once per
   * distinct message until a renewal succeeds.
   */
  keep(subject: string, payload: Uint8Array, everyMs: number, stallLimitMs: number, onError?: (message: string) => void): void;
  /**
   * Stops renewing `subject`; resolves once a renewal in flight has been answered (so a write the
   * caller makes next is stored after it), or at once when the worker is gone.
   */
  unkeep(subject: string): Promise<void>;
  /**
   * Resolves when the worker's connection is up (or the worker failed for good: `onError` says why).
   * A consumer takes no message before it, so none waits unbeaten while the worker starts.
   */
  readonly ready: Promise<void>;
  /** Hears the worker's failures (to connect at all, e.g. bad credentials; to start); returns the unsubscribe function. */
  onError(listener: (message: string) => void): () => void;
  /** Stops the beats and closes the worker's connection. Idempotent. */
  close(): Promise<void>;
}

/** The default stall limit of a consumer with this ack wait: three ack waits, at least a minute. */
export function defaultStallLimitMs(ackWaitMs: number): number {
  return Math.max(60_000, 3 * ackWaitMs);
}

/** How often the main thread marks that it runs. */
const TICK_MS = 250;

const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const { connect, credsAuthenticator } = require(workerData.natsModule);
const c = workerData.connect;
const mainRanAt = new BigInt64Array(workerData.mainRanAt);
const WPI = new TextEncoder().encode("+WPI");
/** "ackWait/stallLimit" -> { replies, timer } */
const groups = new Map();
const groupOf = new Map();
let nc = null;
let closing = false;

function beat(g) {
  if (nc === null || nc.isClosed()) return;
  if (Date.now() - Number(Atomics.load(mainRanAt, 0)) > g.stallLimitMs) return;
  for (const r of g.replies) nc.publish(r, WPI);
}

function hold(reply, ackWaitMs, stallLimitMs) {
  const key = ackWaitMs + "/" + stallLimitMs;
  let g = groups.get(key);
  if (g === undefined) {
    g = { replies: new Set(), stallLimitMs, timer: null };
    g.timer = setInterval(() => beat(g), Math.max(100, ackWaitMs / 3));
    groups.set(key, g);
  }
  g.replies.add(reply);
  groupOf.set(reply, g);
}

function release(reply) {
  const g = groupOf.get(reply);
  if (g === undefined) return;
  groupOf.delete(reply);
  g.replies.delete(reply);
}

/** subject -> { payload, stallLimitMs, timeoutMs, timer, inflight, told } */
const kept = new Map();

function renew(subject, k) {
  if (nc === null || nc.isClosed() || k.inflight !== null) return;
  if (Date.now() - Number(Atomics.load(mainRanAt, 0)) > k.stallLimitMs) return;
  const failed = (error) => {
    if (error !== k.told) k.told = error, parentPort.postMessage({ keepError: subject, error });
  };
  track(k, nc.request(subject, k.payload, { timeout: k.timeoutMs }).then(
    (m) => {
      let ack = null;
      try { ack = JSON.parse(new TextDecoder().decode(m.data)); } catch {}
      if (ack && ack.error) failed(String(ack.error.description || ack.error.code));
      else k.told = null;
    },
    (e) => failed(String(e && e.message)),
  ));
}

/** k's renewal in flight is p until p settles. */
function track(k, p) {
  k.inflight = p;
  p.finally(() => { if (k.inflight === p) k.inflight = null; });
}

function keep(subject, payload, everyMs, stallLimitMs) {
  const old = kept.get(subject);
  if (old !== undefined) clearInterval(old.timer);
  const k = { payload, stallLimitMs, timeoutMs: Math.max(1000, Math.min(2 * everyMs, 10000)), timer: null, inflight: null, told: null };
  // (a renewal still in flight from the keep this one replaces is waited for like its own)
  if (old !== undefined && old.inflight !== null) track(k, old.inflight);
  k.timer = setInterval(() => renew(subject, k), everyMs);
  kept.set(subject, k);
}

async function unkeep(subject) {
  const k = kept.get(subject);
  if (k !== undefined) {
    kept.delete(subject);
    clearInterval(k.timer);
    if (k.inflight !== null) await k.inflight;
  }
  parentPort.postMessage({ unkept: subject });
}

parentPort.on("message", async (m) => {
  if (Array.isArray(m)) {
    if (m[0] === "h") return void hold(m[1], m[2], m[3]);
    if (m[0] === "r") return void release(m[1]);
    if (m[0] === "k") return void keep(m[1], m[2], m[3], m[4]);
    if (m[0] === "u") return void (await unkeep(m[1]));
  }
  if (m.close) {
    closing = true;
    for (const g of groups.values()) clearInterval(g.timer);
    for (const k of kept.values()) clearInterval(k.timer);
    if (nc !== null) await nc.close().catch(() => {});
    parentPort.close();
  }
});

connect({
  servers: c.servers,
  ...(c.tls !== null ? { tls: c.tls } : {}),
  ...(c.creds !== null ? { authenticator: credsAuthenticator(c.creds) } : {}),
  ...(c.token !== null ? { token: c.token } : {}),
  ...(c.user !== null && c.pass !== null ? { user: c.user, pass: c.pass } : {}),
  ...(c.inboxPrefix !== null ? { inboxPrefix: c.inboxPrefix } : {}),
  name: c.name,
  reconnect: true,
  maxReconnectAttempts: -1,
  reconnectTimeWait: c.reconnectTimeWait,
  waitOnFirstConnect: true,
  noAsyncTraces: true,
}).then(
  async (conn) => {
    if (closing) return void conn.close();
    nc = conn;
    parentPort.postMessage({ ready: true });
    // a beat the server refuses (a permissions violation) is reported once per distinct message
    const told = new Set();
    for await (const s of conn.status()) {
      const error = s.type === "error" && s.error ? String(s.error.message) : null;
      if (error !== null && !told.has(error)) told.add(error), parentPort.postMessage({ error });
    }
  },
  (e) => parentPort.postMessage({ error: String(e && e.message) }),
);
`;

/**
 * Starts the worker. Its connection retries until it is up (and after every loss), like the main
 * one. The worker does not keep the process alive.
 */
export function startHeartbeats(connect: HeartbeatConnect): Heartbeats {
  const natsModule = createRequire(import.meta.url).resolve("@nats-io/transport-node");
  const mainRanAt = new SharedArrayBuffer(8);
  const ran = new BigInt64Array(mainRanAt);
  const mark = () => Atomics.store(ran, 0, BigInt(Date.now()));
  mark();
  const ticker = setInterval(mark, TICK_MS);
  ticker.unref();
  const worker = new Worker(WORKER, { eval: true, workerData: { natsModule, connect, mainRanAt } });
  worker.unref();
  const listeners = new Set<(message: string) => void>();
  const onError = (message: string) => {
    for (const l of listeners) l(message);
  };
  let isReady: () => void = () => {};
  const ready = new Promise<void>((r) => (isReady = r));
  const keepErrors = new Map<string, (message: string) => void>();
  const unkeeping = new Map<string, (() => void)[]>();
  const unkept = (subject: string) => {
    for (const r of unkeeping.get(subject) ?? []) r();
    unkeeping.delete(subject);
  };
  worker.on("message", (m: { ready?: true; error?: string; keepError?: string; unkept?: string }) => {
    if (m.unkept !== undefined) return unkept(m.unkept);
    if (m.keepError !== undefined) return keepErrors.get(m.keepError)?.(`renewing ${m.keepError}: ${m.error}`);
    if (m.ready || m.error !== undefined) isReady();
    if (m.error !== undefined) onError(`heartbeat connection: ${m.error}`);
  });
  worker.on("error", (e) => onError(`heartbeat worker: ${e.message}`));
  const exited = new Promise<void>((r) => worker.once("exit", () => r()));
  let gone = false;
  void exited.then(() => {
    gone = true;
    isReady();
    for (const s of [...unkeeping.keys()]) unkept(s);
  });

  // Holds are counted here (a message can be held twice: handled and deferred), and the worker is
  // told of the first hold and the last release at once: a handler that blocks the event loop right
  // after its message was taken must not leave it unknown to the worker.
  const counts = new Map<string, number>();
  let closed = false;
  const send = (op: ["h", string, number, number] | ["r", string] | ["k", string, Uint8Array, number, number] | ["u", string]) => {
    if (!closed) worker.postMessage(op);
  };
  return {
    ready,
    hold(reply, ackWaitMs, stallLimitMs) {
      const n = counts.get(reply) ?? 0;
      counts.set(reply, n + 1);
      if (n === 0) send(["h", reply, ackWaitMs, stallLimitMs]);
    },
    release(reply) {
      const n = counts.get(reply);
      if (n === undefined) return;
      if (n > 1) return void counts.set(reply, n - 1);
      counts.delete(reply);
      send(["r", reply]);
    },
    keep(subject, payload, everyMs, stallLimitMs, onKeepError) {
      if (onKeepError) keepErrors.set(subject, onKeepError);
      else keepErrors.delete(subject);
      send(["k", subject, payload, everyMs, stallLimitMs]);
    },
    unkeep(subject) {
      keepErrors.delete(subject);
      if (closed || gone) return Promise.resolve();
      const done = new Promise<void>((r) => unkeeping.set(subject, [...(unkeeping.get(subject) ?? []), r]));
      send(["u", subject]);
      return done;
    },
    onError(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    async close() {
      if (closed) return;
      closed = true;
      clearInterval(ticker);
      worker.postMessage({ close: true });
      const timer = setTimeout(() => void worker.terminate(), 2_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
