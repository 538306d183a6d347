// Garbage never crashes the codec: random bytes, mutated and truncated frames, and random values
// in place of a body all end in MalformedMessageError (or a valid message), never another exception.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { createRegistry, decodeMessage, defineMessage, encode, zInt32Array } from "../../src/codec/index.ts";
import { MalformedMessageError } from "../../src/errors.ts";

const Msg = defineMessage({
  kind: "test.step",
  v: 1,
  schema: z.object({ ids: zInt32Array(), done: z.boolean(), note: z.string().nullable() }),
});
const registry = createRegistry(Msg);
const runs = Number(process.env.OOZE_PROPERTY_RUNS ?? 300);

/** Decodes; returns "ok", or "malformed"; any other exception fails the property. */
function outcome(bytes: Uint8Array): "ok" | "malformed" {
  try {
    decodeMessage(bytes, registry);
    return "ok";
  } catch (e) {
    if (e instanceof MalformedMessageError) return "malformed";
    throw new Error(`decodeMessage threw ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}`);
  }
}

describe("malformed frames", () => {
  it("random bytes give MalformedMessageError, never another exception", () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 0, maxLength: 256 }), (bytes) => {
        expect(outcome(bytes)).toBe("malformed");
      }),
      { numRuns: runs },
    );
  });

  it("msgpack extension and container headers with random tails never escape", () => {
    const heads = [0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8, 0xdc, 0xdd, 0xde, 0xdf, 0xc4, 0xc5, 0xc6, 0xd9, 0xda, 0xdb, 0xc1, 0x80, 0x90];
    fc.assert(
      fc.property(fc.constantFrom(...heads), fc.uint8Array({ maxLength: 64 }), (h, tail) => {
        outcome(new Uint8Array([h, ...tail]));
      }),
      { numRuns: runs },
    );
  });

  it("a valid frame with bytes flipped or cut is either valid or malformed", () => {
    const good = Msg.encode({ ids: new Int32Array([1, 2, 3]), done: false, note: null }, { sender: "env" });
    fc.assert(
      fc.property(
        fc.array(fc.record({ at: fc.nat({ max: good.length - 1 }), byte: fc.integer({ min: 0, max: 255 }) }), { minLength: 1, maxLength: 4 }),
        fc.nat({ max: good.length }),
        (flips, cut) => {
          const bytes = new Uint8Array(good);
          for (const f of flips) bytes[f.at] = f.byte;
          outcome(bytes.subarray(0, cut === 0 ? bytes.length : cut));
        },
      ),
      { numRuns: runs },
    );
  });

  it("random values as envelope fields or body are malformed unless they fit the schema", () => {
    const good = Msg.make({ ids: new Int32Array([1]), done: true, note: "x" });
    const field = fc.constantFrom("id", "kind", "v", "sender", "correlationId", "weightVersion", "deadline", "body", "extra");
    fc.assert(
      fc.property(field, fc.anything({ withTypedArray: true, withBigInt: true, withMap: true, withSet: true, withDate: true }), (k, value) => {
        let bytes: Uint8Array;
        try {
          bytes = encode({ ...good, [k]: value });
        } catch (e) {
          expect(e).toBeInstanceOf(MalformedMessageError); // unencodable values are refused at encode
          return;
        }
        outcome(bytes);
      }),
      { numRuns: runs },
    );
  });
});
