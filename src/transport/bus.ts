// The bus: one NATS connection with publish/subscribe, request with deadline, JetStream, KV and
// object store helpers, and transparent large payloads (a body above the server's max_payload goes
// to the object store and a small reference message crosses instead). Every NATS failure leaves
// here as a TransportError (retryable), a deadline as a TimeoutError.
import { readFileSync } from "node:fs";
import { connect, credsAuthenticator, headers as natsHeaders, type MsgHdrs, type NatsConnection, nuid, type Status } from "@nats-io/transport-node";
import {
  type Consumer,
  type ConsumerConfig,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  type PubAck,
  type StreamConfig,
  type StreamInfo,
  StorageType,
} from "@nats-io/jetstream";
import { type KV, type KvOptions, Kvm } from "@nats-io/kv";
import { type ObjectStore, type ObjectStoreOptions, Objm, setSha256Backend } from "@nats-io/obj";
import { OozeError, TimeoutError, TransportError, toTransportError } from "../errors.ts";
import { readObjectBytes } from "./stored.ts";
import { type HeartbeatConnect, type Heartbeats, startHeartbeats } from "./heartbeats.ts";

export { toTransportError };

// Object store digests with node:crypto instead of the pure-JS default: ~10x faster on large objects.
setSha256Backend("native");

/** Header naming a large payload stored in the object store: `bucket/object`. */
export const LARGE_HEADER = "Ooze-Large";
/** How long large payloads stay in the object store unless a bus says otherwise (1 h). */
export const LARGE_TTL_MS = 3_600_000;
/** Bytes kept free under max_payload for headers before a body counts as large. */
const HEADER_ROOM = 8 * 1024;

/** Options of `connectBus`. */
export interface BusOptions {
  /** `nats://host:port`, or `nats://token@host:port` carrying the token; several servers of one cluster comma-separated. */
  url: string;
  /** Auth token (overrides one in the URL). */
  token?: string;
  /** User and password (override those in the URL): a user of the embedded server's `users`. */
  user?: string;
  pass?: string;
  /** Prefix of this connection's reply inboxes (default `_INBOX`); a job's node uses `names.inbox`, which its NATS user may subscribe to. */
  inboxPrefix?: string;
  /** Connection name shown by the server (e.g. the node or actor name). */
  name?: string;
  /** Reconnect forever after a lost connection (default true). */
  reconnect?: boolean;
  /** Wait between reconnect attempts (default 250 ms). */
  reconnectWaitMs?: number;
  /** Timeout of the first connect (default 5 s). */
  connectTimeoutMs?: number;
  /** Object store bucket for large payloads (default "ooze_large"; a job passes `jobNames(job).objLarge`). */
  largeBucket?: string;
  /** How long large payloads stay in the object store (default 1 h). */
  largeTtlMs?: number;
  /**
   * Replicas of every stream, KV bucket and object store this bus creates, unless a call says
   * otherwise (default 1; 3 on a three-server cluster). See `defaultReplicas`.
   */
  replicas?: number;
  /**
   * TLS to the servers: CA bundle (a private CA) and, for servers that verify clients, a certificate
   * and key; default from OOZE_NATS_TLS_CA / OOZE_NATS_TLS_CERT / OOZE_NATS_TLS_KEY. A `tls://` URL
   * asks for TLS with the system's CAs.
   */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  /** A NATS credentials file (JWT + NKey seed, as `nsc` writes it); default from OOZE_NATS_CREDS. */
  credsFile?: string;
}

/** TLS and credentials options from the environment (what `ooze up` passes on to its node processes unchanged). */
export function natsSecurityFromEnv(env: Record<string, string | undefined> = process.env): Pick<BusOptions, "tls" | "credsFile"> {
  const tls = {
    ...(env.OOZE_NATS_TLS_CA ? { caFile: env.OOZE_NATS_TLS_CA } : {}),
    ...(env.OOZE_NATS_TLS_CERT ? { certFile: env.OOZE_NATS_TLS_CERT } : {}),
    ...(env.OOZE_NATS_TLS_KEY ? { keyFile: env.OOZE_NATS_TLS_KEY } : {}),
  };
  return { ...(Object.keys(tls).length > 0 ? { tls } : {}), ...(env.OOZE_NATS_CREDS ? { credsFile: env.OOZE_NATS_CREDS } : {}) };
}

/** A message received from the bus, its body already resolved if it was sent as a large payload. */
export interface BusMsg {
  readonly subject: string;
  readonly data: Uint8Array;
  /** Reply subject of a request, or null. */
  readonly reply: string | null;
  /** Header value, or null. */
  header(name: string): string | null;
  /** Answers a request (large replies cross too); a message without reply subject throws. */
  respond(data: Uint8Array, opts?: { headers?: Record<string, string> }): Promise<void>;
}

