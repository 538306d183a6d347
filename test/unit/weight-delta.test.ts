// Lossless weight deltas (actors/weight-sync/delta.ts): every encoding and both wires round-trip
// bit-exactly (examples and fast-check properties); wrong bases and corrupt files change nothing.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { crc32 } from "node:zlib";
import { Packr } from "msgpackr";
import {
  applyDelta, decodeDelta, encodeDelta, isBf16Exact, roundToBf16, type DeltaEncoding, type TensorSlot, type WeightDelta,
} from "../../actors/weight-sync/delta.ts";

function model(seed: number, n: number): Float32Array {
  const a = new Float32Array(n);
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    a[i] = (x / 2147483648 - 0.5) * 0.04;
  }
  return a;
}

const layout: TensorSlot[] = [
  { name: "a", offset: 0, numel: 4096 },
  { name: "b", offset: 4096, numel: 1000 },
  { name: "c", offset: 5096, numel: 8 },
];

describe("weight deltas", () => {
  it("round-trips bit-exactly for dense (Adam-like) and sparse updates", () => {
    const base = model(1, 5104);
    const next = base.slice();
    for (let i = 0; i < 4096; i++) next[i] = next[i]! * (1 + 1e-3 * Math.sin(i)); // dense small change
    next[4100] = 1.5; // sparse change in b
    // c unchanged
    const bytes = encodeDelta(layout, base, next, "3", "4");
    const d = decodeDelta(bytes);
    expect(d.tensors.map((t) => t.encoding)).toEqual(["sub-exp", "overwrite", "same"]);
    const target = base.slice();
    expect(applyDelta(layout, target, "3", d)).toBe("applied");
    expect(Buffer.compare(Buffer.from(target.buffer), Buffer.from(next.buffer))).toBe(0);
    expect(bytes.length).toBeLessThan(next.byteLength);
    // idempotent
    expect(applyDelta(layout, target, "4", d)).toBe("already-applied");
  });

  it("refuses a wrong base version or wrong base weights, changing nothing", () => {
    const base = model(2, 5104);
    const next = base.map((x) => x + 1e-4);
    const d = decodeDelta(encodeDelta(layout, base, next, "1", "2"));
    const other = model(3, 5104);
    const before = other.slice();
    expect(() => applyDelta(layout, other, "1", d)).toThrow(/base checksum of a does not match/);
    expect(() => applyDelta(layout, other, "7", d)).toThrow(/does not apply to version 7/);
    expect(Array.from(other)).toEqual(Array.from(before));
  });

  it("rejects garbage clearly", () => {
    expect(() => decodeDelta(new Uint8Array([1, 2, 3]))).toThrow(/weight delta/);
  });

  it("rejects a corrupt tensor (bad checksum after applying) and leaves the weights as they were", () => {
    const base = model(4, 5104);
    const next = base.map((x, i) => (i % 2 ? x * 1.001 : x));
    const d = decodeDelta(encodeDelta(layout, base, next, "1", "2"));
    const bad: WeightDelta = { ...d, tensors: d.tensors.map((t, i) => (i === 1 ? { ...t, crc: (t.crc ^ 1) >>> 0 } : t)) };
    const target = base.slice();
    expect(() => applyDelta(layout, target, "1", bad)).toThrow(/checksum of b after applying does not match; the delta file is corrupt/);
    expect(Buffer.compare(Buffer.from(target.buffer), Buffer.from(base.buffer))).toBe(0);
    const garbled: WeightDelta = { ...d, tensors: d.tensors.map((t, i) => (i === 0 ? { ...t, data: t.data.map((x) => x ^ 0x5a) } : t)) };
    expect(() => applyDelta(layout, target, "1", garbled)).toThrow(/weight delta: .* a\b/);
    expect(Buffer.compare(Buffer.from(target.buffer), Buffer.from(base.buffer))).toBe(0);
  });

  it("refuses files of another format version", () => {
    const v1 = new Packr({ useRecords: false }).pack({ format: "ooze-delta", v: 1, baseVersion: "1", version: "2", tensors: [] });
    expect(() => decodeDelta(v1)).toThrow(/version 1 of the format is not supported/);
  });

  it("bf16 wire: rounds to nearest even, ships only high halves, and is smaller than fp32", () => {
    const r = roundToBf16(new Float32Array([1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -0, Infinity, NaN, 3.4e38]));
    expect(Array.from(r.slice(0, 5))).toEqual([1, 1, 1 + 2 ** -6, -0, Infinity]);
    expect(Number.isNaN(r[5])).toBe(true);
    expect(r[6]).toBe(Infinity); // above bf16's largest finite value
    expect(isBf16Exact(r)).toBe(true);
    const base = roundToBf16(model(5, 5104));
    const next = roundToBf16(base.map((x, i) => x + 3e-4 * Math.sin(i)));
    const bytes = encodeDelta(layout, base, next, "1", "2", { wire: "bf16" });
    const d = decodeDelta(bytes);
    expect(d.wire).toBe("bf16");
    expect(d.tensors.every((t) => t.width === 2)).toBe(true);
    const target = base.slice();
    expect(applyDelta(layout, target, "1", d)).toBe("applied");
    expect(Buffer.compare(Buffer.from(target.buffer), Buffer.from(next.buffer))).toBe(0);
    expect(bytes.length).toBeLessThan(encodeDelta(layout, base, next, "1", "2").length);
    expect(() => encodeDelta(layout, model(6, 5104), next, "1", "2", { wire: "bf16" })).toThrow(/bf16-exact/);
  });
});

