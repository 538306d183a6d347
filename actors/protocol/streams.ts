// The JetStream plumbing of the training loop's actors: the job's streams (prompts and samples: work
// queues; batches and weights: kept as long as a restarted trainer may replay them; all with a long
// duplicate window so a regenerated message is stored once), a consumer loop that decodes and
// validates each message once, dead-letters malformed ones and acks only after the handler returned
// or, when it deferred, when it says so (heartbeats keep long handlers' and deferred messages theirs),
// and the versions KV record that only moves forward.
import type { JsMsg } from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";
import { subjectOf } from "../../src/actor/index.ts";
import { deadLetter, decodeMessage, type AnyMessageDef, type BodyOf, type MessageOf, type MessageRegistry } from "../../src/codec/index.ts";
import { OozeError, toOozeError } from "../../src/errors.ts";
import { countDelivery } from "../../src/metrics.ts";
import { isJetStreamTransient, PULL_OPTIONS, settleWithin, toTransportError, whileElecting, type Bus } from "../../src/transport/bus.ts";
import { defaultStallLimitMs, type Heartbeats } from "../../src/transport/heartbeats.ts";
import type { JobNames } from "../../src/transport/names.ts";
import { versionRecord, type VersionRecord } from "./messages.ts";

/** Sequences a consumer remembers as handled, to ack a late redelivery of one without handling it again. */
const DONE_MEMORY = 65_536;

/** Handlers a consumer starts in one turn of the event loop, at most (see `pump` in consumeStream). */
const STARTS_PER_TURN = 16;

/** Duplicate window of the data streams: longer than any redelivery after a killed rollout. */
const DEDUP_NS = 15 * 60 * 1e9;

/**
 * Creates (idempotently) the loop's streams: PROMPTS and SAMPLES (work queues), BATCHES and WEIGHTS
 * (the last 2·checkpointEvery + 8 messages: a resumed trainer replays at most one checkpoint interval).
 */
export async function ensureTrainStreams(bus: Bus, names: JobNames, train: { checkpointEvery: number }): Promise<void> {
  const common = { storage: "file", duplicate_window: DEDUP_NS } as const;
  const kept = { ...common, max_msgs: 2 * train.checkpointEvery + 8 };
  await bus.ensureStream(names.streamPrompts, [names.trainPrompts], { ...common, retention: "workqueue" } as never);
  // Samples leave the stream once the buffer acks them (with their batch): storage stays one round's worth.
  await bus.ensureStream(names.streamSamples, [names.trainSamples], { ...common, retention: "workqueue" } as never);
  await bus.ensureStream(names.streamBatches, [names.trainBatches], kept as never);
  await bus.ensureStream(names.streamWeights, [names.trainWeights], kept as never);
  // Step metrics: kept (bounded) so a display that attaches late replays the run so far.
  await bus.ensureStream(names.streamMetrics, [names.trainMetrics], { ...common, max_msgs: 100_000 } as never);
}

/**
 * Publishes one message with `msgID` as both the envelope id and the JetStream dedup id. A publish
 * that fails with a retryable error (no ack: NATS restarting, or the stream electing a leader, which
 * answers "no responders" at once) is sent again, which the msgID makes safe, for up to `forMs`
 * (default 60 s: a cluster's re-election takes 4–9 s) with a backoff of 0.25 s doubling to 1 s;
 * then, on any other error, or once the bus is closed, the last error is thrown. (A count of
 * attempts ran out in 7 s of immediate "no responders" answers, crashing the publishing actor in the
 * middle of an election: bench failover.)
 */
export async function publish<D extends AnyMessageDef>(bus: Bus, subject: string, def: D, body: BodyOf<D>, msgID: string, sender: string, forMs = 60_000): Promise<{ duplicate: boolean }> {
  const data = def.encode(body, { id: msgID, sender });
  const until = Date.now() + forMs;
  let closed = false;
  for (let attempt = 0; ; attempt++) {
    try {
      const ack = await bus.jsPublish(subject, data, { msgID, timeoutMs: 4_000 });
      return { duplicate: ack.duplicate };
    } catch (e) {
      // watched from the first failure on (not per publish: a job publishes for its whole life)
      if (attempt === 0) void bus.closed.then(() => (closed = true));
      const transient = e instanceof OozeError && e.retryable;
      if (!transient || closed || Date.now() >= until) throw e;
      await new Promise((r) => setTimeout(r, Math.min(1_000, 250 * 2 ** attempt)));
    }
  }
}

