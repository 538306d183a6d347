// The AVX2 6x16 kernel path (the one used on CPUs without AVX-512), forced with OOZE_NO_AVX512
// before the addon loads in this test process; same shapes and tolerance as gemm.test.ts.
import { describe, expect, it } from "vitest";
import { checkShape } from "./gemm-check.ts";

process.env.OOZE_NO_AVX512 = "1";

const shapes: Array<[number, number, number]> = [
  [9, 16, 8], [13, 47, 100], [25, 31, 257], [37, 33, 513], [145, 35, 40], [150, 50, 260], [100, 3, 7],
  [520, 70, 470], [100, 700, 250],
  // wider than one 3072-column packed B block
  [13, 3100, 20],
];

describe("matmul AVX2 path vs reference", () => {
  it("nt, nn, tn on odd shapes", () => {
    const failures: string[] = [];
    for (const kind of ["nt", "nn", "tn"] as const) {
      for (const [M, N, K] of shapes) {
        for (const acc of [false, true]) {
          const f = checkShape(kind, M, N, K, acc);
          if (f) failures.push(f);
        }
      }
    }
    expect(failures).toEqual([]);
  });
});
