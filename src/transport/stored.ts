// Reading JetStream KV keys and object store objects without a consumer. nats.js lists a bucket's
// keys (`kv.keys()`), lists objects (`os.list()`) and reads an object (`os.get()`) through an
// ephemeral consumer made per call. Such a consumer has one replica, and while one server of a
// cluster is down the cluster places about a third of them on it, where they never start: the
// call times out (5 s), and a job that retries it waits as long as the server stays down
// (docs/reliability.md, "A NATS server SIGKILLed in a 3-server cluster"). The functions here ask
// the stream's leader instead, one request per item: the subjects a stream holds come from its info
// (a subjects filter), a message from the message-get API (by subject, or the next on a subject
// from a sequence). They work as soon as the stream has a leader again.
// The object layout is nats.js's (and every NATS client's): stream `OBJ_{bucket}`, one rolled-up
// meta message per object on `$O.{bucket}.M.{base64url(name)}` (JSON: nuid, size, chunks, digest,
// deleted), its chunks in order on `$O.{bucket}.C.{nuid}`.
import { createHash } from "node:crypto";
import { JetStreamApiCodes, JetStreamApiError, type JetStreamManager, type StoredMsg } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { toTransportError, TransportError } from "../errors.ts";

/** What these functions need of a connection (a Bus). */
type Bus = { jsm(): Promise<JetStreamManager> };
/** A bus that also has a manager for large answers (an object's chunks: bus.ts, jsmBulk). */
type BulkBus = Bus & { jsmBulk(): Promise<JetStreamManager> };

/** The keys of KV bucket `bucket` under `prefix` (deleted keys too: their delete markers are messages; a get tells them apart). */
export async function kvKeys(bus: Bus, bucket: string, prefix = ""): Promise<string[]> {
  const head = `$KV.${bucket}.`;
  return subjectsOf(await bus.jsm(), `KV_${bucket}`, `${head}${prefix}>`).then((s) => s.map((subject) => subject.slice(head.length)));
}

/**
 * Whether a key of KV bucket `bucket` under `prefix` was written or deleted after stream sequence
 * `seq`: one message get (the first message on those keys' subjects after `seq`), whatever the
 * number of keys, where listing them again is a get per key.
 */
export async function kvChangedAfter(bus: Bus, bucket: string, prefix: string, seq: number): Promise<boolean> {
  return (await getMessage(await bus.jsm(), `KV_${bucket}`, { seq: seq + 1, next_by_subj: `$KV.${bucket}.${prefix}>` })) !== null;
}

const untext = new TextDecoder();

/**
 * The JSON values of the live keys of KV bucket `bucket` (opened as `kv`) under `prefix`: keys as
 * kvKeys lists them, one get each. A deleted key, or a value that is not JSON, is left out.
 */
export async function kvJsonValues(bus: Bus, kv: { get(k: string): Promise<{ operation: string; value: Uint8Array } | null> }, bucket: string, prefix: string): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const k of await kvKeys(bus, bucket, prefix)) {
    const e = await kv.get(k);
    if (!e || e.operation !== "PUT" || e.value.length === 0) continue;
    try {
      out.push(JSON.parse(untext.decode(e.value)));
    } catch {
      // a foreign or corrupt entry
    }
  }
  return out;
}

/** The subjects stream `stream` holds messages on, matching `filter`. */
async function subjectsOf(jsm: JetStreamManager, stream: string, filter: string): Promise<string[]> {
  const info = await jsm.streams.info(stream, { subjects_filter: filter });
  return Object.keys(info.state.subjects ?? {});
}

/** What an object's meta message says (the fields ooze reads). */
export interface StoredObjectInfo {
  name: string;
  nuid: string;
  size: number;
  chunks: number;
  digest: string;
  deleted: boolean;
}

const DIGEST_PREFIX = "SHA-256=";

/** An object whose meta or chunks do not add up (a digest, count or size that does not match): reading it again gives the same. */
export class CorruptObjectError extends TransportError {
  constructor(message: string) {
    super(message, { retryable: false });
    this.name = "CorruptObjectError";
  }
}

/** The subject of object `name`'s meta message (nats.js: btoa of the name, so its characters as Latin-1 bytes, base64url with the padding kept). */
export function objectMetaSubject(bucket: string, name: string): string {
  return `$O.${bucket}.M.${Buffer.from(name, "latin1").toString("base64").replace(/\+/g, "-").replace(/\//g, "_")}`;
}

