// Native matmul (nt, nn, tn) vs the TypeScript reference on many odd shapes: tile remainders,
// K/M/N block edges, the skinny decode path (M ≤ 8) and accumulate. Tolerance: see gemm-check.ts.
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { checkShape } from "./gemm-check.ts";

const kinds = ["nt", "nn", "tn"] as const;
/** [M, N, K]: remainders of 6x16 and 12x32 tiles, KC = 256 and MC = 144 edges, skinny M, threads. */
const shapes: Array<[number, number, number]> = [
  [1, 1, 1], [1, 17, 5], [2, 33, 9], [3, 7, 300], [4, 64, 31], [5, 15, 16], [7, 100, 257], [8, 40, 3],
  [9, 16, 8], [12, 32, 256], [13, 47, 100], [17, 1, 19], [25, 31, 257], [37, 33, 513], [48, 96, 64],
  [145, 35, 40], [150, 50, 260], [100, 3, 7], [300, 20, 33], [6, 3100, 4],
  // above the 2^24 multiply-add threshold: threads split rows, then columns
  [520, 70, 470], [100, 700, 250],
  // wider than one 3072-column packed B block
  [13, 3100, 20],
];

describe("matmul native vs reference", () => {
  for (const kind of kinds) {
    it(`${kind} on odd shapes, overwrite and accumulate`, () => {
      const failures: string[] = [];
      for (const [M, N, K] of shapes) {
        for (const acc of [false, true]) {
          const f = checkShape(kind, M, N, K, acc);
          if (f) failures.push(f);
        }
      }
      expect(failures).toEqual([]);
    });
  }

  it("handles empty shapes: K = 0 zeroes C (or keeps it when accumulating), M or N = 0 is a no-op", () => {
    const { matmul } = loadNative();
    const C = new Float32Array([1, 2, 3, 4]);
    matmul("nt", new Float32Array(0), new Float32Array(0), C, 2, 2, 0, true);
    expect(Array.from(C)).toEqual([1, 2, 3, 4]);
    matmul("nn", new Float32Array(0), new Float32Array(0), C, 2, 2, 0, false);
    expect(Array.from(C)).toEqual([0, 0, 0, 0]);
    matmul("tn", new Float32Array(0), new Float32Array(6), C, 0, 2, 3, false);
  });

  it("rejects a wrong kind and arrays too small for the shape", () => {
    const { matmul } = loadNative();
    const a = new Float32Array(4);
    expect(() => matmul("xx" as "nt", a, a, a, 2, 2, 2, false)).toThrow(/kind must be/);
    expect(() => matmul("nt", a, a, a, 3, 2, 2, false)).toThrow(/A has 4 elements/);
  });

  it("is right when limited to one thread", () => {
    const { gemmThreads } = loadNative();
    const before = gemmThreads();
    gemmThreads(1);
    try {
      expect(checkShape("nt", 100, 700, 250, false)).toBe("");
    } finally {
      gemmThreads(before);
    }
  });
});
