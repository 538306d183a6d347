// Codec round trips: typed arrays cross as themselves (values, class and length), a 5 MB sample
// included; typed messages decode to their envelope and body; bad bodies name kind and field.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { createRegistry, decode, decodeMessage, defineMessage, encode, malformedCount, zFloat32Array, zInt32Array, zUint8Array } from "../../src/codec/index.ts";
import { MalformedMessageError } from "../../src/errors.ts";

const Sample = defineMessage({
  kind: "test.sample",
  v: 1,
  schema: z.object({
    tokens: zInt32Array(),
    logprobs: zFloat32Array(),
    mask: zUint8Array(),
    reward: z.number(),
  }),
});
const Ping = defineMessage({ kind: "test.ping", v: 2, schema: z.object({ n: z.number().int() }) });
const registry = createRegistry(Sample, Ping);

function expectMalformed(fn: () => unknown, ...fragments: string[]): MalformedMessageError {
  let caught: unknown = null;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(MalformedMessageError);
  const err = caught as MalformedMessageError;
  expect(err.code).toBe("MALFORMED_MESSAGE");
  for (const f of fragments) expect(err.message).toContain(f);
  return err;
}

describe("msgpack codec", () => {
  it("preserves typed arrays exactly: class, length, values (NaN, -0, extremes)", () => {
    const value = {
      i32: new Int32Array([0, -1, 2 ** 31 - 1, -(2 ** 31)]),
      f32: new Float32Array([1.5, Number.NaN, -0, Number.POSITIVE_INFINITY, 3.4e38]),
      u8: new Uint8Array([0, 255, 7]),
      f64: new Float64Array([Math.PI, -Number.MAX_VALUE]),
      i64: new BigInt64Array([-(2n ** 63n), 42n]),
      empty: new Int32Array(0),
      nested: [{ ids: new Int32Array([5]) }],
      big: 2n ** 60n,
      str: "héllo",
      nil: null,
    };
    const back = decode(encode(value)) as typeof value;
    expect(back.i32).toBeInstanceOf(Int32Array);
    expect(back.f32).toBeInstanceOf(Float32Array);
    expect(back.u8).toBeInstanceOf(Uint8Array);
    expect(back.f64).toBeInstanceOf(Float64Array);
    expect(back.i64).toBeInstanceOf(BigInt64Array);
    expect(Array.from(back.i32)).toEqual(Array.from(value.i32));
    expect(Object.is(back.f32[2], -0)).toBe(true);
    expect(Number.isNaN(back.f32[1])).toBe(true);
    expect(Buffer.from(back.f32.buffer, back.f32.byteOffset, back.f32.byteLength)).toEqual(Buffer.from(value.f32.buffer));
    expect(Array.from(back.f64)).toEqual(Array.from(value.f64));
    expect(Array.from(back.i64)).toEqual(Array.from(value.i64));
    expect(back.empty).toBeInstanceOf(Int32Array);
    expect(back.empty.length).toBe(0);
    expect(back.nested[0]!.ids).toEqual(new Int32Array([5]));
    expect(back.big).toBe(2n ** 60n);
    expect(back.str).toBe("héllo");
    expect(back.nil).toBeNull();
  });

  it("leaves the caller's bytes untouched", () => {
    const bytes = encode({ a: 1 });
    const keys = Object.keys(bytes).length;
    decode(bytes);
    expect(Object.keys(bytes).length).toBe(keys);
    expect("dataView" in bytes).toBe(false);
  });

  it("encodes a subarray view as just its elements", () => {
    const view = new Int32Array([1, 2, 3, 4]).subarray(1, 3);
    expect(decode(encode(view))).toEqual(new Int32Array([2, 3]));
  });

  it("round-trips a 5 MB Float32Array sample bit for bit", () => {
    const n = 1_250_000;
    const xs = new Float32Array(n);
    for (let i = 0; i < n; i++) xs[i] = Math.sin(i) * 1e3;
    const bytes = encode({ xs });
    expect(bytes.length).toBeGreaterThan(5_000_000);
    const back = decode(bytes) as { xs: Float32Array };
    expect(back.xs).toBeInstanceOf(Float32Array);
    expect(back.xs.length).toBe(n);
    expect(Buffer.compare(Buffer.from(back.xs.buffer, back.xs.byteOffset, back.xs.byteLength), Buffer.from(xs.buffer))).toBe(0);
  });
});

