// The engine client's transport: HTTP/1.1 over keep-alive TCP (or TLS) sockets, written here rather
// than taken from node:http or undici because it sits on the token-in/token-out hot path — every
// agent turn is one /generate — and costs far less there: measured in the gateway benchmark, its
// main thread was busy ~0.4 ms less per engine call than with undici's request API (0.57–0.63 ms
// against 0.97), and node:http cost what undici did. It does only what the engine client needs:
// GET and POST with a string body written in one go, responses framed by Content-Length, chunked
// transfer encoding, or the connection's end; interim 1xx responses skipped; bodies read whole or
// streamed (SSE).
// A socket is reused only after a whole response that did not say `Connection: close`; idle sockets
// are closed 1 s before the timeout a server announces in `Keep-Alive: timeout=N` (at most 60 s;
// ooze's engine servers announce 30 s), or after 4 s when it announces none, before servers close
// theirs (uvicorn's and Node's default: 5 s). A request is sent again only where a socket
// reused after idling at least half its time ends before any byte of the reply, once, on a new
// connection: the server closed the idle connection as the request went out (a client whose event
// loop runs late retires its idle sockets late; at 1,024 simulated engines thousands of requests a
// minute met that). Any other reset is the caller's to handle (the fleet retries /generate elsewhere, counting it). The caller's signal
// aborts an exchange; `timeoutMs` bounds a whole one. Sockets are counted against a process-wide
// budget (below).
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { readFileSync } from "node:fs";

/** Idle keep-alive sockets are closed after this long, ms. */
const IDLE_SOCKET_MS = 4_000;
/**
 * Idle time taken from a server's `Keep-Alive: timeout=N` at most, ms. Until Dec 2 that was capped at
 * the 4 s above: engines whose requests last long (seconds to minutes of generation) see a new
 * request on a socket less often than every 4 s, and a process at 256 engines with 16 requests each
 * opened a connection for most requests (bench inflight: about 5 % of its CPU went to connecting and closing).
 */
let maxAnnouncedIdleMs = maxIdleMs(process.env.OOZE_HTTP_MAX_IDLE_MS);

/**
 * The cap on an announced idle time: OOZE_HTTP_MAX_IDLE_MS (ms), else 60 s. A cap because a
 * connection idle for long may be dropped silently on the way (a NAT's or a firewall's idle
 * timeout); one raises it for servers on a network that keeps connections (`bench scale` raises it
 * with its slowed clock, as its simulated engines' keep-alive).
 */
export function maxIdleMs(configured: string | undefined): number {
  if (configured === undefined || configured === "") return 60_000;
  const n = Number(configured);
  if (!Number.isInteger(n) || n < 1000) throw new Error(`OOZE_HTTP_MAX_IDLE_MS must be an integer number of ms ≥ 1000, got '${configured}'`);
  return n;
}

/** Sets the cap on an announced idle time (a program embedding ooze, a bench on a slowed clock); returns the previous one. */
export function setMaxIdleMs(ms: number): number {
  if (!Number.isInteger(ms) || ms < 1000) throw new Error(`the idle cap must be an integer number of ms ≥ 1000, got ${ms}`);
  const was = maxAnnouncedIdleMs;
  maxAnnouncedIdleMs = ms;
  return was;
}
/** Longest response head (status line and headers), bytes. */
const MAX_HEAD_BYTES = 64 * 1024;
/** A streamed body's unread bytes above which the socket stops reading. */
const STREAM_HIGH_WATER = 1 << 20;

/** A whole HTTP response. */
export interface HttpTextResponse {
  status: number;
  text: string;
}

/** What to send. */
export interface HttpRequest {
  method: "GET" | "POST";
  headers: Record<string, string>;
  body?: string;
  /** The caller's: aborting it ends the exchange with its reason. */
  signal?: AbortSignal;
  /** The whole exchange's limit, ms: past it the exchange fails with an HttpTimeoutError. */
  timeoutMs?: number;
  /**
   * A control or health exchange: past the socket budget it opens one of PRIORITY_SOCKETS more
   * instead of waiting in line behind the generations.
   */
  priority?: boolean;
}

/** An exchange ran past its `timeoutMs`. */
export class HttpTimeoutError extends Error {
  constructor(readonly ms: number) {
    super(`no whole reply within ${ms} ms`);
    this.name = "HttpTimeoutError";
  }
}