/** The message `query` names on `stream`, or null when there is none. */
async function getMessage(jsm: JetStreamManager, stream: string, query: { last_by_subj: string } | { seq: number; next_by_subj: string }): Promise<StoredMsg | null> {
  try {
    // the next_by_subj form of the (leader-answered) message get is the server's since 2.9; nats.js types only the others
    return await jsm.streams.getMessage(stream, query as never);
  } catch (e) {
    if ((e as { code?: unknown }).code === 10037 || /no message found/i.test((e as Error).message)) return null;
    throw e;
  }
}

/** What `getChunk` uses of nats.js's JetStreamManager: its connection, API prefix and deadline (public fields of its class). */
type ManagerFields = { nc?: NatsConnection; prefix?: unknown; timeout?: unknown };

const DATA_FIELD = Buffer.from('"data":"');
const QUOTE = 0x22;

/**
 * The message get of an object's chunk: the request nats.js's `getMessage` makes (the stream
 * leader's STREAM.MSG.GET), with the answer decoded here. The answer carries the chunk base64-encoded
 * inside JSON; nats.js decodes the whole answer to a string, parses it and decodes the data with
 * `atob`, about 45 ms of CPU a MB (a 9-MiB body took 0.36–0.68 s to fetch on an idle machine, three
 * quarters of it there; reliability.md finding 29). Here the JSON around the data is parsed alone
 * and the data decoded by Buffer's base64. Anything but a message in the answer (an API error, an
 * answer without a data field) goes through nats.js's path, as does a manager without those fields.
 * Null when there is no such message.
 */
export async function getChunk(jsm: JetStreamManager, stream: string, query: { seq: number; next_by_subj: string }): Promise<{ seq: number; data: Uint8Array } | null> {
  const { nc, prefix, timeout } = jsm as unknown as ManagerFields;
  if (nc === undefined || typeof prefix !== "string" || typeof timeout !== "number") return getMessage(jsm, stream, query);
  const reply = await nc.request(`${prefix}.STREAM.MSG.GET.${stream}`, JSON.stringify(query), { timeout });
  const raw = Buffer.from(reply.data.buffer, reply.data.byteOffset, reply.data.byteLength);
  const at = raw.indexOf(DATA_FIELD);
  const end = at < 0 ? -1 : raw.indexOf(QUOTE, at + DATA_FIELD.length);
  // the answer with its data field emptied, {"type":…,"message":{"subject":…,"seq":N,"data":"",…}},
  // or whole when it has none (an API error is small)
  const rest = JSON.parse(end < 0 ? raw.toString("utf8") : raw.toString("latin1", 0, at + DATA_FIELD.length) + raw.toString("latin1", end)) as {
    message?: { seq?: unknown };
    error?: { err_code?: number };
  };
  if (rest.error !== undefined) {
    if (rest.error.err_code === JetStreamApiCodes.NoMessageFound) return null;
    throw new JetStreamApiError(rest.error as never);
  }
  const seq = rest.message?.seq;
  if (typeof seq !== "number" || end < 0) return getMessage(jsm, stream, query);
  return { seq, data: Buffer.from(raw.toString("latin1", at + DATA_FIELD.length, end), "base64") };
}

function parseInfo(m: StoredMsg, where: string): StoredObjectInfo {
  let v: Record<string, unknown>;
  try {
    v = m.json<Record<string, unknown>>();
  } catch (e) {
    throw new CorruptObjectError(`${where}: its meta message is not JSON (${(e as Error).message})`);
  }
  const info = { name: String(v.name), nuid: String(v.nuid ?? ""), size: Number(v.size ?? 0), chunks: Number(v.chunks ?? 0), digest: String(v.digest ?? ""), deleted: v.deleted === true };
  if (!info.deleted && (!info.nuid || !Number.isInteger(info.size) || !Number.isInteger(info.chunks) || (info.size > 0 && !info.digest.startsWith(DIGEST_PREFIX))))
    throw new CorruptObjectError(`${where}: its meta message is not an object's (${JSON.stringify(v).slice(0, 200)})`);
  return info;
}

