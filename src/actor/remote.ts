// Remoting over NATS: every actor of a system with a bus attached answers on `names.actor(path)`;
// `remoteRef(path)` in any process gives an ActorRef whose tell publishes and whose ask is a NATS
// request with a deadline. Frames are ooze envelopes (H3's codec), decoded and validated once at the
// edge; a malformed frame is counted and dead-lettered, never handed to the actor. Replies carry
// errors as the wire record {code, message, retryable, actor}. Lifecycle events go to
// `names.events(actor, kind)`, which a JetStream events stream keeps.
import { z } from "zod";
import { decode, deadLetter, encode, makeEnvelope, type Envelope } from "../codec/index.ts";
import { MalformedMessageError, OozeError, TimeoutError, type WireError } from "../errors.ts";
import type { Bus, BusMsg, BusSubscription } from "../transport/bus.ts";
import { jobNames, type JobNames } from "../transport/names.ts";
import type { ActorCell } from "./cell.ts";
import { internals, type ActorSystem, type SystemInternals } from "./system.ts";
import type { ActorRef, AskOptions, LifecycleEvent } from "./types.ts";

/** Envelope kinds used by remoting. */
export const ACTOR_MSG_KIND = "ooze.actor.msg";
export const ACTOR_REPLY_KIND = "ooze.actor.reply";
export const LIFECYCLE_KIND = "ooze.actor.lifecycle";

