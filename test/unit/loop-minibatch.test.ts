// Mini-batches of the trainer keep groups whole and the order of samples, for any group sizes.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { miniBatches } from "../../actors/trainer/policy-trainer.ts";

describe("miniBatches", () => {
  it("splits into at most k parts of whole groups, concatenating back to the input", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 5 }), { maxLength: 12 }), fc.integer({ min: 1, max: 6 }), (sizes, k) => {
        const samples = sizes.flatMap((n, g) => Array.from({ length: n }, (_, i) => ({ groupIndex: g, i })));
        const parts = miniBatches(samples, k);
        expect(parts.flat()).toEqual(samples);
        expect(parts.length).toBeLessThanOrEqual(Math.max(1, Math.min(k, sizes.length)));
        const owner = new Map<number, number>();
        parts.forEach((p, j) =>
          p.forEach((s) => {
            expect(owner.get(s.groupIndex) ?? j).toBe(j); // a group never spans two parts
            owner.set(s.groupIndex, j);
          }),
        );
        for (const p of parts) expect(p.length).toBeGreaterThan(0);
      }),
    );
  });
});