/** A subscription: iterate it, or pass a handler to `subscribe`. */
export interface BusSubscription extends AsyncIterable<BusMsg> {
  readonly subject: string;
  /** Stops delivery; the iterator ends. */
  unsubscribe(): void;
  /** Resolves when the subscription has ended (and, with a handler, the last handler call returned). */
  readonly closed: Promise<void>;
}

/** Connection status events (from nats.js), reduced to a type and a one-line detail. */
export interface BusStatus {
  type: Status["type"];
  detail: string;
}

/** Options of `Bus.request`. */
export interface RequestOptions {
  /** Deadline of the whole request, resends included. */
  timeoutMs: number;
  headers?: Record<string, string>;
  /** Send it again whenever the connection comes back meanwhile (only for requests that may be handled twice). */
  resendOnReconnect?: boolean;
}

/** Options of `Bus.subscribe`. */
export interface SubscribeOptions {
  /** Queue group: each message goes to one member. */
  queue?: string;
  /** Called for each message, one at a time (awaited); without it, iterate the subscription. */
  handler?: (msg: BusMsg) => void | Promise<void>;
  /** Called when a handler throws or a large payload cannot be fetched (default: ignored). */
  onError?: (err: OozeError, subject: string) => void;
}

/** A connected bus. */
export interface Bus {
  /** The underlying nats.js connection (escape hatch; prefer the methods). */
  readonly nc: NatsConnection;
  /** Server URL without credentials. */
  readonly url: string;
  /** The server's max_payload in bytes. */
  readonly maxPayload: number;
  /** Bucket used for large payloads. */
  readonly largeBucket: string;
  /** Replicas of the streams, KV buckets and object stores it creates. */
  readonly replicas: number;
  /** Publishes bytes; bodies above max_payload go through the object store transparently. */
  publish(subject: string, data: Uint8Array, opts?: { headers?: Record<string, string>; reply?: string }): Promise<void>;
  /** Publishes through the object store whatever the size (what `publish` does for large bodies). */
  publishLarge(subject: string, data: Uint8Array, opts?: { headers?: Record<string, string>; reply?: string }): Promise<void>;
  /** Subscribes to a subject (wildcards allowed). */
  subscribe(subject: string, opts?: SubscribeOptions): BusSubscription;
  /**
   * Request/reply with a deadline: TimeoutError when it passes, OozeError ACTOR_NOT_FOUND when nobody
   * listens. With `resendOnReconnect` (for requests that may be handled twice) the request is sent
   * again whenever the connection comes back while it waits, since the request or its reply may
   * have been lost with the old connection; otherwise it waits out the deadline.
   */
  request(subject: string, data: Uint8Array, opts: RequestOptions): Promise<BusMsg>;
  /** Round trip to the server: everything published before is on the server. */
  flush(): Promise<void>;
  /** JetStream client. */
  readonly js: JetStreamClient;
  /** JetStream manager (cached). */
  jsm(): Promise<JetStreamManager>;
  /**
   * JetStream manager for requests whose answers carry up to max_payload bytes (an object's chunks):
   * its deadline grows with that size (jsApiBulkTimeoutMs), where jsm()'s assumes a small answer.
   */
  jsmBulk(): Promise<JetStreamManager>;
  /** JetStream publish (large bodies go through the object store); `msgID` deduplicates. */
  jsPublish(subject: string, data: Uint8Array, opts?: { msgID?: string; headers?: Record<string, string>; timeoutMs?: number }): Promise<PubAck>;
  /** The body of a message (e.g. a JsMsg), fetched from the object store if it was sent large. */
  payload(msg: { data: Uint8Array; headers?: MsgHdrs | undefined }): Promise<Uint8Array>;
  /** Creates or updates a stream with these subjects; returns its info. */
  ensureStream(name: string, subjects: string[], opts?: Partial<StreamConfig>): Promise<StreamInfo>;
  /** Creates or updates a durable pull consumer and returns it. */
  ensureConsumer(stream: string, durable: string, opts?: Partial<ConsumerConfig>): Promise<Consumer>;
  /** Opens (creating if needed) a KV bucket. */
  kv(bucket: string, opts?: Partial<KvOptions>): Promise<KV>;
  /** Opens (creating if needed) an object store bucket. */
  obj(bucket: string, opts?: Partial<ObjectStoreOptions>): Promise<ObjectStore>;
  /** Listens to connection status events; returns the unsubscribe function. */
  onStatus(listener: (status: BusStatus) => void): () => void;
  /** True while connected (not reconnecting, not closed). */
  isConnected(): boolean;
  /**
   * The heartbeats of held JetStream messages, beaten from a worker thread over a connection of its
   * own (started at the first call; closed with the bus): see heartbeats.ts.
   */
  heartbeats(): Heartbeats;
  /** Drains and closes the connection. Idempotent. */
  close(): Promise<void>;
  /** Resolves when the connection is closed for good (the error, if it closed because of one). */
  readonly closed: Promise<Error | null>;
}