/** A response whose body is read as it arrives. */
export interface HttpStreamResponse {
  status: number;
  /** The body's chunks; iterating ends at its end, or throws when the connection fails or `signal` aborts. */
  body: AsyncIterable<Buffer>;
  /** The whole (rest of the) body as text: for error answers. */
  text(): Promise<string>;
}

/**
 * Sends one request to `url` and reads the whole body. Rejects with the socket's error (its `code`
 * kept, e.g. ECONNREFUSED), an error with code ECONNRESET when the connection ends before the whole
 * reply, one with code HPE_INVALID for a reply that is not HTTP/1.x, an HttpTimeoutError past
 * `timeoutMs`, or the signal's reason when `signal` aborts.
 */
export function requestText(url: string, req: HttpRequest): Promise<HttpTextResponse> {
  return new Promise((resolve, reject) => new TextExchange(url, req, resolve, reject).begin());
}

/** Sends one request to `url` and hands back the body as it arrives (an SSE stream); errors as requestText's. */
export function requestStream(url: string, req: HttpRequest): Promise<HttpStreamResponse> {
  return new Promise((resolve, reject) => {
    const queue: Buffer[] = [];
    let queued = 0;
    let ended = false;
    let failure: unknown = null;
    let wake: (() => void) | null = null;
    const notify = () => {
      const w = wake;
      wake = null;
      w?.();
    };
    async function* body(): AsyncGenerator<Buffer, void, void> {
      try {
        for (;;) {
          const c = queue.shift();
          if (c !== undefined) {
            queued -= c.length;
            if (queued < STREAM_HIGH_WATER) x.resume();
            yield c;
          } else if (failure !== null) throw failure;
          else if (ended) return;
          else await new Promise<void>((r) => (wake = r));
        }
      } finally {
        // A reader that stops before the end lets go of the connection.
        if (!ended && failure === null) x.cancel();
      }
    }
    const iterable = body();
    const x = new SinkExchange(url, req, {
      head: (status) =>
        resolve({
          status,
          body: iterable,
          text: async () => {
            const parts: Buffer[] = [];
            for await (const c of iterable) parts.push(c);
            return Buffer.concat(parts).toString("utf8");
          },
        }),
      data: (c) => {
        queue.push(c);
        queued += c.length;
        if (queued >= STREAM_HIGH_WATER) x.pause();
        notify();
      },
      end: () => {
        ended = true;
        notify();
      },
      fail: (e) => {
        failure = e;
        reject(e);
        notify();
      },
    });
    x.begin();
  });
}

// ---------------------------------------------------------------------------------------------

/** What an exchange reports, in order: head once, data any number of times, then end or fail (once). */
interface Sink {
  head(status: number): void;
  data(chunk: Buffer): void;
  end(): void;
  fail(e: unknown): void;
}

interface Origin {
  /** "host:port" and the scheme: where idle sockets are kept. */
  key: string;
  tls: boolean;
  host: string;
  port: number;
  /** The Host header. */
  hostHeader: string;
}

/**
 * What a socket is doing: carrying an exchange, idling in the pool (`Idle`), or neither (between
 * the two, or being closed). A socket's listeners are added once, when it opens, and hand each event
 * to its owner: an exchange adds none of its own (thousands of exchanges in flight each held a
 * dozen closures for them, added and removed on every request).
 */
const OWNER = Symbol("ooze.http.owner");
interface OwnedSocket extends Socket {
  [OWNER]: Exchange | Idle | null;
}

/** An idle socket in its origin's pool. */
interface Idle {
  socket: OwnedSocket;
  /** Its origin's key. */
  key: string;
  /** When it went idle, and how long it may idle (ms). */
  since: number;
  idleMs: number;
}

const idle = new Map<string, Idle[]>();

function originOf(u: URL): Origin {
  const tls = u.protocol === "https:";
  if (!tls && u.protocol !== "http:") throw new Error(`unsupported protocol '${u.protocol}' in ${u.href}: use http: or https:`);
  const host = u.hostname.startsWith("[") ? u.hostname.slice(1, -1) : u.hostname;
  const port = u.port ? Number(u.port) : tls ? 443 : 80;
  return { key: `${u.protocol}//${u.host}`, tls, host, port, hostHeader: u.host };
}