/** Options of consumeStream. */
export interface ConsumeOptions<D extends AnyMessageDef> {
  bus: Bus;
  names: JobNames;
  stream: string;
  subject: string;
  /** Durable consumer name (shared by every instance of the consuming role). */
  durable: string;
  registry: MessageRegistry<D>;
  /** Actor path that dead letters are filed under. */
  actor: string;
  /** Messages handled at once. Default 1: in stream order. */
  concurrency?: number;
  /** Messages delivered and not acked, at most (default `concurrency`; raise it when handlers defer acks). */
  maxAckPending?: number;
  /** Messages held at once, handled or pulled and waiting for a handler (default `concurrency`); a serial consumer of many small messages wants more. */
  prefetch?: number;
  /** Redelivery after this long without ack or heartbeat (a killed consumer's messages come back). Default 30 s. */
  ackWaitMs?: number;
  /**
   * The heartbeats (sent from a worker thread: src/transport/heartbeats.ts) stop when this process's
   * event loop has not run for this long, taken for hung: its messages then come back after
   * ack_wait. Default three ack waits, at least a minute.
   */
  stallLimitMs?: number;
  /**
   * Handles one message; it is acked when this resolves, unless the handler called `defer()`: then
   * it is acked when the returned function is called (heartbeats keep it until then).
   */
  handle(msg: MessageOf<D>, info: { deliveryCount: number; defer(): () => void }): Promise<void>;
  /** Replay from this stream sequence: the durable consumer is created anew, starting there. */
  startSeq?: number;
  log(line: string): void;
}

/** A running consumer. */
export interface StreamConsumer {
  readonly stats: { handled: number; failed: number; malformed: number };
  /** Stops pulling; waits up to `graceMs` for handlers in flight (unacked ones come back to the next consumer). */
  stop(graceMs?: number): Promise<void>;
}

/**
 * Acks `m` and waits for the server to confirm it, retrying while the connection is away: a plain ack
 * sent as the nats-server restarts is lost. Gives up after `ackWaitMs` (the message then comes back
 * and its handler sees it was done). Even a confirmed ack can be forgotten by a nats-server that is
 * SIGKILLed before it writes its consumer state: the message then counts against max_ack_pending
 * until ack_wait passes, so consumers that take few messages at a time (rollout, trainer,
 * weight-sync) keep a short ack wait and beat while they work (docs/reliability.md, finding 5).
 */
async function confirmAck(m: JsMsg, stopped: () => boolean, ackWaitMs: number): Promise<void> {
  const until = Date.now() + ackWaitMs;
  for (let attempt = 0; ; attempt++) {
    try {
      await m.ackAck({ timeout: 2_000 });
      return;
    } catch {
      // Stopping (the actor restarts): the first attempt was made, redelivery covers the rest.
      if (stopped() || Date.now() >= until) return;
      await new Promise((r) => setTimeout(r, Math.min(1_000, 100 * 2 ** attempt)));
    }
  }
}

/**
 * The reply subject of a delivery, where its acks and beats go. nats.js's JsMsg type does not name
 * it; its implementation has it (checked, so a client that drops it fails loudly, not silently unbeaten).
 */
function replyOf(m: JsMsg): string {
  const reply = (m as unknown as { reply?: unknown }).reply;
  if (typeof reply !== "string" || reply === "") throw new OozeError("TRANSPORT", `a JetStream message on ${m.subject} has no reply subject to beat`);
  return reply;
}

/**
 * Messages by stream sequence, each beaten while it is in the map (a delivery's beats go with it when
 * a later delivery of the same message takes its place). `silence()` stops the beats and keeps the
 * messages (to ack them later).
 */