/** Where to find NATS: from --nats, OOZE_NATS_URL or the topology; null means start an embedded server. */
export interface NatsTarget {
  /** One server, or several of one cluster comma-separated (without credentials). */
  url: string;
  token: string | null;
  /** User and password (from the URL, or OOZE_NATS_USER / OOZE_NATS_PASSWORD), or null. */
  user: string | null;
  pass: string | null;
  source: "flag" | "env" | "topology";
}

/**
 * Picks the NATS server(s): the --nats flag (one URL or a comma-separated list), else OOZE_NATS_URL (token from the URL or OOZE_NATS_TOKEN,
 * user and password from the URL or OOZE_NATS_USER and OOZE_NATS_PASSWORD), else the topology's `nats.url`; null when none is set
 * (the caller starts an embedded server).
 */
export function resolveNatsUrl(
  flag: string | null | undefined,
  env: Record<string, string | undefined> = process.env,
  topology?: { url?: string | undefined; token?: string | undefined } | null,
): NatsTarget | null {
  const pick = (url: string, token: string | null | undefined, source: NatsTarget["source"]): NatsTarget => {
    const parsed = splitNatsUrls(url);
    const fromEnv = env.OOZE_NATS_USER && env.OOZE_NATS_PASSWORD ? { user: env.OOZE_NATS_USER, pass: env.OOZE_NATS_PASSWORD } : null;
    const userPass = parsed.user !== null && parsed.pass !== null ? { user: parsed.user, pass: parsed.pass } : parsed.token === null ? fromEnv : null;
    return { url: parsed.urls.join(","), token: userPass !== null ? null : (parsed.token ?? token ?? null), user: userPass?.user ?? null, pass: userPass?.pass ?? null, source };
  };
  if (flag) return pick(flag, env.OOZE_NATS_TOKEN, "flag");
  if (env.OOZE_NATS_URL) return pick(env.OOZE_NATS_URL, env.OOZE_NATS_TOKEN, "env");
  if (topology?.url) return pick(topology.url, topology.token ?? env.OOZE_NATS_TOKEN, "topology");
  return null;
}

/** Splits `nats://token@host:port` into a URL without credentials and the token (or user/pass). */
export function splitNatsUrl(url: string): { url: string; token: string | null; user: string | null; pass: string | null } {
  const withScheme = /^[a-z]+:\/\//i.test(url) ? url : `nats://${url}`;
  let u: URL;
  try {
    u = new URL(withScheme);
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `NATS URL '${url}' is not a valid URL; expected nats://[token@]host:port`, { cause: e });
  }
  const user = u.username ? decodeURIComponent(u.username) : null;
  const pass = u.password ? decodeURIComponent(u.password) : null;
  const port = u.port || "4222";
  return {
    url: `${u.protocol}//${u.hostname}:${port}`,
    token: user !== null && pass === null ? user : null,
    user: pass !== null ? user : null,
    pass,
  };
}

/**
 * Splits a comma-separated list of servers of one cluster (`nats://token@h1:4222,nats://h2:4222`)
 * into URLs without credentials and the one set of credentials they share (the first that carries any).
 */
export function splitNatsUrls(list: string): { urls: string[]; token: string | null; user: string | null; pass: string | null } {
  const parts = list.split(",").map((x) => x.trim()).filter((x) => x.length > 0);
  if (parts.length === 0) throw new OozeError("CONFIG_INVALID", `NATS URL list '${list}' names no server; expected nats://[token@]host:port[,nats://host:port…]`);
  const each = parts.map((x) => splitNatsUrl(x));
  const creds = each.find((e) => e.token !== null || e.user !== null);
  return { urls: each.map((e) => e.url), token: creds?.token ?? null, user: creds?.user ?? null, pass: creds?.pass ?? null };
}

/**
 * Stream replicas when a job does not say: 3 when it is given three or more servers (a cluster), else 1
 * (an embedded or single server). An explicit `nats.replicas` / `--replicas` wins.
 */
export function defaultReplicas(urlList: string, explicit?: number | null): number {
  if (explicit !== undefined && explicit !== null) {
    if (!Number.isInteger(explicit) || explicit < 1 || explicit > 5)
      throw new OozeError("CONFIG_INVALID", `NATS replicas must be an integer from 1 to 5 (JetStream's limit); got ${explicit}`);
    return explicit;
  }
  return splitNatsUrls(urlList).urls.length >= 3 ? 3 : 1;
}

/**
 * The job's stream replicas: --replicas, else the topology's nats.replicas, else 3 for three or more
 * servers and 1 for one. An embedded server is one server: more than one replica is refused there.
 */
export function resolveReplicas(natsUrl: string, embedded: boolean, flag: string | undefined, topo: number | undefined): number {
  let explicit: number | undefined = topo;
  if (flag !== undefined) {
    explicit = Number(flag);
    if (!Number.isInteger(explicit)) throw new OozeError("CONFIG_INVALID", `--replicas must be an integer from 1 to 5 (got '${flag}')`);
  }
  const r = defaultReplicas(natsUrl, explicit);
  if (embedded && r > 1)
    throw new OozeError("CONFIG_INVALID", `${r} stream replicas need a NATS cluster (--nats URL1,URL2,URL3); the embedded nats-server is one server (use replicas 1)`);
  return r;
}