/** Takes an idle socket out of its pool and closes it (a close, an error, unexpected bytes or its idle timeout while idle). */
function dropIdle(it: Idle): void {
  const list = idle.get(it.key);
  const i = list ? list.indexOf(it) : -1;
  if (i >= 0) list!.splice(i, 1);
  if (list?.length === 0) idle.delete(it.key);
  it.socket[OWNER] = null;
  it.socket.setTimeout(0);
  it.socket.destroy();
}

// The listeners every socket has from its start to its close (`this` is the socket).
function onSocketData(this: OwnedSocket, c: Buffer): void {
  const o = this[OWNER];
  if (o === null) this.destroy(); // bytes nobody asked for: the socket is not reused
  else if (o instanceof Exchange) o.received(c);
  else dropIdle(o);
}
function onSocketError(this: OwnedSocket, e: Error): void {
  const o = this[OWNER];
  if (o instanceof Exchange) o.failed(e);
  else if (o !== null) dropIdle(o);
}
function onSocketClose(this: OwnedSocket): void {
  openSockets--;
  const o = this[OWNER];
  if (o instanceof Exchange) o.closed();
  else if (o !== null) dropIdle(o);
  waiters.shift()?.wake();
}
function onSocketTimeout(this: OwnedSocket): void {
  const o = this[OWNER];
  if (o !== null && !(o instanceof Exchange)) dropIdle(o);
}

/**
 * Sockets this process keeps open to servers at once, in use and idle. Past it an exchange waits for
 * one to close (the oldest idle socket to another origin is closed for it), instead of failing with
 * EMFILE: found at 1,024 simulated engines, where a rollout process ran out of file descriptors, every
 * dispatch failed at once, and the fleet took engine after engine out of routing (docs/experiments/scale.md).
 * OOZE_HTTP_MAX_SOCKETS sets it; else four fifths of the open-files limit (/proc/self/limits), less 128
 * for the rest of the process; 1,024 where that limit cannot be read.
 */
let budget = socketBudget(process.env.OOZE_HTTP_MAX_SOCKETS, readOpenFilesLimit());
let openSockets = 0;
/**
 * Sockets past the budget that priority exchanges (health checks, aborts, weight updates) may open.
 * Waiting in line, a health check to a busy engine waited its whole deadline for one of that
 * engine's sockets to free, and engines that answered every request left routing as "failed 3
 * health checks in a row": 698 of them in 20 minutes at 1,024 engines (Dec 1). The budget leaves a
 * fifth of the open-files limit to the rest of the process, so this fits in it.
 */
export const PRIORITY_SOCKETS = 256;
/**
 * Sockets taken from the idle pool after idling at least half their time: a request on one may meet
 * the server's close of the idle connection (on one reused sooner, a reset is the server's answer).
 */
const lateSockets = new WeakSet<Socket>();
/** An exchange waiting for a socket. */
interface Waiter {
  /** The origin it waits to reach. */
  key: string;
  wake(): void;
}
/**
 * Exchanges waiting for a socket: oldest first overall, and by origin (a released socket goes to the
 * oldest waiter for its server). Sets, so that every operation is O(1): at a rollout's 8,000
 * requests in flight thousands wait at once, and a scan of them per released socket was 16 % of
 * its CPU (Nov 30).
 */
class WaitQueue {
  private readonly all = new Set<Waiter>();
  private readonly byKey = new Map<string, Set<Waiter>>();
  get length(): number {
    return this.all.size;
  }
  push(w: Waiter): void {
    this.all.add(w);
    let set = this.byKey.get(w.key);
    if (!set) this.byKey.set(w.key, (set = new Set()));
    set.add(w);
  }
  delete(w: Waiter): void {
    this.all.delete(w);
    const set = this.byKey.get(w.key);
    if (set?.delete(w) && set.size === 0) this.byKey.delete(w.key);
  }
  /** Takes the oldest waiter, or the oldest for origin `key`. */
  shift(key?: string): Waiter | undefined {
    const w = (key === undefined ? this.all : this.byKey.get(key))?.values().next().value;
    if (w !== undefined) this.delete(w);
    return w;
  }
}
const waiters = new WaitQueue();