/** Object `name` of bucket `bucket`'s meta, or null when there is no such object (or it was deleted). */
export async function objectInfo(bus: Bus, bucket: string, name: string, where = `object '${bucket}/${name}'`): Promise<StoredObjectInfo | null> {
  let m;
  try {
    m = await getMessage(await bus.jsm(), `OBJ_${bucket}`, { last_by_subj: objectMetaSubject(bucket, name) });
  } catch (e) {
    throw toTransportError(e, `reading the meta of ${where}`);
  }
  if (m === null) return null;
  const info = parseInfo(m, where);
  return info.deleted ? null : info;
}

/** The objects of bucket `bucket` (deleted ones left out). */
export async function listObjects(bus: Bus, bucket: string): Promise<StoredObjectInfo[]> {
  const jsm = await bus.jsm();
  const stream = `OBJ_${bucket}`;
  const out: StoredObjectInfo[] = [];
  try {
    for (const subject of await subjectsOf(jsm, stream, `$O.${bucket}.M.>`)) {
      const m = await getMessage(jsm, stream, { last_by_subj: subject });
      if (m === null) continue; // deleted meanwhile
      const info = parseInfo(m, `object store '${bucket}' (${subject})`);
      if (!info.deleted) out.push(info);
    }
  } catch (e) {
    throw toTransportError(e, `listing object store '${bucket}'`);
  }
  return out;
}

/**
 * Reads object `name` of bucket `bucket`: its meta and its chunks in order, one message-get request
 * each (a chunk is at most the server's max payload). The chunks' SHA-256 digest, count and total
 * size are checked against the meta (and that no chunk follows the last) once the last has been read: a mismatch throws CorruptObjectError
 * from the iterator. Null when there is no such object. `where` names the object in errors.
 */
export async function readObject(bus: BulkBus, bucket: string, name: string, where = `object '${bucket}/${name}'`): Promise<{ info: StoredObjectInfo; chunks: AsyncGenerator<Uint8Array> } | null> {
  const info = await objectInfo(bus, bucket, name, where);
  if (info === null) return null;
  // a chunk is up to max_payload bytes: its get's deadline grows with that (jsApiBulkTimeoutMs)
  const jsm = await bus.jsmBulk();
  const stream = `OBJ_${bucket}`;
  const subject = `$O.${bucket}.C.${info.nuid}`;
  async function* chunks(): AsyncGenerator<Uint8Array> {
    const sha = createHash("sha256");
    let seq = 0;
    let size = 0;
    for (let i = 0; i < info!.chunks; i++) {
      let m;
      try {
        m = await getChunk(jsm, stream, { seq: seq + 1, next_by_subj: subject });
      } catch (e) {
        throw toTransportError(e, `reading chunk ${i + 1} of ${info!.chunks} of ${where}`);
      }
      if (m === null) throw new CorruptObjectError(`${where} is corrupt: it has ${i} of its ${info!.chunks} chunks`);
      seq = m.seq;
      size += m.data.length;
      sha.update(m.data);
      yield m.data;
    }
    // a chunk past the count (appended at rest) makes the object corrupt, as nats.js's reader finds
    let extra;
    try {
      extra = await getMessage(jsm, stream, { seq: seq + 1, next_by_subj: subject });
    } catch (e) {
      throw toTransportError(e, `reading the end of ${where}`);
    }
    if (extra !== null) throw new CorruptObjectError(`${where} is corrupt: its chunk subject holds more than the ${info!.chunks} chunks its meta counts`);
    const digest = sha.digest();
    const want = Buffer.from(info!.digest.slice(DIGEST_PREFIX.length), "base64url");
    if (size !== info!.size || (info!.size > 0 && !digest.equals(want)))
      throw new CorruptObjectError(`${where} is corrupt: its chunks (${size} bytes, SHA-256 ${digest.toString("hex")}) do not match its meta (${info!.size} bytes, ${info!.digest})`);
  }
  return { info, chunks: chunks() };
}

/** Object `name`'s bytes whole (see readObject; `where` names it in errors), or null when there is no such object. */
export async function readObjectBytes(bus: BulkBus, bucket: string, name: string, where = `object '${bucket}/${name}'`): Promise<Uint8Array | null> {
  const got = await readObject(bus, bucket, name, where);
  if (got === null) return null;
  const out = new Uint8Array(got.info.size);
  let at = 0;
  for await (const c of got.chunks) {
    if (at + c.length > out.length) throw new CorruptObjectError(`${where} is corrupt: its chunks hold more than its ${got.info.size} bytes`);
    out.set(c, at);
    at += c.length;
  }
  return out;
}