/** Subject token(s) of an actor path: `parent/child` becomes `parent.child`. */
export function subjectOf(path: string): string {
  return path.replace(/\//g, ".");
}

const wireErrorSchema = z.object({
  code: z.string(),
  message: z.string(),
  retryable: z.boolean(),
  actor: z.string().nullable(),
});
const replyBodySchema = z.union([
  z.object({ ok: z.literal(true), value: z.unknown() }),
  z.object({ ok: z.literal(false), error: wireErrorSchema }),
]);

/** Options of `attachBus`. */
export interface AttachOptions {
  /** Job id whose names are used; default: the system's name. */
  job?: string;
  /** Answer on names.actor(path) for local actors (default true). */
  serve?: boolean;
  /** Publish lifecycle events on names.events (default true). */
  events?: boolean;
  /** Keep events in the JetStream stream names.streamEvents (default true). */
  eventsStream?: boolean;
}

/** A bus attached to a system: remote refs, served actors, lifecycle publishing. */
export interface RemoteLayer {
  readonly bus: Bus;
  readonly names: JobNames;
  /** Ref to an actor hosted by any process of the job (or this one). */
  remoteRef<M>(path: string): ActorRef<M>;
  /** Paths this process answers for. */
  served(): string[];
  /** Unsubscribes everything (called by system.stop()). */
  detach(): Promise<void>;
}

const layers = new WeakMap<ActorSystem, RemoteLayer>();

/** The remote layer of a system, or a CONFIG_INVALID error saying to call attachBus first. */
export function remoteLayer(system: ActorSystem): RemoteLayer {
  const l = layers.get(system);
  if (!l) throw new OozeError("CONFIG_INVALID", `actor system '${system.name}' has no bus; call attachBus(system, bus) before using remote refs or durable mailboxes`);
  return l;
}

/** Shorthand: `remoteRef(system, path)` = `remoteLayer(system).remoteRef(path)`. */
export function remoteRef<M>(system: ActorSystem, path: string): ActorRef<M> {
  return remoteLayer(system).remoteRef<M>(path);
}

/** Creates (idempotently) the job's lifecycle events stream: a day or 100,000 events. */
export async function ensureEventsStream(bus: Bus, names: JobNames): Promise<void> {
  await bus.ensureStream(names.streamEvents, [names.eventsAll], { max_age: 24 * 3600 * 1e9, max_msgs: 100_000 } as never);
}

/** Attaches a connected bus to a system: serves its actors, publishes its events, enables remote refs. */
export async function attachBus(system: ActorSystem, bus: Bus, opts: AttachOptions = {}): Promise<RemoteLayer> {
  const sys = internals(system);
  const names = jobNames(opts.job ?? system.name);
  if (layers.has(system)) throw new OozeError("CONFIG_INVALID", `actor system '${system.name}' already has a bus attached`);
  if (opts.events !== false && opts.eventsStream !== false) await ensureEventsStream(bus, names);
  const subs = new Map<string, BusSubscription>();
  const serve = (cell: ActorCell<unknown, unknown>): void => {
    if (subs.has(cell.path)) return;
    const subject = names.actor(subjectOf(cell.path));
    subs.set(cell.path, bus.subscribe(subject, { queue: subject, handler: (m) => onFrame(bus, names, sys, cell, m) }));
  };
  const unserve = (path: string): void => {
    subs.get(path)?.unsubscribe();
    subs.delete(path);
  };
  const offs: (() => void)[] = [];
  if (opts.serve !== false) {
    for (const c of sys.cells()) serve(c);
    offs.push(sys.onCells((c, added) => (added ? serve(c) : unserve(c.path))));
  }
  if (opts.events !== false) {
    offs.push(
      sys.addSink((e: LifecycleEvent) => {
        const frame = encode(makeEnvelope(LIFECYCLE_KIND, 1, e, { sender: e.actor }));
        bus.publish(names.events(subjectOf(e.actor), e.kind), frame).catch(() => {});
      }),
    );
  }
  const layer: RemoteLayer = {
    bus,
    names,
    remoteRef: <M>(path: string) => makeRemoteRef<M>(bus, names, path, sys.defaultAskTimeoutMs),
    served: () => [...subs.keys()],
    detach: async () => {
      for (const o of offs.splice(0)) o();
      for (const p of [...subs.keys()]) unserve(p);
      layers.delete(system);
      sys.setRemote(null);
    },
  };
  layers.set(system, layer);
  sys.setRemote((path) => layer.remoteRef(path));
  sys.beforeStop(async () => {
    // Let events of the stop go out first, then stop serving.
    setImmediate(() => void layer.detach());
  });
  return layer;
}

/** Handles one frame for a served actor: decode, validate, dispatch, answer. Never throws. */
async function onFrame(bus: Bus, names: JobNames, sys: SystemInternals, cell: ActorCell<unknown, unknown>, m: BusMsg): Promise<void> {
  let env;
  let body: unknown;
  try {
    env = decodeEnvelope(m.data, ACTOR_MSG_KIND);
    body = validateBody(cell, env.body);
  } catch (e) {
    cell.malformed++;
    void deadLetter(bus, names, subjectOf(cell.path), m.data, e, m.subject);
    if (m.reply) void respond(m, { ok: false, error: { ...(e as OozeError).toWire(), actor: cell.path } });
    return;
  }
  const meta = { messageId: env.id, deliveryCount: 1 };
  // nats.js gives "" (not null) for a message without reply subject: both mean tell.
  if (!m.reply) {
    cell.tellWithMeta(body, meta);
    return;
  }
  const left = env.deadline === null ? sys.defaultAskTimeoutMs : Math.max(1, env.deadline - Date.now());
  cell.ask(body, meta, left).then(
    (value) => respond(m, { ok: true, value }),
    (e: unknown) => respond(m, { ok: false, error: (e instanceof OozeError ? e : new OozeError("INTERNAL", String(e))).toWire() }),
  );
}

function respond(m: BusMsg, body: { ok: true; value: unknown } | { ok: false; error: WireError }): Promise<void> {
  let frame: Uint8Array;
  try {
    frame = encode(makeEnvelope(ACTOR_REPLY_KIND, 1, body));
  } catch (e) {
    frame = encode(makeEnvelope(ACTOR_REPLY_KIND, 1, { ok: false, error: (e as OozeError).toWire() }));
  }
  return m.respond(frame).catch(() => {});
}

const ENVELOPE_KEYS = new Set(["id", "kind", "v", "sender", "correlationId", "weightVersion", "deadline", "body"]);

/**
 * Decodes a frame into an ooze envelope of the given kind; MalformedMessageError otherwise. The
 * checks are those of the codec's envelopeSchema, written out by hand: this runs once per message on
 * the hot path of every actor.
 */
export function decodeEnvelope(bytes: Uint8Array, kind: string): Envelope {
  const raw = decode(bytes) as Record<string, unknown> | null;
  const bad = (why: string): never => {
    throw new MalformedMessageError(`frame is not an ooze envelope: ${why}`);
  };
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return bad("not a map");
  for (const k of Object.keys(raw)) if (!ENVELOPE_KEYS.has(k)) bad(`unknown field '${k}'`);
  const { id, v, sender, correlationId, weightVersion, deadline } = raw;
  if (typeof id !== "string" || id.length === 0) bad("field 'id' must be a non-empty string");
  if (typeof raw.kind !== "string" || raw.kind.length === 0) bad("field 'kind' must be a non-empty string");
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0) bad("field 'v' must be an integer >= 0");
  if (sender !== null && typeof sender !== "string") bad("field 'sender' must be a string or null");
  if (correlationId !== null && typeof correlationId !== "string") bad("field 'correlationId' must be a string or null");
  if (weightVersion !== null && !Number.isInteger(weightVersion)) bad("field 'weightVersion' must be an integer or null");
  if (deadline !== null && typeof deadline !== "number") bad("field 'deadline' must be a number or null");
  if (!("body" in raw)) bad("field 'body' is missing");
  if (raw.kind !== kind || v !== 1) {
    throw new MalformedMessageError(`expected message '${kind}' v1, got '${String(raw.kind)}' v${String(v)} (id ${String(id)})`);
  }
  return raw as unknown as Envelope;
}

