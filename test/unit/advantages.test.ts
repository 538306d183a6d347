import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ADVANTAGE_ESTIMATORS, computeAdvantages, isZeroVariance, type ScoredSample } from "../../src/algorithms/advantages.ts";

const s = (groupIndex: number, rolloutId: string, reward: number): ScoredSample => ({ groupIndex, rolloutId, reward });
const close = (a: ArrayLike<number>, b: number[]) => b.forEach((x, i) => expect(a[i]).toBeCloseTo(x, 5));

describe("group advantages", () => {
  it("grpo: mean and unbiased std per group, groups of different sizes", () => {
    const samples = [s(0, "a", 1), s(0, "b", 0), s(0, "c", 0), s(0, "d", 1), s(1, "e", 1), s(1, "f", 0)];
    const adv = computeAdvantages(samples, "grpo");
    const sd4 = Math.sqrt(((0.5 ** 2) * 4) / 3); // 0.577…
    const sd2 = Math.sqrt(0.5); // unbiased std of {1, 0}
    close(adv, [0.5 / sd4, -0.5 / sd4, -0.5 / sd4, 0.5 / sd4, 0.5 / sd2, -0.5 / sd2]);
  });

  it("a group of one gets zero advantage under grpo, rloo; r − mean = 0 under dr_grpo", () => {
    for (const est of ["grpo", "rloo", "dr_grpo", "gspo"] as const) {
      expect(computeAdvantages([s(5, "x", 0.7)], est)[0]).toBe(0);
    }
  });

  it("failedGroupAdvantage: a group failed throughout is pushed down; groups with contrast, all-succeeded groups and groups of one are not", () => {
    // group 0: every episode 0 (failed); 1: every episode 1; 2: contrast; 3: one episode, reward 0; 4: all −1
    const samples = [s(0, "a", 0), s(0, "b", 0), s(0, "b", 0), s(1, "c", 1), s(1, "d", 1), s(2, "e", 1), s(2, "f", 0), s(3, "g", 0), s(4, "h", -1), s(4, "i", -1)];
    for (const est of ["grpo", "gspo", "dr_grpo", "rloo"] as const) {
      const plain = computeAdvantages(samples, est);
      const nsr = computeAdvantages(samples, est, { failedGroupAdvantage: 0.5 });
      expect(Array.from(nsr.subarray(0, 3)), est).toEqual([-0.5, -0.5, -0.5]); // fan-out: every trajectory of a failed episode
      expect(Array.from(nsr.subarray(8, 10)), est).toEqual([-0.5, -0.5]);
      expect(Array.from(nsr.subarray(3, 8)), est).toEqual(Array.from(plain.subarray(3, 8)));
      expect(Array.from(plain.subarray(0, 3)), est).toEqual([0, 0, 0]);
    }
    // batch-level estimators whiten rewards over the batch: no group-level special case
    expect(computeAdvantages(samples, "reinforce_pp", { failedGroupAdvantage: 0.5 })).toEqual(computeAdvantages(samples, "reinforce_pp"));
    expect(() => computeAdvantages(samples, "grpo", { failedGroupAdvantage: -1 })).toThrow(/failedGroupAdvantage must be ≥ 0/);
  });

  it("rloo equals reward minus the mean of the others", () => {
    const r = [1, 0, 0.5];
    const adv = computeAdvantages(r.map((x, i) => s(0, String(i), x)), "rloo");
    close(adv, [1 - 0.25, 0 - 0.75, 0.5 - 0.5]);
  });

  it("fan-out: an episode with many trajectories counts once in its group", () => {
    // episode A fans out into 3 trajectories (reward 1 each); episode B is one trajectory (reward 0)
    const fan = [s(0, "A", 1), s(0, "A", 1), s(0, "A", 1), s(0, "B", 0)];
    const plain = [s(0, "A", 1), s(0, "B", 0)];
    for (const est of ["grpo", "dr_grpo", "rloo"] as const) {
      const a = computeAdvantages(fan, est);
      const p = computeAdvantages(plain, est);
      close(a, [p[0]!, p[0]!, p[0]!, p[1]!]);
    }
  });

  it("reinforce_pp whitens over the batch; the baseline variant subtracts group means first", () => {
    const samples = [s(0, "a", 1), s(0, "b", 1), s(1, "c", 0), s(1, "d", 1)];
    const pp = computeAdvantages(samples, "reinforce_pp");
    const ppb = computeAdvantages(samples, "reinforce_pp_baseline");
    expect(pp[0]).toBeGreaterThan(0);
    expect(pp[2]).toBeLessThan(0);
    // group 0 has no variance: its baseline-subtracted advantage is the batch mean after whitening
    expect(ppb[0]).toBeCloseTo(ppb[1]!, 9);
    expect(ppb[3]).toBeGreaterThan(ppb[0]!);
  });

  it("properties: zero-mean per group (episode-weighted), finite, order-independent", () => {
    const arb = fc.array(
      fc.record({ groupIndex: fc.integer({ min: 0, max: 3 }), rolloutId: fc.constantFrom("a", "b", "c", "d", "e"), reward: fc.double({ min: -5, max: 5, noNaN: true }) }),
      { minLength: 1, maxLength: 30 },
    );
    fc.assert(
      fc.property(arb, fc.constantFrom(...ADVANTAGE_ESTIMATORS), (samples, est) => {
        const adv = computeAdvantages(samples, est);
        for (const x of adv) expect(Number.isFinite(x)).toBe(true);
        const rev = computeAdvantages([...samples].reverse(), est);
        samples.forEach((_, i) => expect(rev[samples.length - 1 - i]).toBeCloseTo(adv[i]!, 6));
        if (est === "grpo" || est === "dr_grpo" || est === "rloo" || est === "gspo") {
          const byGroup = new Map<number, Map<string, number>>();
          samples.forEach((x, i) => {
            const g = byGroup.get(x.groupIndex) ?? new Map<string, number>();
            g.set(x.rolloutId, adv[i]!);
            byGroup.set(x.groupIndex, g);
          });
          for (const g of byGroup.values()) {
            const sum = [...g.values()].reduce((a, b) => a + b, 0);
            expect(Math.abs(sum)).toBeLessThan(1e-6 * Math.max(1, g.size) * 1e3);
          }
        }
      }),
      { numRuns: Number(process.env.OOZE_PROPERTY_RUNS ?? 100) },
    );
  });

  it("dynamic filter detects zero-variance groups", () => {
    expect(isZeroVariance([s(0, "a", 1), s(0, "b", 1)])).toBe(true);
    expect(isZeroVariance([s(0, "a", 1), s(0, "b", 0)])).toBe(false);
  });
});
