// Durable mailboxes on JetStream, for messages that must not be lost. Senders publish to
// `names.mailbox(path)` with the envelope id as JetStream msgID (the stream's duplicate window drops
// re-sends); the hosting process pulls from one durable consumer per actor, hands each message to
// the actor with `ctx.messageId` (stable across redeliveries) and acks only after the handler
// returned. A crash naks with a backoff; a killed process's messages come back after ack_wait.
// Handlers make their effect idempotent on `ctx.messageId`; the consumer also skips ids it has
// already completed (a lost ack after a nats-server restart) and never runs two copies at once.
import type { JsMsg } from "@nats-io/jetstream";
import { deadLetter, encode, makeEnvelope } from "../codec/index.ts";
import { OozeError } from "../errors.ts";
import { PULL_OPTIONS, type Bus } from "../transport/bus.ts";
import type { JobNames } from "../transport/names.ts";
import { countDelivery } from "../metrics.ts";
import { ACTOR_MSG_KIND, decodeEnvelope, remoteLayer, subjectOf, validateBody } from "./remote.ts";
import { internals, type ActorSystem } from "./system.ts";

/** Options of a durable mailbox (stream and consumer settings). */
export interface DurableOptions {
  /** Redelivery after this long without ack (a killed consumer's messages come back). Default 30 s. */
  ackWaitMs?: number;
  /** Messages delivered and not yet acked, at most (default 512). */
  maxAckPending?: number;
  /** Delay before a message whose handler crashed is redelivered (default 100 ms · 2^(n-1), at most 5 s). */
  nakDelayMs?: (deliveryCount: number) => number;
  /** JetStream duplicate window for msgID dedup (default 2 min). */
  duplicateWindowMs?: number;
  /** How many completed ids the consumer remembers to skip redeliveries (default 100 000). */
  rememberIds?: number;
}

/** Counters of one durable mailbox. */
export interface DurableStats {
  /** Messages the consumer received (every delivery, redeliveries included). */
  delivered: number;
  /** Ids whose handler is running (a redelivery of one waits for it and is acked with it). */
  readonly running: number;
  acked: number;
  naked: number;
  /** Redeliveries of ids already completed here (acked without running the handler again). */
  skipped: number;
  malformed: number;
}

/** A served durable mailbox. */
export interface DurableMailbox {
  readonly path: string;
  readonly stats: DurableStats;
  /** Stops pulling; in-flight messages finish and are acked, the rest wait in the stream. */
  stop(): Promise<void>;
}

/** Sender side of a durable mailbox. */
export interface DurableRef<M> {
  readonly path: string;
  /** Persists a message (resolves after the stream stored it). Same `id` twice = stored once. */
  send(msg: M, opts?: { id?: string; timeoutMs?: number }): Promise<{ id: string; duplicate: boolean; seq: number }>;
}

/** Creates (or updates) the job's mailbox stream: work-queue retention, file storage, dedup window. */
export async function ensureMailboxStream(bus: Bus, names: JobNames, opts: DurableOptions = {}): Promise<void> {
  await bus.ensureStream(names.streamMailboxes, [`${names.prefix}.mailbox.>`], {
    retention: "workqueue",
    storage: "file",
    duplicate_window: (opts.duplicateWindowMs ?? 120_000) * 1_000_000,
  } as never);
}

/** Sender for the durable mailbox of `path` (any process of the job). */
export async function durableRef<M>(system: ActorSystem, path: string, opts: DurableOptions = {}): Promise<DurableRef<M>> {
  const { bus, names } = remoteLayer(system);
  await ensureMailboxStream(bus, names, opts);
  const subject = names.mailbox(subjectOf(path));
  return {
    path,
    async send(msg, o = {}) {
      const env = makeEnvelope(ACTOR_MSG_KIND, 1, msg, o.id !== undefined ? { id: o.id } : {});
      const ack = await bus.jsPublish(subject, encode(env), { msgID: env.id, ...(o.timeoutMs !== undefined ? { timeoutMs: o.timeoutMs } : {}) });
      return { id: env.id, duplicate: ack.duplicate, seq: ack.seq };
    },
  };
}