/** The socket budget for a configured value (an env string) and the process's soft open-files limit (null: unknown). */
export function socketBudget(configured: string | undefined, openFiles: number | null): number {
  if (configured !== undefined && configured !== "") {
    const n = Number(configured);
    if (!Number.isInteger(n) || n < 1) throw new Error(`OOZE_HTTP_MAX_SOCKETS must be a positive integer, got '${configured}'`);
    return n;
  }
  if (openFiles === null) return 1024;
  return Math.max(16, Math.floor(openFiles * 0.8) - 128);
}

function readOpenFilesLimit(): number | null {
  try {
    const m = /^Max open files\s+(\S+)/m.exec(readFileSync("/proc/self/limits", "utf8"));
    if (!m) return null;
    return m[1] === "unlimited" ? 1 << 20 : Number(m[1]);
  } catch {
    return null;
  }
}

/** Sockets open now, and exchanges waiting for one (tests, diagnostics). */
export function socketStats(): { open: number; waiting: number; budget: number } {
  return { open: openSockets, waiting: waiters.length, budget };
}

/** Sets the socket budget (tests; a program embedding ooze that knows its limits); returns the previous one. */
export function setSocketBudget(n: number): number {
  if (!Number.isInteger(n) || n < 1) throw new Error(`socket budget must be a positive integer, got ${n}`);
  const was = budget;
  budget = n;
  while (waiters.length > 0 && openSockets < budget) waiters.shift()!.wake();
  return was;
}

/**
 * An idle socket to the origin (unless `fresh`), or a new one; null while the budget is spent (an
 * idle socket elsewhere is then closed to make room; a `priority` exchange has PRIORITY_SOCKETS more).
 * Sockets reused late are marked in `lateSockets`.
 */
function acquire(o: Origin, fresh = false, priority = false): OwnedSocket | null {
  const list = fresh ? undefined : idle.get(o.key);
  for (let it = list?.pop(); it !== undefined; it = list!.pop()) {
    const s = it.socket;
    s[OWNER] = null;
    s.setTimeout(0);
    if (s.destroyed || !s.writable) continue;
    s.ref();
    if (Date.now() - it.since >= it.idleMs / 2) lateSockets.add(s);
    return s;
  }
  if (openSockets >= budget + (priority ? PRIORITY_SOCKETS : 0)) {
    for (const l of idle.values()) {
      const oldest = l[0];
      if (oldest) {
        dropIdle(oldest); // its close frees a place, and wakes the oldest waiter
        break;
      }
    }
    return null;
  }
  const s = (
    o.tls
      ? tlsConnect({ host: o.host, port: o.port, ALPNProtocols: ["http/1.1"], ...(/^[\d.:]+$/.test(o.host) ? {} : { servername: o.host }) })
      : netConnect({ host: o.host, port: o.port })
  ) as OwnedSocket;
  openSockets++;
  s[OWNER] = null;
  s.on("data", onSocketData).on("error", onSocketError).on("close", onSocketClose).on("timeout", onSocketTimeout);
  s.setNoDelay(true);
  return s;
}

/** Keeps a socket whose exchange ended cleanly for the next request to the origin. */
function release(o: Origin, socket: OwnedSocket, idleMs: number): void {
  // An exchange waiting for a socket takes this one if it goes to the same server; else the socket
  // is closed, and its close makes a place for the oldest waiter.
  let handOver: Waiter | undefined;
  if (waiters.length > 0) {
    handOver = waiters.shift(o.key);
    if (handOver === undefined) {
      socket[OWNER] = null;
      socket.destroy();
      return;
    }
  }
  let list = idle.get(o.key);
  if (!list) idle.set(o.key, (list = []));
  const it: Idle = { socket, key: o.key, since: Date.now(), idleMs };
  // While idle: a close, an error, unexpected bytes or the idle timeout retire it (the socket's own listeners).
  socket[OWNER] = it;
  socket.setTimeout(idleMs);
  socket.unref();
  list.push(it);
  handOver?.wake();
}

/** Where a URL goes: parsed once per URL (an engine client sends to a handful). */
const targets = new Map<string, { origin: Origin; path: string }>();

function targetOf(url: string): { origin: Origin; path: string } {
  let t = targets.get(url);
  if (t === undefined) {
    const u = new URL(url);
    t = { origin: originOf(u), path: `${u.pathname}${u.search}` };
    if (targets.size >= 1024) targets.clear();
    targets.set(url, t);
  }
  return t;
}