/** Validates a body with the actor's `messages` schema (when it has one). */
export function validateBody(cell: ActorCell<unknown, unknown>, body: unknown): unknown {
  const schema = cell.def.messages;
  if (!schema) return body;
  const r = schema.safeParse(body);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new MalformedMessageError(
      `message for actor '${cell.path}' failed its validator: field '${i?.path.map(String).join(".") || "(root)"}': ${i?.message ?? "invalid"}`,
    );
  }
  return r.data;
}

function makeRemoteRef<M>(bus: Bus, names: JobNames, path: string, defaultTimeoutMs: number): ActorRef<M> {
  const subject = names.actor(subjectOf(path));
  return {
    path,
    tell(msg: M): void {
      let frame: Uint8Array;
      try {
        frame = encode(makeEnvelope(ACTOR_MSG_KIND, 1, msg));
      } catch {
        return;
      }
      bus.publish(subject, frame).catch(() => {});
    },
    async ask<R>(msg: M, o: AskOptions = {}): Promise<R> {
      const timeoutMs = o.timeoutMs ?? defaultTimeoutMs;
      const deadline = Date.now() + timeoutMs;
      const frame = encode(makeEnvelope(ACTOR_MSG_KIND, 1, msg, { deadline }));
      let last: OozeError | null = null;
      // Nobody listening (the host is reconnecting) or the publish failed: nothing was delivered, so
      // trying again until the deadline is safe. A timeout is not retried (the message may have arrived).
      for (let attempt = 0; ; attempt++) {
        const left = deadline - Date.now();
        if (left <= 0) break;
        try {
          const reply = await bus.request(subject, frame, { timeoutMs: left, resendOnReconnect: o.idempotent === true });
          const env = decodeEnvelope(reply.data, ACTOR_REPLY_KIND);
          const body = replyBodySchema.parse(env.body);
          if (body.ok) return body.value as R;
          throw OozeError.fromWire(body.error as WireError);
        } catch (e) {
          const err = e instanceof OozeError ? e : new OozeError("INTERNAL", String(e), { cause: e });
          if (err.code === "TIMEOUT") {
            // (after earlier no-responder answers, the last short try's own deadline can pass before the
            // server's no-responders status arrives: the message still says why nothing answered)
            const why = last === null ? "" : ` (last: ${last.message})`;
            throw new TimeoutError(`ask to actor '${path}' on '${subject}' got no reply within ${timeoutMs} ms${why}`, { actor: path, cause: err });
          }
          // (a TRANSPORT error that is not retryable: the bus is closed for good)
          if (err.code !== "ACTOR_NOT_FOUND" && !(err.code === "TRANSPORT" && err.retryable)) throw err;
          last = err;
          await new Promise((r) => setTimeout(r, Math.min(Math.max(0, deadline - Date.now()), 10 * 2 ** Math.min(attempt, 5))));
        }
      }
      throw new TimeoutError(`ask to actor '${path}' on '${subject}' got no reply within ${timeoutMs} ms (last: ${last?.message ?? "none"})`, {
        actor: path,
        cause: last ?? undefined,
      });
    },
  };
}