class Beaten {
  private readonly m = new Map<number, JsMsg>();
  private silent = false;
  constructor(
    private readonly beats: Heartbeats,
    private readonly ackWaitMs: number,
    private readonly stallLimitMs: number,
  ) {}
  get size(): number {
    return this.m.size;
  }
  has(seq: number): boolean {
    return this.m.has(seq);
  }
  get(seq: number): JsMsg | undefined {
    return this.m.get(seq);
  }
  values(): IterableIterator<JsMsg> {
    return this.m.values();
  }
  first(): [number, JsMsg] | undefined {
    return this.m.entries().next().value;
  }
  set(seq: number, msg: JsMsg): void {
    const old = this.m.get(seq);
    if (old === msg) return;
    if (old !== undefined && !this.silent) this.beats.release(replyOf(old));
    if (!this.silent) this.beats.hold(replyOf(msg), this.ackWaitMs, this.stallLimitMs);
    this.m.set(seq, msg);
  }
  delete(seq: number): void {
    const old = this.m.get(seq);
    if (old === undefined) return;
    if (!this.silent) this.beats.release(replyOf(old));
    this.m.delete(seq);
  }
  silence(): void {
    if (!this.silent) for (const msg of this.m.values()) this.beats.release(replyOf(msg));
    this.silent = true;
  }
  clear(): void {
    this.silence();
    this.m.clear();
  }
}