/** An exchange's deadline passed. */
function exchangeTimedOut(x: Exchange): void {
  x.finish(new HttpTimeoutError(x.req.timeoutMs!));
}

/**
 * One request and its response, as one object: its state is fields, its socket's events come
 * through the socket's own listeners, its deadline is a timer that takes it as argument, and its
 * signal's listener is the exchange itself (`handleEvent`). A rollout process holds thousands at once
 * while their engines generate; each used to be a dozen closures and their contexts. `begin()`
 * starts it; the subclass hands the response on (head, data, end or fail, once each but data).
 */
abstract class Exchange implements Waiter {
  private origin: Origin | null = null;
  /** The request's head (its body is the request's). */
  private requestHead = "";
  private readonly parser = new ResponseParser();
  private socket: OwnedSocket | null = null;
  private done = false;
  private timer: NodeJS.Timeout | undefined = undefined;
  private waiting = false;
  private replied = false;
  private resent = false;
  private paused = false;
  private fresh = false;

  constructor(
    private readonly url: string,
    readonly req: HttpRequest,
  ) {}

  abstract head(status: number): void;
  abstract data(chunk: Buffer): void;
  protected abstract end(): void;
  protected abstract fail(e: unknown): void;

  /** Sends it (or waits for a socket); failures before that go to fail() at once. */
  begin(): void {
    const { req } = this;
    const signal = req.signal;
    if (signal?.aborted) {
      this.done = true;
      this.fail(signal.reason);
      return;
    }
    // The head's lines, joined once: one flat string held while the exchange lasts (a head built by
    // `+=` is a tree of a few dozen string pieces, and thousands of exchanges in flight hold them all).
    const lines: string[] = [];
    try {
      const t = targetOf(this.url);
      this.origin = t.origin;
      lines.push(`${req.method} ${t.path} HTTP/1.1`, `host: ${t.origin.hostHeader}`);
    } catch (e) {
      this.done = true;
      this.fail(e);
      return;
    }
    for (const k in req.headers) {
      const v = req.headers[k]!;
      if (v.includes("\n") || v.includes("\r")) {
        this.done = true;
        this.fail(new Error(`header '${k}' holds a line break`));
        return;
      }
      lines.push(`${k}: ${v}`);
    }
    const body = req.body ?? "";
    if (req.method === "POST" || body !== "") lines.push(`content-length: ${Buffer.byteLength(body)}`);
    lines.push("", "");
    this.requestHead = lines.join("\r\n");
    signal?.addEventListener("abort", this, { once: true });
    if (req.timeoutMs !== undefined) this.timer = setTimeout(exchangeTimedOut, req.timeoutMs, this);
    this.start();
  }

  /** The signal aborted (EventTarget calls an object listener's handleEvent). */
  handleEvent(): void {
    this.finish(this.req.signal!.reason);
  }

  /** Waiter: the origin it waits to reach. */
  get key(): string {
    return this.origin!.key;
  }

  /** Waiter: a socket may be free now. */
  wake(): void {
    this.waiting = false;
    this.start();
  }

  private start(): void {
    if (this.done) return;
    const s = acquire(this.origin!, this.fresh, this.req.priority === true);
    if (s === null) {
      this.waiting = true;
      waiters.push(this);
      return;
    }
    this.socket = s;
    s[OWNER] = this;
    if (this.paused) s.pause();
    s.write(this.requestHead + (this.req.body ?? ""));
  }

  /** Bytes of the reply. */
  received(c: Buffer): void {
    this.replied = true;
    try {
      this.parser.push(c, this);
    } catch (e) {
      this.finish(e);
      return;
    }
    if (this.parser.complete) this.finish(null);
  }

  failed(e: unknown): void {
    if (!this.resend()) this.finish(e);
  }

  /** The connection closed: a body framed by the connection's end ends here; any other is cut short. */
  closed(): void {
    if (this.resend()) return;
    this.finish(this.parser.endsWithClose() ? null : Object.assign(new Error("the connection was closed before the whole reply arrived"), { code: "ECONNRESET" }));
  }