/** Float32Arrays of arbitrary bit patterns (NaNs, infinities, subnormals included). */
const words = (n: number) => fc.uint32Array({ minLength: n, maxLength: n }).map((u) => new Float32Array(u.buffer));
const slots = (sizes: number[]): TensorSlot[] => {
  let off = 0;
  return sizes.map((numel, i) => ({ name: `t${i}`, offset: (off += numel) - numel, numel }));
};
const same = (a: Float32Array, b: Float32Array) => Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;
const ENCODINGS: Exclude<DeltaEncoding, "same">[][] = [["sub"], ["sub-exp"], ["sub-ac"], ["xor"], ["overwrite", "sub"], ["sub", "sub-exp", "sub-ac", "xor", "overwrite"]];

describe("weight delta properties", () => {
  it("random buffers round-trip bit-exactly with every encoding and both wires", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 4 }).chain((sizes) => {
          const total = sizes.reduce((a, b) => a + b, 0);
          return fc.tuple(fc.constant(sizes), words(total), words(total), fc.constantFrom(...ENCODINGS), fc.boolean(), fc.integer({ min: 1, max: 9 }));
        }),
        ([sizes, a, b, encodings, bf16, level]) => {
          const lay = slots(sizes);
          const base = bf16 ? roundToBf16(a) : a, next = bf16 ? roundToBf16(b) : b;
          const d = decodeDelta(encodeDelta(lay, base, next, "7", "8", { wire: bf16 ? "bf16" : "fp32", encodings, level }));
          const target = base.slice();
          expect(applyDelta(lay, target, "7", d)).toBe("applied");
          expect(same(target, next)).toBe(true);
          expect(applyDelta(lay, target, "8", d)).toBe("already-applied");
          expect(same(target, next)).toBe(true);
        },
      ),
      { numRuns: 150 },
    );
  });

  it("random sparse updates round-trip bit-exactly and pick the overwrite list when it is smaller", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 64, max: 3000 }).chain((n) =>
          fc.tuple(fc.constant(n), words(n), fc.array(fc.tuple(fc.nat({ max: n - 1 }), fc.float({ noNaN: true })), { minLength: 1, maxLength: 6 }), fc.boolean()),
        ),
        ([n, a, changes, bf16]) => {
          const lay = slots([n]);
          const base = bf16 ? roundToBf16(a) : a;
          let next: Float32Array = base.slice();
          for (const [i, v] of changes) next[i] = v;
          if (bf16) next = roundToBf16(next);
          const d = decodeDelta(encodeDelta(lay, base, next, "1", "2", bf16 ? { wire: "bf16" } : {}));
          const target = base.slice();
          expect(applyDelta(lay, target, "1", d)).toBe("applied");
          expect(same(target, next)).toBe(true);
          const t = d.tensors[0]!;
          if (!same(base, next) && n >= 1000) expect(t.encoding).toBe("overwrite");
          expect(t.crc).toBe(crc32(Buffer.from(next.buffer)));
        },
      ),
      { numRuns: 100 },
    );
  });
});