/** Consumes a stream with a durable pull consumer; see the file comment for the delivery rules. */
export function consumeStream<D extends AnyMessageDef>(o: ConsumeOptions<D>): StreamConsumer {
  const concurrency = o.concurrency ?? 1;
  const ackWaitMs = o.ackWaitMs ?? 30_000;
  const stats = { handled: 0, failed: 0, malformed: 0 };
  const running = new Set<Promise<void>>();
  // Heartbeats: every message being handled, deferred (held) or pulled and waiting (queued) is
  // beaten, from the bus's heartbeat worker, so that a stalled event loop here does not stop the
  // beats (up to the stall limit). Held messages lose their beat when stop() begins; a handler still
  // running when stop()'s grace ends loses its beat then, so its message comes back after ack_wait.
  // All three are keyed by stream sequence and hold the message's latest delivery (see `again`).
  const beats = o.bus.heartbeats();
  const offBeatErrors = beats.onError((e) => o.log(`consumer ${o.durable} on ${o.stream}: ${e}`));
  const beaten = () => new Beaten(beats, ackWaitMs, o.stallLimitMs ?? defaultStallLimitMs(ackWaitMs));
  const handling = beaten();
  const held = beaten();
  /** Pulled and waiting for a free handler, oldest first (beaten too: see the pull loop). */
  const queued = beaten();
  // Sequences whose handler finished (acked, or its ack deferred), the most recent DONE_MEMORY.
  const done = new Set<number>();
  /**
   * A message delivered again while this consumer still handles it, or after its handler finished:
   * its beats came later than ack_wait (the process stalled), and the server sent it again. It is
   * not handled a second time. A redelivered rollout prompt was generated twice: at 1,024 engines
   * 3,995 of 4,060 groups in flight were (Dec 1, docs/experiments/scale.md). The latest delivery
   * takes the earlier one's place for the beats and the ack. Returns whether `m` was such a one.
   */
  const again = (m: JsMsg): boolean => {
    const seq = m.info.streamSequence;
    if (handling.has(seq) || held.has(seq) || queued.has(seq)) {
      countDelivery(o.stream, o.durable, m.info.deliveryCount);
      if (handling.has(seq)) handling.set(seq, m);
      if (held.has(seq)) held.set(seq, m);
      if (queued.has(seq)) queued.set(seq, m);
      return true;
    }
    if (done.has(seq)) {
      countDelivery(o.stream, o.durable, m.info.deliveryCount);
      m.ack();
      return true;
    }
    return false;
  };
  const finished = (seq: number) => {
    done.add(seq);
    if (done.size > DONE_MEMORY) done.delete(done.values().next().value!);
  };
  /** Resolves the pull loop's wait for a free handler slot. */
  let freed: (() => void) | null = null;
  let stopped = false;
  let iter: { stop(): void } | null = null;

  const one = async (m: JsMsg): Promise<void> => {
    countDelivery(o.stream, o.durable, m.info.deliveryCount);
    const seq = m.info.streamSequence; // in `handling` already (see pump)
    /** The message's latest delivery (a redelivery while it is handled replaces it: see `again`). */
    const latest = () => handling.get(seq) ?? held.get(seq) ?? m;
    try {
      let msg: MessageOf<D>;
      try {
        msg = decodeMessage(m.data.length > 0 ? m.data : await o.bus.payload(m), o.registry);
      } catch (e) {
        // The body could not be fetched (a large payload's chunk read timed out or failed): the
        // message is fine, the transport is not. Until Dec 1 a timeout here was taken for a malformed
        // message and dead-lettered: a 1,024-engine run lost its first batch so, and never trained.
        if (e instanceof OozeError && (e.code === "TRANSPORT" || e.code === "TIMEOUT")) {
          o.log(`fetching the body of a message on ${m.subject} failed (delivery ${m.info.deliveryCount}; retrying): ${e.message}`);
          return void latest().nak(1_000);
        }
        stats.malformed++;
        o.log(`malformed message on ${m.subject} dead-lettered to ${o.names.deadLetter(subjectOf(o.actor))}: ${(e as Error).message}`);
        await deadLetter(o.bus, o.names, subjectOf(o.actor), m.data, e, m.subject);
        return void latest().term();
      }
      let deferred = false;
      const defer = () => {
        deferred = true;
        held.set(seq, latest());
        return () => {
          const d = held.get(seq);
          if (d === undefined) return;
          held.delete(seq);
          d.ack();
        };
      };
      try {
        await o.handle(msg, { deliveryCount: m.info.deliveryCount, defer });
        if (!deferred) await confirmAck(latest(), () => stopped, ackWaitMs);
        finished(seq);
        stats.handled++;
      } catch (e) {
        stats.failed++;
        held.delete(seq);
        if (stopped) return; // redelivered after ack_wait to whoever consumes next
        const n = m.info.deliveryCount;
        o.log(`handling ${msg.kind} ${msg.id} failed (delivery ${n}; retrying): ${toOozeError(e).message}`);
        latest().nak(Math.min(5_000, 200 * 2 ** Math.max(0, n - 1)));
      }
    } finally {
      handling.delete(seq);
    }
  };

  /** Handlers started in this turn of the event loop; reset (and the pump run again) by a setImmediate. */
  let startedThisTurn = 0;
  /**
   * Starts handlers for queued messages while there are free ones, at most STARTS_PER_TURN a turn
   * (the rest in the turns after, with timers — the heartbeats — and I/O between).
   * A pull's messages arrive in microtasks, and a handler runs synchronously up to its first real
   * I/O: without the limit a rollout instance started its whole pull (256 prompt groups, 2,048
   * episodes, each routed and written to a socket) in one run of the microtask queue, 5.5 s of wall
   * time on a loaded machine, in which no heartbeat or response was handled (Dec 1, 1,024 engines).
   */
  const pump = () => {
    while (running.size < concurrency && queued.size > 0) {
      if (startedThisTurn >= STARTS_PER_TURN) return;
      if (startedThisTurn++ === 0)
        setImmediate(() => {
          startedThisTurn = 0;
          if (!stopped) pump();
        });
      const [seq, m] = queued.first()!;
      // handled before it leaves the queue: its beat goes on, with no release and hold sent to the worker
      handling.set(seq, m);
      queued.delete(seq);
      // (one() handles its own failures; what escapes it, e.g. a nak on a closed connection, is logged)
      const p: Promise<void> = one(m).catch((e: unknown) => o.log(`consumer ${o.durable} on ${o.stream}: ${(e as Error).message}`)).finally(() => {
        running.delete(p);
        pump();
        freed?.();
        freed = null;
      });
      running.add(p);
    }
  };

  // After a reconnect the server may have lost the pull requests in flight (a restarted nats-server
  // has): the fetch in flight is ended, and the loop pulls anew (docs/reliability.md, finding 5).
  const offStatus = o.bus.onStatus((s) => {
    if (s.type === "reconnect") iter?.stop();
  });
  const start = o.startSeq === undefined ? {} : { deliver_policy: "by_start_sequence", opt_start_seq: o.startSeq };
  // The loop pulls only what it has room for: `concurrency` handlers, or `prefetch` messages when
  // more. nats.js's consume() pulls again as messages arrive, handled or not, so its buffer grew to
  // the consumer's max_ack_pending, unbeaten, and the server delivered the waiting messages again
  // after ack_wait: at 1,024 engines with a 60-s ack wait, 2,847 rollout prompts in 7 minutes, each
  // generated twice (Dec 1, docs/experiments/scale.md). Each fetch asks for the free room, and what
  // it brings waits in `queued`, beaten, for a handler.
  const room = Math.max(concurrency, o.prefetch ?? concurrency);
  void (async () => {
    if (o.startSeq !== undefined) await (await o.bus.jsm()).consumers.delete(o.stream, o.durable).catch(() => false);
    await beats.ready; // nothing is taken before it can be beaten
    while (!stopped) {
      try {
        const consumer = await o.bus.ensureConsumer(o.stream, o.durable, {
          filter_subject: o.subject,
          ack_wait: ackWaitMs * 1_000_000,
          max_ack_pending: o.maxAckPending ?? concurrency,
          max_deliver: -1,
          ...start,
        } as never);
        while (!stopped) {
          const want = room - running.size - queued.size;
          if (want <= 0) {
            await new Promise<void>((r) => (freed = r));
            continue;
          }
          const msgs = await consumer.fetch({ ...PULL_OPTIONS, max_messages: want });
          iter = msgs;
          // Stopped while fetch() was starting: this pull must not take a message nobody handles.
          if (stopped) msgs.stop();
          for await (const m of msgs) {
            if (stopped) {
              m.nak(); // back to the next consumer at once, not after ack_wait
              continue;
            }
            if (again(m)) continue;
            queued.set(m.info.streamSequence, m);
            pump();
          }
          iter = null;
        }
      } catch (e) {
        if (!stopped) o.log(`consumer ${o.durable} on ${o.stream}: ${(e as Error).message}; reconnecting`);
      }
      iter = null;
      if (!stopped) await new Promise((r) => setTimeout(r, 250));
    }
  })();

  return {
    stats,
    async stop(graceMs = 10_000) {
      if (stopped) return;
      stopped = true;
      held.silence();
      offStatus();
      iter?.stop();
      freed?.();
      // never started: back to the next consumer at once
      for (const m of queued.values()) m.nak();
      queued.clear();
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise<void>((r) => (timer = setTimeout(r, graceMs)));
      // The pull loop ends by itself (it takes nothing once stopped): only handlers in flight are waited for.
      await Promise.race([Promise.allSettled([...running]), grace]);
      clearTimeout(timer);
      // A handler that never settles (it waits on an actor that stopped) must not hold its message for
      // ever: without its beat the server hands it to the next consumer after ack_wait.
      handling.clear();
      offBeatErrors();
    },
  };
}