  /**
   * A keep-alive socket reused late in its idle time that ends before any byte of the reply met the
   * server's close of the idle connection (it closes those after its keep-alive timeout, and a
   * client late to retire the socket sends on it meanwhile): the request is sent again, once, on a
   * new connection.
   */
  private resend(): boolean {
    const s = this.socket;
    if (this.replied || this.resent || this.done || s === null || !lateSockets.has(s)) return false;
    this.resent = true;
    s[OWNER] = null;
    s.destroy();
    this.socket = null;
    this.fresh = true;
    this.start();
    return true;
  }

  /** Ends it: `e` null for a whole reply (the socket kept when the reply allows), else the failure. */
  finish(e: unknown | null): void {
    if (this.done) return;
    this.done = true;
    clearTimeout(this.timer);
    this.req.signal?.removeEventListener("abort", this);
    if (this.waiting) {
      // still waiting for a socket: leave the queue
      waiters.delete(this);
      this.waiting = false;
    }
    const s = this.socket;
    this.socket = null;
    if (s === null) {
      this.fail(e ?? new Error("the exchange ended before it had a socket"));
      return;
    }
    s[OWNER] = null;
    if (e !== null) {
      s.destroy();
      this.fail(e);
      return;
    }
    if (this.parser.keepAlive) release(this.origin!, s, this.parser.idleMs);
    else s.destroy();
    this.end();
  }

  pause(): void {
    this.paused = true;
    if (!this.done) this.socket?.pause();
  }

  resume(): void {
    this.paused = false;
    if (!this.done) this.socket?.resume();
  }

  /** Ends the exchange early (its socket closed, never reused). */
  cancel(): void {
    this.finish(new Error("the reader left the body before its end"));
  }
}

/** An exchange whose whole body is read as text (requestText). */
class TextExchange extends Exchange {
  private status = 0;
  private chunks: Buffer[] | Buffer | null = null;

  constructor(
    url: string,
    req: HttpRequest,
    private readonly resolve: (r: HttpTextResponse) => void,
    private readonly reject: (e: unknown) => void,
  ) {
    super(url, req);
  }

  head(status: number): void {
    this.status = status;
  }

  data(chunk: Buffer): void {
    const c = this.chunks;
    if (c === null) this.chunks = chunk;
    else if (Array.isArray(c)) c.push(chunk);
    else this.chunks = [c, chunk];
  }

  protected end(): void {
    const c = this.chunks;
    this.chunks = null;
    this.resolve({ status: this.status, text: c === null ? "" : Array.isArray(c) ? Buffer.concat(c).toString("utf8") : c.toString("utf8") });
  }

  protected fail(e: unknown): void {
    this.chunks = null;
    this.reject(e);
  }
}

/** An exchange that hands each event to a Sink (requestStream). */
class SinkExchange extends Exchange {
  constructor(
    url: string,
    req: HttpRequest,
    private readonly sink: Sink,
  ) {
    super(url, req);
  }
  head(status: number): void {
    this.sink.head(status);
  }
  data(chunk: Buffer): void {
    this.sink.data(chunk);
  }
  protected end(): void {
    this.sink.end();
  }
  protected fail(e: unknown): void {
    this.sink.fail(e);
  }
}

const malformed = (what: string) => Object.assign(new Error(`malformed HTTP response: ${what}`), { code: "HPE_INVALID" });

/**
 * An HTTP/1.x response parser fed the socket's bytes: the head (status line and headers), then the
 * body as Content-Length, chunked, or up to the connection's end says.
 */
export class ResponseParser {
  /** Whole once the body's last byte (and a chunked body's trailers) arrived. */
  complete = false;
  /** Whether the socket may carry another request afterwards. */
  keepAlive = true;
  /** How long the socket may then idle, ms. */
  idleMs = IDLE_SOCKET_MS;
  private phase: "head" | "length" | "chunk-size" | "chunk-data" | "chunk-end" | "trailers" | "close" | "done" = "head";
  private pending: Buffer | null = null;
  private left = 0;
  private status = 0;

  /** Whether the body is framed by the end of the connection (HTTP/1.0 style) and so whole at close. */
  endsWithClose(): boolean {
    return this.phase === "close";
  }

