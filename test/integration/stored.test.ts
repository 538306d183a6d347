// Reading KV keys and object store objects without a consumer (src/transport/stored.ts), against
// what nats.js's own object store and KV write on a real nats-server: the same bytes, names, lists
// and keys; a corrupt object is refused, naming what does not match.
import { randomBytes } from "node:crypto";
import { StorageType } from "@nats-io/jetstream";
import { describe, expect, it } from "vitest";
import { CorruptObjectError, getChunk, kvKeys, listObjects, objectInfo, objectMetaSubject, readObject, readObjectBytes } from "../../src/transport/stored.ts";
import { useNats } from "../harness/index.ts";

const nats = useNats();

describe("KV keys and objects read without a consumer", () => {
  it("reads back what nats.js's object store wrote, chunk by chunk, interleaved with other objects", async () => {
    const bus = await nats.connect();
    const os = await bus.obj("stored_a", { storage: StorageType.File });
    const big = randomBytes(300_000);
    await os.putBlob({ name: "big one/é", options: { max_chunk_size: 64 * 1024 } }, big);
    await os.putBlob({ name: "small" }, new Uint8Array([1, 2, 3]));
    await os.putBlob({ name: "empty" }, new Uint8Array(0));
    // a second version of "small" replaces the first
    await os.putBlob({ name: "small" }, new Uint8Array([4, 5]));
    await os.putBlob({ name: "gone" }, new Uint8Array([9]));
    await os.delete("gone");

    const got = await readObject(bus, "stored_a", "big one/é");
    expect(got?.info).toMatchObject({ name: "big one/é", size: 300_000, chunks: 5 });
    const parts: Uint8Array[] = [];
    for await (const c of got!.chunks) parts.push(c);
    expect(parts.length).toBe(5);
    expect(Buffer.concat(parts).equals(big)).toBe(true);
    expect(await readObjectBytes(bus, "stored_a", "small")).toEqual(new Uint8Array([4, 5]));
    expect(await readObjectBytes(bus, "stored_a", "empty")).toEqual(new Uint8Array(0));
    expect(await readObjectBytes(bus, "stored_a", "gone")).toBeNull();
    expect(await readObjectBytes(bus, "stored_a", "never")).toBeNull();
    expect(await objectInfo(bus, "stored_a", "gone")).toBeNull();

    const listed = (await listObjects(bus, "stored_a")).map((o) => o.name).sort();
    const theirs = (await os.list()).filter((o) => !o.deleted).map((o) => o.name).sort();
    expect(listed).toEqual(theirs);
    expect(listed).toEqual(["big one/é", "empty", "small"]);
  });

  it("decodes a chunk's message get itself: the bytes and sequence nats.js's getMessage gives, null past the last", async () => {
    const bus = await nats.connect();
    const os = await bus.obj("stored_c", { storage: StorageType.File });
    const body = randomBytes(200_000);
    await os.putBlob({ name: "c", options: { max_chunk_size: 64 * 1024 } }, body);
    const { nuid } = (await objectInfo(bus, "stored_c", "c"))!;
    const jsm = await bus.jsmBulk();
    // the fields it takes from nats.js's manager (else it falls back to nats.js's decoding)
    expect(jsm).toMatchObject({ prefix: "$JS.API", timeout: expect.any(Number) });
    const subject = `$O.stored_c.C.${nuid}`;
    let seq = 0;
    const parts: Uint8Array[] = [];
    for (;;) {
      const query = { seq: seq + 1, next_by_subj: subject };
      const mine = await getChunk(jsm, "OBJ_stored_c", query);
      const theirs = await jsm.streams.getMessage("OBJ_stored_c", query as never);
      if (mine === null) {
        expect(theirs).toBeNull();
        break;
      }
      expect(mine.seq).toBe(theirs!.seq);
      expect(Buffer.from(mine.data).equals(Buffer.from(theirs!.data))).toBe(true);
      parts.push(mine.data);
      seq = mine.seq;
    }
    expect(parts.length).toBe(4);
    expect(Buffer.concat(parts).equals(body)).toBe(true);
  });

  it("refuses an object whose chunks do not match its meta, naming it", async () => {
    const bus = await nats.connect();
    const os = await bus.obj("stored_b", { storage: StorageType.File });
    await os.putBlob({ name: "x", options: { max_chunk_size: 1024 } }, randomBytes(4096));
    const info = (await objectInfo(bus, "stored_b", "x"))!;
    // a meta that claims another digest
    const meta = { ...info, bucket: "stored_b", digest: `SHA-256=${Buffer.alloc(32).toString("base64url")}=` };
    await bus.js.publish(objectMetaSubject("stored_b", "x"), JSON.stringify(meta));
    const err = await readObjectBytes(bus, "stored_b", "x").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CorruptObjectError);
    expect(String(err)).toMatch(/object 'stored_b\/x' is corrupt: its chunks \(4096 bytes, SHA-256 [0-9a-f]{64}\) do not match its meta/);
    // a meta counting more chunks than there are
    await bus.js.publish(objectMetaSubject("stored_b", "x"), JSON.stringify({ ...meta, chunks: 6 }));
    expect(String(await readObjectBytes(bus, "stored_b", "x").catch((e: unknown) => e))).toMatch(/is corrupt: it has 4 of its 6 chunks/);
    // a chunk appended at rest, past the meta's count
    await bus.js.publish(objectMetaSubject("stored_b", "x"), JSON.stringify(info));
    await bus.js.publish(`$O.stored_b.C.${info.nuid}`, new Uint8Array([1, 2, 3]));
    expect(String(await readObjectBytes(bus, "stored_b", "x").catch((e: unknown) => e))).toMatch(/object 'stored_b\/x' is corrupt: its chunk subject holds more than the 4 chunks its meta counts/);
  });

  it("lists a KV bucket's keys as kv.keys() does, deleted ones with their markers", async () => {
    const bus = await nats.connect();
    const kv = await bus.kv("stored_kv", { history: 1 });
    for (const k of ["engine.a", "engine.b", "process.c", "engine.d"]) await kv.put(k, new TextEncoder().encode(k));
    await kv.delete("engine.d");
    const theirs: string[] = [];
    for await (const k of await kv.keys("engine.>")) theirs.push(k);
    const ours = await kvKeys(bus, "stored_kv", "engine.");
    expect(ours.sort()).toEqual(["engine.a", "engine.b", "engine.d"]);
    expect(theirs.sort()).toEqual(["engine.a", "engine.b"]);
    expect((await kv.get("engine.d"))?.operation).toBe("DEL");
    expect((await kvKeys(bus, "stored_kv")).sort()).toEqual(["engine.a", "engine.b", "engine.d", "process.c"]);
  });
});