const LATEST = "latest";
const text = new TextEncoder();
const untext = new TextDecoder();

/** The job's versions KV bucket: the latest synced weight version and step, only moving forward. */
export class VersionsKv {
  private constructor(
    private readonly kv: KV,
    /** Resolves when the bus's connection is closed for good: watches end with it. */
    private readonly closed: Promise<unknown>,
  ) {
    void closed.then(() => (this.isClosed = true));
  }

  /** Whether the bus's connection is closed for good. */
  private isClosed = false;

  /** Opens (creating if needed) `names.kvVersions`. */
  static async open(bus: Bus, names: JobNames): Promise<VersionsKv> {
    return new VersionsKv(await bus.kv(names.kvVersions, { history: 8 }), bus.closed);
  }

  /** The latest record, or null before the first sync. */
  async get(): Promise<VersionRecord | null> {
    return (await this.entry())?.record ?? null;
  }

  private async entry(): Promise<{ record: VersionRecord; revision: number } | null> {
    const e = await this.kv.get(LATEST);
    if (!e || e.operation !== "PUT" || e.value.length === 0) return null;
    return { record: versionRecord.parse(JSON.parse(untext.decode(e.value))), revision: e.revision };
  }

  /**
   * Records `r` unless the stored record is ahead of it (compare-and-set, so two writers cannot move
   * it back). Throws CONFIG_INVALID when `r`'s version is below the stored one.
   */
  async advance(r: VersionRecord): Promise<void> {
    for (let attempt = 0; attempt < 10; attempt++) {
      // A cluster electing the bucket's leader is waited out (whileElecting), not counted as a lost race.
      const cur = await whileElecting(() => this.entry(), { closed: () => this.isClosed });
      if (cur && r.version < cur.record.version)
        throw new OozeError("CONFIG_INVALID", `versions KV: version ${r.version} is below the recorded ${cur.record.version}; versions only increase`);
      if (cur && r.version === cur.record.version && r.step <= cur.record.step) return;
      const data = text.encode(JSON.stringify(r));
      try {
        await whileElecting(() => (cur ? this.kv.update(LATEST, data, cur.revision) : this.kv.create(LATEST, data)), { closed: () => this.isClosed });
        return;
      } catch (e) {
        if (isJetStreamTransient(e)) throw toTransportError(e, "versions KV: recording the version");
        // another writer got there first: read again
      }
    }
    throw new OozeError("TRANSPORT", "versions KV: could not record the version after 10 compare-and-set attempts", { retryable: true });
  }