  push(c: Buffer, sink: Pick<Sink, "head" | "data">): void {
    const buf = this.pending ? Buffer.concat([this.pending, c]) : c;
    this.pending = null;
    let at = 0;
    while (at < buf.length && !this.complete) {
      switch (this.phase) {
        case "head": {
          const end = buf.indexOf("\r\n\r\n", at);
          if (end < 0) {
            if (buf.length - at > MAX_HEAD_BYTES) throw malformed(`a head over ${MAX_HEAD_BYTES} bytes`);
            this.pending = buf.subarray(at);
            return;
          }
          const interim = this.readHead(buf.toString("latin1", at, end));
          at = end + 4;
          if (interim) continue;
          sink.head(this.status);
          // A response without a body (204, 304, Content-Length 0) is whole with its head.
          if (this.bodyless()) this.complete = true;
          break;
        }
        case "close":
          sink.data(at === 0 ? buf : buf.subarray(at));
          return;
        case "chunk-size":
        case "trailers": {
          const eol = buf.indexOf("\r\n", at);
          if (eol < 0) {
            if (buf.length - at > MAX_HEAD_BYTES) throw malformed("a chunk-size or trailer line too long");
            this.pending = buf.subarray(at);
            return;
          }
          const line = buf.toString("latin1", at, eol);
          at = eol + 2;
          if (this.phase === "trailers") {
            if (line === "") this.complete = true;
            break;
          }
          const size = /^([0-9a-fA-F]{1,8})[ \t]*(;.*)?$/.exec(line);
          if (!size) throw malformed(`bad chunk size '${line.slice(0, 40)}'`);
          this.left = parseInt(size[1]!, 16);
          this.phase = this.left === 0 ? "trailers" : "chunk-data";
          break;
        }
        case "length":
        case "chunk-data": {
          // `left` bytes of the body (or of the chunk) still to come.
          const n = Math.min(this.left, buf.length - at);
          sink.data(buf.subarray(at, at + n));
          at += n;
          this.left -= n;
          if (this.left > 0) break;
          if (this.phase === "length") this.complete = true;
          else this.phase = "chunk-end";
          break;
        }
        case "chunk-end": {
          if (buf.length - at < 2) {
            this.pending = buf.subarray(at);
            return;
          }
          if (buf[at] !== 13 || buf[at + 1] !== 10) throw malformed("a chunk not followed by CRLF");
          at += 2;
          this.phase = "chunk-size";
          break;
        }
        case "done":
          return;
      }
    }
    if (this.complete) this.phase = "done";
    // Bytes after a complete response (none expected: one request at a time) retire the socket.
    if (at < buf.length) this.keepAlive = false;
  }

  private bodyless(): boolean {
    return this.phase === "done";
  }

  /** Reads a head; true for an interim (1xx) response, after which the real head follows. */
  private readHead(text: string): boolean {
    const lines = text.split("\r\n");
    const m = /^HTTP\/1\.([01]) (\d{3})(?: .*)?$/.exec(lines[0]!);
    if (!m) throw malformed(`status line '${lines[0]!.slice(0, 60)}'`);
    const status = Number(m[2]);
    if (status >= 100 && status < 200 && status !== 101) return true;
    this.status = status;
    let length: number | null = null;
    let chunked = false;
    let connection = m[1] === "0" ? "close" : "keep-alive";
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i]!;
      const colon = line.indexOf(":");
      if (colon <= 0) throw malformed(`header line '${line.slice(0, 60)}'`);
      const name = line.slice(0, colon).trim().toLowerCase();
      const value = line.slice(colon + 1).trim();
      if (name === "content-length") {
        if (!/^\d+$/.test(value) || (length !== null && length !== Number(value))) throw malformed(`content-length '${value}'`);
        length = Number(value);
      } else if (name === "transfer-encoding") chunked = /(^|,)\s*chunked\s*$/i.test(value);
      else if (name === "connection") connection = value.toLowerCase();
      else if (name === "keep-alive") {
        const t = /timeout=(\d+)/i.exec(value);
        if (t) this.idleMs = Math.min(maxAnnouncedIdleMs, Number(t[1]) * 1000 - 1000);
      }
    }
    if (/(^|,)\s*close\s*($|,)/.test(connection) || (m[1] === "0" && !/keep-alive/.test(connection)) || this.idleMs <= 0) this.keepAlive = false;
    if (status === 204 || status === 304) this.phase = "done";
    else if (chunked) this.phase = "chunk-size";
    else if (length !== null) {
      this.left = length;
      this.phase = length === 0 ? "done" : "length";
    } else {
      this.phase = "close";
      this.keepAlive = false;
    }
    return false;
  }
}
