import { describe, expect, it } from "vitest";
import { applyDelta, decodeDelta, encodeDelta, type TensorSlot } from "../../actors/weight-sync/delta.ts";

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
    expect(d.tensors.map((t) => t.encoding)).toEqual(["xor", "overwrite", "same"]);
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
});