  /**
   * Calls `on` with the current record and every later one, each once and in order (watching again if
   * the watch ends, e.g. across a nats-server restart); returns the stop function. Beside the watch,
   * the record is read every `pollMs` (a get, no consumer): a KV watch is an ephemeral one-replica
   * consumer, and when the server holding it dies, nats.js re-makes it on missed heartbeats — where
   * the cluster may place it on the dead server again — so a watch can go quiet for as long as the
   * server stays down (40 s and more: scripts/experiments/kv-watch-failover-probe.mts). A record the
   * poll finds first is delivered by the poll, and a watch that has not caught up by the next poll is
   * made again. The stop function resolves once the watch has stopped, a re-watch or poll in flight
   * included (waiting 5 s at most: one stuck behind a reconnecting connection must not hang a
   * shutdown); await it before the bus closes: a watch made while the connection drains leaves
   * nats.js's heartbeat timer armed for good, and the process never exits (docs/reliability.md,
   * finding 10).
   */
  async watch(on: (r: VersionRecord) => void, pollMs = 1_000): Promise<() => Promise<void>> {
    let stopped = false;
    let seen = 0; // the newest revision delivered
    const deliver = (revision: number, value: Uint8Array) => {
      if (revision <= seen) return;
      seen = revision;
      try {
        on(versionRecord.parse(JSON.parse(untext.decode(value))));
      } catch {
        // not a version record
      }
    };
    let it = await this.kv.watch({ key: LATEST });
    let watched = 0; // the newest revision the watch itself has seen
    const stop = () => {
      stopped = true;
      clearInterval(poller);
      it.stop();
    };
    let polling: Promise<void> | null = null;
    let behindAt = 0; // a revision the poll found before the watch
    const poll = async () => {
      const e = await this.kv.get(LATEST).catch(() => null);
      if (stopped || !e) return;
      if (behindAt > 0 && watched < behindAt) {
        behindAt = 0;
        it.stop(); // the watch is stuck: the loop below makes it again
      }
      if (e.revision > watched && e.revision > behindAt) behindAt = e.revision;
      if (e.operation === "PUT" && e.value.length > 0) deliver(e.revision, e.value);
    };
    const poller = setInterval(() => {
      polling ??= poll().finally(() => (polling = null));
    }, pollMs);
    // A closed connection ends the watch for good (no re-watching a bus that is gone).
    void this.closed.then(stop);
    const loop = (async () => {
      while (!stopped) {
        try {
          for await (const e of it) {
            watched = Math.max(watched, e.revision);
            if (e.operation !== "PUT" || e.value.length === 0) continue;
            deliver(e.revision, e.value);
          }
        } catch {
          // the watch failed: watch again below
        }
        if (stopped) break;
        await new Promise((r) => setTimeout(r, 250));
        if (stopped) break;
        it = await this.kv.watch({ key: LATEST }).catch(() => it);
        if (stopped) it.stop(); // stopped while the new watch was being made
      }
    })();
    return async () => {
      stop();
      await settleWithin(Promise.all([loop, polling]), 5_000);
    };
  }

  /** Resolves with the first record whose step is at least `step`. */
  async waitForStep(step: number): Promise<VersionRecord> {
    const f = await this.follow();
    try {
      return await f.until(step);
    } finally {
      await f.stop();
    }
  }