/**
 * Waits for `p` to settle, but no longer than `ms` (the timer does not hold the process). For a
 * shutdown that should let a watch or a registry pass in flight end before the bus closes, yet must
 * never hang on one stuck behind a reconnecting connection.
 */
export async function settleWithin(p: Promise<unknown> | null, ms: number): Promise<void> {
  if (p === null) return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p.then(() => {}, () => {}), new Promise<void>((r) => (timer = setTimeout(r, ms)).unref())]);
  clearTimeout(timer);
}

/**
 * Whether a JetStream API error is one a cluster gives while it has no leader for the asset (a
 * timeout, err_code 10008 "JetStream system temporarily unavailable", no responders at all, or err_code
 * 10005 "no suitable peers for placement" while a replica's server is down or coming back): the same call succeeds
 * once it has elected one. Looks through `cause` chains (TransportError wraps the client's error).
 */
export function isJetStreamTransient(e: unknown): boolean {
  for (let x: unknown = e, depth = 0; x instanceof Error && depth < 6; x = (x as { cause?: unknown }).cause, depth++) {
    if (x.name === "TimeoutError" || (x instanceof OozeError && x.code === "TIMEOUT")) return true;
    if (x.name.endsWith("ApiError") && (x as { code?: unknown }).code === 10008) return true;
    // err_code 10005 "no suitable peers for placement": a replica's server is down, or is back but
    // not yet seen as online by the meta leader (after a restart or a healed partition it stays
    // "offline" for a few seconds): an asset with that many replicas can be placed once it is
    if (x.name.endsWith("ApiError") && (x as { code?: unknown }).code === 10005) return true;
    if (/no suitable peers for placement/i.test(x.message)) return true;
    if (/temporarily unavailable/i.test(x.message)) return true;
    // nats.js's name for "no responders" to a JetStream request: on a server with JetStream, the
    // asset has no leader at that moment (a cluster electing one answers this at once)
    if (x.name === "JetStreamNotEnabled" && /jetstream is not enabled/.test(x.message)) return true;
  }
  return false;
}

/**
 * How long a JetStream API request or publish ack may take (nats.js's default is 5 s). A request
 * sent while its stream has no leader (a cluster's server just died; re-electing takes 4–9 s) is
 * never answered, not even once a leader is elected, so the caller learns nothing until its timeout:
 * with 5 s the fail-over bench's job resumed up to 5 s after the last election. Every caller retries
 * a timeout (whileElecting, the loop's passes and retries), so 2 s only shortens that wait; an
 * answered request on loopback takes milliseconds.
 */
export const JS_API_TIMEOUT_MS = 2_000;

/**
 * The deadline of a JetStream API request whose answer carries up to `bytes` (a message get of an
 * object's chunk, up to the server's max_payload): JS_API_TIMEOUT_MS plus the bytes at 1 MB/s. On
 * a loaded two-core machine a get of an 8-MB chunk missed the 2 s on three deliveries in a row
 * (fresh-clone CI, Dec 2; reliability.md finding 28); an idle one answers in tens of ms.
 */
export function jsApiBulkTimeoutMs(bytes: number): number {
  return JS_API_TIMEOUT_MS + Math.ceil(bytes / 1024);
}

/**
 * How ooze's durable consumers pull (nats.js `consume()` options beside max_messages): a pull
 * expires after 4 s and the server heartbeats it every second. nats.js notices a pull lost with its
 * server after two missed heartbeats and pulls again (after a consumer info, retried every
 * `expires`); at its defaults (30 s, heartbeats every 15 s) a job whose consumer's server was
 * SIGKILLed waited 30–35 s for its next message (bench failover), at these about 2–6 s once the
 * cluster has re-elected the consumer's leader. An idle consumer costs one pull request per 4 s.
 */
export const PULL_OPTIONS = { expires: 4_000, idle_heartbeat: 1_000 } as const;

/**
 * Runs a JetStream call, again while it fails with what a cluster electing a leader gives
 * (isJetStreamTransient), for up to `forMs` (default 60 s) with a backoff of 0.25 s doubling to 2 s;
 * then, or on any other error, throws that error.
 */
export async function whileElecting<T>(fn: () => Promise<T>, opts: { forMs?: number; closed?: () => boolean } = {}): Promise<T> {
  const until = Date.now() + (opts.forMs ?? 60_000);
  for (let attempt = 0; ; attempt++) {
    try {
      return await fn();
    } catch (e) {
      if (!isJetStreamTransient(e) || Date.now() >= until || opts.closed?.() === true) throw e;
      await new Promise((r) => setTimeout(r, Math.min(2_000, 250 * 2 ** attempt) * (0.8 + 0.2 * Math.random())));
    }
  }
}