describe("typed messages", () => {
  it("decodes a message to its typed envelope", () => {
    const bytes = Sample.encode(
      { tokens: new Int32Array([1, 2, 3]), logprobs: new Float32Array([-0.5, -1]), mask: new Uint8Array([1, 0]), reward: 1 },
      { sender: "rollout-0", correlationId: "c1", weightVersion: 3, deadline: 123 },
    );
    const m = decodeMessage(bytes, registry);
    expect(m.kind).toBe("test.sample");
    if (!Sample.is(m)) throw new Error("expected a sample");
    expect(m.body.tokens).toEqual(new Int32Array([1, 2, 3]));
    expect(m.body.logprobs).toBeInstanceOf(Float32Array);
    expect(m).toMatchObject({ v: 1, sender: "rollout-0", correlationId: "c1", weightVersion: 3, deadline: 123 });
    expect(m.id).toMatch(/^[A-Za-z0-9]{22}$/);
    const p = decodeMessage(Ping.encode({ n: 4 }), registry);
    expect(p).toMatchObject({ kind: "test.ping", v: 2, body: { n: 4 }, sender: null, correlationId: null, weightVersion: null, deadline: null });
  });

  it("names the kind and field of a wrong body", () => {
    const wrong = encode(Sample.make({ tokens: [1, 2, 3] as unknown as Int32Array, logprobs: new Float32Array(0), mask: new Uint8Array(0), reward: 1 }));
    expectMalformed(() => decodeMessage(wrong, registry), "test.sample", "v1", "body.tokens", "got array");
    const missing = encode({ ...Ping.make({ n: 1 }), body: {} });
    expectMalformed(() => decodeMessage(missing, registry), "test.ping", "body.n");
    const f64 = encode(Sample.make({ tokens: new Int32Array(1), logprobs: new Float64Array(1) as unknown as Float32Array, mask: new Uint8Array(0), reward: 1 }));
    expectMalformed(() => decodeMessage(f64, registry), "body.logprobs", "Float64Array");
  });

  it("rejects unknown kinds, unknown versions and non-envelopes", () => {
    expectMalformed(() => decodeMessage(encode({ ...Ping.make({ n: 1 }), kind: "nope" }), registry), "'nope'", "unknown kind", "test.ping");
    expectMalformed(() => decodeMessage(encode({ ...Ping.make({ n: 1 }), v: 9 }), registry), "unsupported version", "v2");
    expectMalformed(() => decodeMessage(encode({ hello: 1 }), registry), "not an ooze envelope", "field 'id'");
    expectMalformed(() => decodeMessage(encode([1, 2]), registry), "not an ooze envelope");
    expectMalformed(() => decodeMessage(encode(null), registry), "not an ooze envelope");
  });

  it("rejects empty, truncated and concatenated frames", () => {
    const good = Ping.encode({ n: 1 });
    expectMalformed(() => decodeMessage(new Uint8Array(0), registry), "empty frame");
    for (let cut = 1; cut < good.length; cut++) {
      expectMalformed(() => decodeMessage(good.subarray(0, cut), registry));
    }
    const two = new Uint8Array([...good, ...good]);
    expectMalformed(() => decodeMessage(two, registry), "2 msgpack values");
  });

  it("accepts z.instanceof validators too", () => {
    const Raw = defineMessage({ kind: "test.raw", v: 1, schema: z.object({ ids: z.instanceof(Int32Array) }) });
    const m = decodeMessage(Raw.encode({ ids: new Int32Array([3]) }), createRegistry(Raw));
    expect(m.body.ids).toEqual(new Int32Array([3]));
    expectMalformed(() => decodeMessage(Raw.encode({ ids: new Float32Array(1) as never }), createRegistry(Raw)), "body.ids", "Float32Array");
  });

  it("turns a throwing refinement into MalformedMessageError", () => {
    const Picky = defineMessage({
      kind: "test.picky",
      v: 1,
      schema: z.object({ n: z.number() }).refine((b) => {
        if (b.n < 0) throw new Error("negative");
        return true;
      }),
    });
    expectMalformed(() => decodeMessage(Picky.encode({ n: -1 }), createRegistry(Picky)), "test.picky", "validator threw", "negative");
  });

  it("refuses duplicate (kind, v) in a registry", () => {
    expect(() => createRegistry(Ping, Ping)).toThrow(/defined twice/);
  });

  it("starts every actor's malformed count at zero", () => {
    expect(malformedCount("nobody-here")).toBe(0);
  });
});