  /**
   * A standing watch: `until(step)` resolves with the first record whose step is at least `step`
   * (at once when one was seen already); `stop()` ends the watch (see `watch`: await it before the bus
   * closes) and rejects the waits still pending with ACTOR_STOPPED: a trainer stopping while it waits
   * for a version the stopped weight-sync actor will never record ends its handler at once.
   */
  async follow(): Promise<{ until(step: number): Promise<VersionRecord>; stop(): Promise<void> }> {
    let latest: VersionRecord | null = null;
    let stopped = false;
    const waiters: { step: number; resolve: (r: VersionRecord) => void; reject: (e: Error) => void }[] = [];
    const stop = await this.watch((r) => {
      if (latest && r.step <= latest.step) return;
      latest = r;
      for (let i = waiters.length - 1; i >= 0; i--) {
        if (r.step >= waiters[i]!.step) {
          waiters[i]!.resolve(r);
          waiters.splice(i, 1);
        }
      }
    });
    const stoppedError = (step: number) => new OozeError("ACTOR_STOPPED", `versions KV: stopped while waiting for the version of step ${step}`);
    return {
      until: (step) => {
        if (latest && latest.step >= step) return Promise.resolve(latest);
        if (stopped) return Promise.reject(stoppedError(step));
        return new Promise((resolve, reject) => waiters.push({ step, resolve, reject }));
      },
      stop: async () => {
        stopped = true;
        for (const w of waiters.splice(0)) w.reject(stoppedError(w.step));
        await stop();
      },
    };
  }
}

/**
 * The stream sequence of the first message on `stream` whose decoded step is above `step`, scanning
 * back from the end (a resumed trainer replays from there); last sequence + 1 when there is none.
 */
export async function seqAfterStep<D extends AnyMessageDef>(bus: Bus, stream: string, registry: MessageRegistry<D>, stepOf: (m: MessageOf<D>) => number, step: number): Promise<number> {
  const jsm = await bus.jsm();
  const { state } = await whileElecting(() => jsm.streams.info(stream));
  let first = state.last_seq + 1;
  for (let seq = state.last_seq; seq >= state.first_seq && seq > 0; seq--) {
    const m = await whileElecting(() => jsm.streams.getMessage(stream, { seq }));
    if (!m) continue;
    let s: number;
    try {
      s = stepOf(decodeMessage(await bus.payload({ data: m.data, headers: m.header }), registry));
    } catch {
      continue; // a malformed frame (its consumer dead-letters it)
    }
    if (s <= step) break;
    first = seq;
  }
  return first;
}

/** Every message now on `stream` that decodes with `registry`, oldest first (malformed frames skipped). */
export async function scanStream<D extends AnyMessageDef>(bus: Bus, stream: string, registry: MessageRegistry<D>): Promise<MessageOf<D>[]> {
  const jsm = await bus.jsm();
  const { state } = await whileElecting(() => jsm.streams.info(stream));
  const out: MessageOf<D>[] = [];
  for (let seq = Math.max(1, state.first_seq); seq <= state.last_seq && state.messages > 0; seq++) {
    // null: acked or deleted. A timeout is not "gone": while the stream elects a leader, skipping a
    // message would restart the loop from a wrong position.
    const m = await whileElecting(() => jsm.streams.getMessage(stream, { seq }));
    if (!m) continue; // acked (work queue) or deleted
    try {
      out.push(decodeMessage(await bus.payload({ data: m.data, headers: m.header }), registry));
    } catch {
      // a malformed frame (its consumer dead-letters it)
    }
  }
  return out;
}

/** The last message on `stream` that decodes with `registry` (malformed frames skipped), or null. */
export async function lastMessage<D extends AnyMessageDef>(bus: Bus, stream: string, registry: MessageRegistry<D>): Promise<MessageOf<D> | null> {
  const jsm = await bus.jsm();
  const { state } = await whileElecting(() => jsm.streams.info(stream));
  for (let seq = state.last_seq; seq >= state.first_seq && seq > 0; seq--) {
    const m = await whileElecting(() => jsm.streams.getMessage(stream, { seq }));
    if (!m) continue;
    try {
      return decodeMessage(await bus.payload({ data: m.data, headers: m.header }), registry);
    } catch {
      // a malformed frame: look further back
    }
  }
  return null;
}