/** Whether a stream's config has every field of `want` (the fields a caller sets; the server fills in the rest). */
function sameStreamConfig(have: StreamConfig, want: Partial<StreamConfig>): boolean {
  const h = have as unknown as Record<string, unknown>;
  return Object.entries(want).every(([k, v]) => v === undefined || JSON.stringify(h[k]) === JSON.stringify(v));
}

/** Connects to NATS; rejects with a TransportError naming the URL if the server cannot be reached. */
export async function connectBus(opts: BusOptions): Promise<Bus> {
  const target = splitNatsUrls(opts.url);
  const token = opts.token ?? target.token;
  const user = opts.user ?? target.user;
  const pass = opts.pass ?? target.pass;
  const reconnect = opts.reconnect ?? true;
  const shown = target.urls.join(",");
  const sec = { ...natsSecurityFromEnv(), ...(opts.tls !== undefined ? { tls: opts.tls } : {}), ...(opts.credsFile !== undefined ? { credsFile: opts.credsFile } : {}) };
  const wantsTls = sec.tls !== undefined || target.urls.some((u) => u.startsWith("tls://"));
  let creds: Uint8Array | null = null;
  if (sec.credsFile !== undefined) {
    try {
      creds = readFileSync(sec.credsFile);
    } catch (e) {
      throw new OozeError("CONFIG_INVALID", `cannot read the NATS credentials file ${sec.credsFile} (OOZE_NATS_CREDS): ${(e as Error).message}`, { cause: e });
    }
  }
  const servers = target.urls.map((u) => u.replace(/^tls:\/\//, "nats://"));
  // The heartbeat worker's connection: the same servers and credentials (see heartbeats.ts).
  const beats: HeartbeatConnect = {
    servers,
    tls: wantsTls ? (sec.tls ?? {}) : null,
    creds,
    token,
    user,
    pass,
    name: `${opts.name ?? "ooze"} heartbeats`,
    reconnectTimeWait: opts.reconnectWaitMs ?? 250,
    // (a user limited to the job's subjects may subscribe only under the job's inbox prefix: the
    // worker's renewals are requests, whose replies come there)
    inboxPrefix: opts.inboxPrefix ?? null,
  };
  let nc: NatsConnection;
  try {
    nc = await connect({
      servers,
      ...(wantsTls ? { tls: sec.tls ?? {} } : {}),
      ...(creds !== null ? { authenticator: credsAuthenticator(creds) } : {}),
      ...(token !== null ? { token } : {}),
      ...(user !== null && pass !== null ? { user, pass } : {}),
      ...(opts.name !== undefined ? { name: opts.name } : {}),
      ...(opts.inboxPrefix !== undefined ? { inboxPrefix: opts.inboxPrefix } : {}),
      reconnect,
      maxReconnectAttempts: reconnect ? -1 : 0,
      reconnectTimeWait: opts.reconnectWaitMs ?? 250,
      timeout: opts.connectTimeoutMs ?? 5_000,
      // The client would otherwise build two Error objects (stack traces captured) for every request
      // and JetStream publish, to point a later timeout at its caller: a third of a publishing
      // process's CPU in `bench bus`. ooze's own errors name the operation and subject instead.
      // OOZE_NATS_ASYNC_TRACES=1 turns them back on, to find the caller of a raw TimeoutError whose
      // stack names only the client's timer.
      noAsyncTraces: process.env.OOZE_NATS_ASYNC_TRACES !== "1",
    });
  } catch (e) {
    throw new TransportError(
      `cannot connect to NATS at ${shown}: ${(e as Error).message}; check that the server runs and the token is right (--nats URL / OOZE_NATS_URL)`,
      { cause: e },
    );
  }
  return new NatsBus(nc, shown, opts, beats);
}

class NatsBus implements Bus {
  readonly nc: NatsConnection;
  readonly url: string;
  readonly js: JetStreamClient;
  readonly largeBucket: string;
  readonly replicas: number;
  readonly closed: Promise<Error | null>;
  private readonly largeTtlMs: number;
  private readonly listeners = new Set<(s: BusStatus) => void>();
  /** JetStream managers by their requests' deadline (jsm, jsmBulk), each opened once. */
  private readonly managers = new Map<number, Promise<JetStreamManager>>();
  private readonly stores = new Map<string, Promise<ObjectStore>>();
  private connected = true;
  private beats: Heartbeats | null = null;

  constructor(
    nc: NatsConnection,
    url: string,
    opts: BusOptions,
    private readonly beatsConnect: HeartbeatConnect,
  ) {
    this.nc = nc;
    this.url = url;
    this.js = jetstream(nc, { timeout: JS_API_TIMEOUT_MS });
    this.largeBucket = opts.largeBucket ?? "ooze_large";
    this.largeTtlMs = opts.largeTtlMs ?? LARGE_TTL_MS;
    this.replicas = opts.replicas ?? 1;
    this.closed = nc.closed().then((e) => (e instanceof Error ? e : null));
    // a connection closed for good (not by close()) takes its heartbeats with it
    void this.closed.then(() => this.beats?.close());
    void this.watchStatus();
  }

  get maxPayload(): number {
    return this.nc.info?.max_payload ?? 1024 * 1024;
  }

  private async watchStatus(): Promise<void> {
    let sawClose = false;
    try {
      for await (const s of this.nc.status()) {
        if (s.type === "close") sawClose = true;
        if (s.type === "disconnect" || s.type === "reconnecting") this.connected = false;
        if (s.type === "reconnect") this.connected = true;
        const detail = "server" in s ? String(s.server) : "error" in s ? String(s.error?.message) : "";
        for (const l of this.listeners) {
          try {
            l({ type: s.type, detail });
          } catch {
            // a listener's failure is its own
          }
        }
      }
    } catch {
      // the status iterator ends with the connection
    }
    this.connected = false;
    if (!sawClose) for (const l of this.listeners) l({ type: "close", detail: "" });
  }

  isConnected(): boolean {
    return this.connected && !this.nc.isClosed();
  }

  onStatus(listener: (status: BusStatus) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private isLarge(data: Uint8Array): boolean {
    return data.length > this.maxPayload - HEADER_ROOM;
  }

  /** Stores a body in the large bucket and returns the reference header value. */
  private async storeLarge(data: Uint8Array): Promise<string> {
    const store = await this.obj(this.largeBucket, { ttl: this.largeTtlMs * 1_000_000, storage: StorageType.File });
    const name = nuid.next();
    try {
      // Chunks as large as the server allows: fewer publishes and acks than the 128 KiB default.
      await store.putBlob({ name, options: { max_chunk_size: this.maxPayload - HEADER_ROOM } }, data);
    } catch (e) {
      throw toTransportError(e, `storing a large payload (${data.length} bytes) in object store '${this.largeBucket}'`);
    }
    return `${this.largeBucket}/${name}`;
  }

  private hdrs(h: Record<string, string> | undefined, large: string | null): MsgHdrs | undefined {
    if (h === undefined && large === null) return undefined;
    const out = natsHeaders();
    for (const [k, v] of Object.entries(h ?? {})) out.set(k, v);
    if (large !== null) out.set(LARGE_HEADER, large);
    return out;
  }

  async publish(subject: string, data: Uint8Array, opts: { headers?: Record<string, string>; reply?: string } = {}): Promise<void> {
    if (this.isLarge(data)) return this.publishLarge(subject, data, opts);
    this.rawPublish(subject, data, opts.headers, null, opts.reply);
  }

  async publishLarge(subject: string, data: Uint8Array, opts: { headers?: Record<string, string>; reply?: string } = {}): Promise<void> {
    const ref = await this.storeLarge(data);
    this.rawPublish(subject, new Uint8Array(0), opts.headers, ref, opts.reply);
  }

  private rawPublish(subject: string, data: Uint8Array, h: Record<string, string> | undefined, large: string | null, reply: string | undefined): void {
    const headers = this.hdrs(h, large);
    try {
      this.nc.publish(subject, data, { ...(headers ? { headers } : {}), ...(reply !== undefined ? { reply } : {}) });
    } catch (e) {
      throw this.closedError(`publishing ${data.length} bytes to '${subject}'`, e) ?? toTransportError(e, `publishing ${data.length} bytes to '${subject}'`);
    }
  }

  /**
   * A failure on a connection closed for good (this bus's close(), or the client gave up): not
   * retryable, as nothing will carry it again. Until Dec 1 it was a retryable TransportError, and a
   * weight-sync push still running when its job stopped asked the closed bus again and again until
   * each ask's deadline (184 s), for an hour. Null while the connection lives or reconnects.
   */
  private closedError(what: string, cause?: unknown): OozeError | null {
    if (!this.nc.isClosed()) return null;
    return new TransportError(`${what}: the connection to NATS is closed`, { retryable: false, ...(cause === undefined ? {} : { cause }) });
  }

  async payload(msg: { data: Uint8Array; headers?: MsgHdrs | undefined }): Promise<Uint8Array> {
    const ref = msg.headers?.has(LARGE_HEADER) ? msg.headers.get(LARGE_HEADER) : "";
    if (!ref) return msg.data;
    const slash = ref.indexOf("/");
    const bucket = ref.slice(0, slash);
    const name = ref.slice(slash + 1);
    let data: Uint8Array | null;
    try {
      // without a consumer (stored.ts): nats.js's getBlob makes one, which can land on a dead server
      data = await readObjectBytes(this, bucket, name, `large payload '${ref}'`);
    } catch (e) {
      throw toTransportError(e, `fetching large payload '${ref}' from the object store`);
    }
    if (data === null) {
      throw new TransportError(`large payload '${ref}' is missing from the object store (expired after ${this.largeTtlMs} ms, or deleted)`, { retryable: false });
    }
    return data;
  }

  private toBusMsg(m: { subject: string; reply?: string | undefined; headers?: MsgHdrs | undefined }, data: Uint8Array): BusMsg {
    const reply = m.reply ?? null;
    return {
      subject: m.subject,
      data,
      reply,
      header: (name) => (m.headers?.has(name) ? m.headers.get(name) : null),
      respond: async (body, opts = {}) => {
        if (reply === null) throw new TransportError(`cannot respond to a message on '${m.subject}': it has no reply subject`, { retryable: false });
        await this.publish(reply, body, opts);
      },
    };
  }

  subscribe(subject: string, opts: SubscribeOptions = {}): BusSubscription {
    let sub: ReturnType<NatsConnection["subscribe"]>;
    try {
      sub = this.nc.subscribe(subject, opts.queue !== undefined ? { queue: opts.queue } : {});
    } catch (e) {
      throw toTransportError(e, `subscribing to '${subject}'`);
    }
    const onError = opts.onError ?? (() => {});
    const bus = this;
    async function* messages(): AsyncGenerator<BusMsg> {
      for await (const m of sub) {
        let data: Uint8Array;
        try {
          data = await bus.payload(m);
        } catch (e) {
          onError(toTransportError(e, `receiving on '${subject}'`), m.subject);
          continue;
        }
        yield bus.toBusMsg(m, data);
      }
    }
    const iter = messages();
    let closed: Promise<void>;
    if (opts.handler !== undefined) {
      const handler = opts.handler;
      closed = (async () => {
        for await (const m of iter) {
          try {
            await handler(m);
          } catch (e) {
            onError(e instanceof OozeError ? e : new OozeError("INTERNAL", `handler for '${subject}' threw: ${(e as Error)?.message ?? e}`, { cause: e }), m.subject);
          }
        }
      })();
    } else {
      closed = sub.closed.then(() => undefined);
    }
    let iterated = false;
    return {
      subject,
      unsubscribe: () => {
        if (!sub.isClosed()) sub.unsubscribe();
      },
      closed,
      [Symbol.asyncIterator]: () => {
        if (opts.handler !== undefined || iterated) {
          throw new OozeError("INTERNAL", `subscription to '${subject}' is already consumed (by its handler or another iterator)`);
        }
        iterated = true;
        return iter;
      },
    };
  }

  async request(subject: string, data: Uint8Array, opts: RequestOptions): Promise<BusMsg> {
    if (!opts.resendOnReconnect) return this.requestOnce(subject, data, opts);
    const deadline = Date.now() + opts.timeoutMs;
    for (let resends = 0; ; resends++) {
      let off = () => {};
      const reconnected = new Promise<null>((resolve) => {
        off = this.onStatus((s) => s.type === "reconnect" && resolve(null));
      });
      const once = this.requestOnce(subject, data, { ...opts, timeoutMs: Math.max(1, deadline - Date.now()) });
      once.catch(() => {}); // abandoned after a reconnect: its outcome is dropped
      try {
        const m = await Promise.race([once, reconnected]);
        if (m !== null) return m;
      } catch (e) {
        // Sent again just after a reconnect, before the responder subscribed again: retry until the deadline.
        const early = resends > 0 && e instanceof OozeError && e.code === "ACTOR_NOT_FOUND" && Date.now() + 100 < deadline;
        if (!early) throw e;
        await new Promise((r) => setTimeout(r, 100));
      } finally {
        off();
      }
      if (Date.now() >= deadline) return once; // the deadline passed meanwhile: its own timeout says so
    }
  }

  private async requestOnce(subject: string, data: Uint8Array, opts: RequestOptions): Promise<BusMsg> {
    const closed = this.closedError(`request to '${subject}'`);
    if (closed) throw closed;
    const large = this.isLarge(data) ? await this.storeLarge(data) : null;
    const headers = this.hdrs(opts.headers, large);
    let m;
    try {
      m = await this.nc.request(subject, large === null ? data : new Uint8Array(0), {
        timeout: opts.timeoutMs,
        ...(headers ? { headers } : {}),
      });
    } catch (e) {
      const err = e as Error & { isNoResponders?: () => boolean; cause?: unknown };
      const noResponders = err.isNoResponders?.() === true || (err.cause instanceof Error && err.cause.name === "NoRespondersError");
      if (noResponders) {
        throw new OozeError("ACTOR_NOT_FOUND", `no responder on '${subject}' (nothing subscribes to it)`, { retryable: true, cause: e });
      }
      const t = this.closedError(`request to '${subject}'`, e) ?? toTransportError(e, `request to '${subject}'`);
      if (t instanceof TimeoutError) throw new TimeoutError(`request to '${subject}' got no reply within ${opts.timeoutMs} ms`, { cause: e });
      throw t;
    }
    return this.toBusMsg(m, await this.payload(m));
  }

  async flush(): Promise<void> {
    try {
      await this.nc.flush();
    } catch (e) {
      throw toTransportError(e, "flushing the NATS connection");
    }
  }

  jsm(): Promise<JetStreamManager> {
    return this.manager(JS_API_TIMEOUT_MS);
  }

  jsmBulk(): Promise<JetStreamManager> {
    return this.manager(jsApiBulkTimeoutMs(this.maxPayload));
  }

  /** The JetStream manager whose requests time out after `timeoutMs` (opened again after a failed open). */
  private manager(timeoutMs: number): Promise<JetStreamManager> {
    let m = this.managers.get(timeoutMs);
    if (m === undefined) {
      m = jetstreamManager(this.nc, { timeout: timeoutMs }).catch((e) => {
        this.managers.delete(timeoutMs);
        throw toTransportError(e, "opening the JetStream manager (is JetStream enabled on the server?)");
      });
      this.managers.set(timeoutMs, m);
    }
    return m;
  }

  async jsPublish(subject: string, data: Uint8Array, opts: { msgID?: string; headers?: Record<string, string>; timeoutMs?: number } = {}): Promise<PubAck> {
    const large = this.isLarge(data) ? await this.storeLarge(data) : null;
    const headers = this.hdrs(opts.headers, large);
    try {
      return await this.js.publish(subject, large === null ? data : new Uint8Array(0), {
        ...(opts.msgID !== undefined ? { msgID: opts.msgID } : {}),
        ...(headers ? { headers } : {}),
        ...(opts.timeoutMs !== undefined ? { timeout: opts.timeoutMs } : {}),
      });
    } catch (e) {
      throw toTransportError(e, `JetStream publish to '${subject}'`);
    }
  }

  /** Creating or opening a stream, consumer, KV bucket or object store waits out a leader election (whileElecting). */
  private whileElecting<T>(fn: () => Promise<T>): Promise<T> {
    return whileElecting(fn, { closed: () => this.nc.isClosed() });
  }

  async ensureStream(name: string, subjects: string[], opts: Partial<StreamConfig> = {}): Promise<StreamInfo> {
    const jsm = await this.jsm();
    return this.whileElecting(async () => {
      // Already there as wanted: nothing to write (a job's node, whose NATS user may not create or
      // change streams, finds those `ooze up` made this way).
      const have = await jsm.streams.info(name).catch(() => null);
      if (have !== null && sameStreamConfig(have.config, { num_replicas: this.replicas, ...opts, subjects })) return have;
      try {
        return await jsm.streams.add({ num_replicas: this.replicas, ...opts, name, subjects });
      } catch (e) {
        // Already there with another config: update it to the wanted one.
        try {
          await jsm.streams.info(name);
        } catch {
          throw toTransportError(e, `creating stream '${name}' on ${subjects.join(", ")}`);
        }
        try {
          return await jsm.streams.update(name, { num_replicas: this.replicas, ...opts, subjects });
        } catch (e2) {
          throw toTransportError(e2, `updating stream '${name}' to subjects ${subjects.join(", ")}`);
        }
      }
    });
  }

  async ensureConsumer(stream: string, durable: string, opts: Partial<ConsumerConfig> = {}): Promise<Consumer> {
    const jsm = await this.jsm();
    return this.whileElecting(async () => {
      try {
        await jsm.consumers.add(stream, { ack_policy: "explicit" as ConsumerConfig["ack_policy"], ...opts, durable_name: durable });
      } catch (e) {
        try {
          await jsm.consumers.update(stream, durable, opts);
        } catch {
          throw toTransportError(e, `creating consumer '${durable}' on stream '${stream}'`);
        }
      }
      try {
        return await this.js.consumers.get(stream, durable);
      } catch (e) {
        throw toTransportError(e, `opening consumer '${durable}' on stream '${stream}'`);
      }
    });
  }

  async kv(bucket: string, opts: Partial<KvOptions> = {}): Promise<KV> {
    return this.whileElecting(async () => {
      try {
        return await new Kvm(this.js).create(bucket, { replicas: this.replicas, ...opts });
      } catch (e) {
        throw toTransportError(e, `opening KV bucket '${bucket}'`);
      }
    });
  }

  obj(bucket: string, opts: Partial<ObjectStoreOptions> = {}): Promise<ObjectStore> {
    let p = this.stores.get(bucket);
    if (p === undefined) {
      p = this.whileElecting(() => new Objm(this.js).create(bucket, { replicas: this.replicas, ...opts })).catch((e) => {
        this.stores.delete(bucket);
        throw toTransportError(e, `opening object store '${bucket}'`);
      });
      this.stores.set(bucket, p);
    }
    return p;
  }

  heartbeats(): Heartbeats {
    this.beats ??= startHeartbeats(this.beatsConnect);
    return this.beats;
  }

  async close(): Promise<void> {
    await this.beats?.close();
    if (this.nc.isClosed()) return;
    try {
      await this.nc.drain();
    } catch {
      await this.nc.close().catch(() => {});
    }
  }
}