/** Starts consuming the durable mailbox of a local actor (the system needs attachBus first). */
export async function serveDurable(system: ActorSystem, path: string, opts: DurableOptions = {}): Promise<DurableMailbox> {
  const sys = internals(system);
  const { bus, names } = remoteLayer(system);
  const cell = sys.cell(path);
  if (!cell) throw new OozeError("ACTOR_NOT_FOUND", `no local actor '${path}' in system '${system.name}' to serve a durable mailbox for`);
  await ensureMailboxStream(bus, names, opts);
  const subj = subjectOf(path);
  const durable = names.consumer(subj.replace(/\./g, "_"));
  const ackWaitMs = opts.ackWaitMs ?? 30_000;
  const maxAckPending = opts.maxAckPending ?? 512;
  await bus.ensureConsumer(names.streamMailboxes, durable, {
    filter_subject: names.mailbox(subj),
    ack_wait: ackWaitMs * 1_000_000,
    max_ack_pending: maxAckPending,
    max_deliver: -1,
  } as never);
  const nakDelay = opts.nakDelayMs ?? ((n: number) => Math.min(5_000, 100 * 2 ** Math.max(0, n - 1)));
  const remember = opts.rememberIds ?? 100_000;
  const done = new Set<string>();
  const inFlight = new Map<string, JsMsg[]>();
  const stats: DurableStats = {
    delivered: 0,
    get running() {
      return inFlight.size;
    },
    acked: 0,
    naked: 0,
    skipped: 0,
    malformed: 0,
  };
  let stopped = false;
  let iter: { stop(): void; close(): Promise<void | Error> } | null = null;

  // Acks are batched: handlers finish one per event-loop turn (nact schedules each message with
  // setImmediate), and one socket write per ack cost more than the handling itself. A batch goes out
  // at 128 acks or after 10 ms, far inside ack_wait.
  let acks: JsMsg[] = [];
  let ackTimer: NodeJS.Timeout | null = null;
  const flushAcks = (): void => {
    if (ackTimer) clearTimeout(ackTimer);
    ackTimer = null;
    const batch = acks;
    acks = [];
    for (const x of batch) x.ack();
  };
  const ack = (m: JsMsg): void => {
    acks.push(m);
    if (acks.length >= 128) flushAcks();
    else ackTimer ??= setTimeout(flushAcks, 10);
  };

  const markDone = (id: string): void => {
    done.add(id);
    if (done.size > remember) done.delete(done.values().next().value as string);
  };

  const onMessage = async (m: JsMsg): Promise<void> => {
    countDelivery(names.streamMailboxes, durable, m.info.deliveryCount);
    stats.delivered++;
    let env;
    let body: unknown;
    try {
      // A large payload travels as an empty body plus a header naming the object; only then is the
      // header looked at (parsing JetStream headers of every message costs more than decoding it).
      const data = m.data.length > 0 ? m.data : await bus.payload(m);
      env = decodeEnvelope(data, ACTOR_MSG_KIND);
      body = validateBody(cell, env.body);
    } catch (e) {
      if (e instanceof OozeError && e.code === "TRANSPORT") {
        m.nak(1_000);
        return;
      }
      stats.malformed++;
      cell.malformed++;
      void deadLetter(bus, names, subj, m.data, e, m.subject);
      m.term();
      return;
    }
    const id = env.id;
    if (done.has(id)) {
      stats.skipped++;
      ack(m);
      return;
    }
    const running = inFlight.get(id);
    if (running) {
      running.push(m); // acked together with the copy that is running
      return;
    }
    inFlight.set(id, [m]);
    cell.ask(body, { messageId: id, deliveryCount: m.info.deliveryCount }, Infinity).then(
      () => {
        markDone(id);
        for (const x of inFlight.get(id) ?? []) ack(x);
        inFlight.delete(id);
            stats.acked++;
      },
      (e: unknown) => {
        const msgs = inFlight.get(id) ?? [];
        inFlight.delete(id);
            const code = e instanceof OozeError ? e.code : "INTERNAL";
        if (code === "ACTOR_STOPPED" && stopped) return; // redelivered after ack_wait to whoever serves next
        stats.naked++;
        for (const x of msgs) x.nak(nakDelay(x.info.deliveryCount));
      },
    );
  };

  const loop = (async () => {
    while (!stopped) {
      try {
        const consumer = await bus.js.consumers.get(names.streamMailboxes, durable);
        const msgs = await consumer.consume({ ...PULL_OPTIONS, max_messages: Math.min(maxAckPending, 256) });
        iter = msgs;
        for await (const m of msgs) {
          await onMessage(m);
          if (stopped) break;
        }
      } catch {
        // consumer unavailable (server restarting): try again below
      }
      iter = null;
      if (!stopped) await new Promise((r) => setTimeout(r, 250));
    }
  })();

  const mailbox: DurableMailbox = {
    path,
    stats,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      iter?.stop();
      await loop;
      flushAcks();
    },
  };
  sys.beforeStop(() => mailbox.stop());
  return mailbox;
}
