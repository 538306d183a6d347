// GAE over multi-turn samples: a hand-computed case pins where rewards go and that environment tokens
// are skipped (no step, no value, no advantage); the estimator equals an independent float64 reference
// (the explicit sum A_s = Σ_l (γλ)^l δ_{s+l} over model-token steps) on uneven samples with environment
// tokens in the middle and per-turn rewards; λ = 1 gives discounted returns; batch whitening; bad input.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { computeGae, explainedVariance, placeRewards, type GaeSample } from "../../src/algorithms/gae.ts";
import { gaeSampleOf } from "../../actors/trainer/policy-trainer.ts";
import { mulberry32 } from "../../src/random.ts";

/** Independent reference: list the steps, compute δ for each, sum the discounted future δs. */
function referenceGae(s: GaeSample, gamma: number, lambda: number): { adv: Float64Array; ret: Float64Array } {
  const n = s.lossMask.length;
  const steps = [...Array(n).keys()].filter((i) => s.lossMask[i]);
  const rewards = new Float64Array(n);
  if (steps.length) rewards[steps.at(-1)!]! += s.reward;
  s.turnRewards?.ends.forEach((end, k) => {
    const before = steps.filter((i) => i < end);
    rewards[before.length ? before.at(-1)! : steps[0]!]! += s.turnRewards!.rewards[k]!;
  });
  const V = (j: number) => (j < steps.length ? s.values[steps[j]!]! : 0);
  const delta = steps.map((i, j) => rewards[i]! + gamma * V(j + 1) - V(j));
  const adv = new Float64Array(n), ret = new Float64Array(n);
  steps.forEach((i, j) => {
    let a = 0;
    for (let l = 0; j + l < steps.length; l++) a += (gamma * lambda) ** l * delta[j + l]!;
    adv[i] = a;
    ret[i] = a + V(j);
  });
  return { adv, ret };
}

/** A multi-turn sample: turns of model tokens separated by environment observations. */
function multiTurn(r: () => number, turns: number): GaeSample {
  const mask: number[] = [], ends: number[] = [], rewards: number[] = [];
  for (let t = 0; t < turns; t++) {
    const model = 1 + Math.floor(r() * 5);
    for (let i = 0; i < model; i++) mask.push(1);
    ends.push(mask.length);
    rewards.push(Math.round((r() - 0.5) * 10) / 10);
    if (t + 1 < turns) for (let i = 0, env = 1 + Math.floor(r() * 4); i < env; i++) mask.push(0);
  }
  return {
    lossMask: Uint8Array.from(mask),
    values: Float32Array.from(mask, (m) => (m ? r() * 2 - 1 : 0)),
    reward: r(),
    turnRewards: r() < 0.7 ? { ends, rewards } : null,
  };
}

describe("GAE", () => {
  it("hand-computed: rewards at turn ends and the end, environment tokens skipped", () => {
    // response: [m m e e m] — two turns, observation of 2 tokens in between
    const s: GaeSample = { lossMask: [1, 1, 0, 0, 1], values: [0.5, 0.25, 9, 9, 0.5], reward: 1, turnRewards: { ends: [2, 5], rewards: [0.5, 0] } };
    expect(Array.from(placeRewards(s))).toEqual([0, 0.5, 0, 0, 1]);
    const { advantages, returns } = computeGae([s], { gamma: 1, lambda: 1, whitening: "none" });
    // λ = γ = 1: A = (sum of rewards from here on) − V; the environment values (9) are never read
    expect(Array.from(advantages[0]!)).toEqual([1.5 - 0.5, 1.5 - 0.25, 0, 0, 1 - 0.5]);
    expect(Array.from(returns[0]!)).toEqual([1.5, 1.5, 0, 0, 1]);
    // γ = 0.5, λ = 0: one-step TD across the observation: δ at token 1 bootstraps from token 4's value
    const td = computeGae([s], { gamma: 0.5, lambda: 0, whitening: "none" });
    expect(td.advantages[0]![1]).toBeCloseTo(0.5 + 0.5 * 0.5 - 0.25, 7);
    expect(td.advantages[0]![4]).toBeCloseTo(1 - 0.5, 7);
  });

  it("equals the float64 reference on uneven multi-turn samples (fast-check), within 1e-6", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 31 - 1 }), fc.double({ min: 0, max: 1, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), (seed, gamma, lambda) => {
        const r = mulberry32(seed);
        const samples = Array.from({ length: 1 + Math.floor(r() * 5) }, () => multiTurn(r, 1 + Math.floor(r() * 4)));
        const got = computeGae(samples, { gamma, lambda, whitening: "none" });
        samples.forEach((s, k) => {
          const ref = referenceGae(s, gamma, lambda);
          for (let i = 0; i < s.lossMask.length; i++) {
            expect(Math.abs(got.advantages[k]![i]! - ref.adv[i]!)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(ref.adv[i]!)));
            expect(Math.abs(got.returns[k]![i]! - ref.ret[i]!)).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(ref.ret[i]!)));
            if (!s.lossMask[i]) expect(got.advantages[k]![i]).toBe(0);
          }
        });
      }),
      { numRuns: Number(process.env.OOZE_PROPERTY_RUNS ?? 100) },
    );
  });

  it("batch whitening: model-token advantages get mean 0 and std 1; returns are not whitened", () => {
    const r = mulberry32(3);
    const samples = [multiTurn(r, 3), multiTurn(r, 1), multiTurn(r, 4)];
    const raw = computeGae(samples, { gamma: 0.9, lambda: 0.95, whitening: "none" });
    const w = computeGae(samples, { gamma: 0.9, lambda: 0.95, whitening: "batch" });
    const all: number[] = [];
    samples.forEach((s, k) => {
      for (let i = 0; i < s.lossMask.length; i++) if (s.lossMask[i]) all.push(w.advantages[k]![i]!);
    });
    const mean = all.reduce((a, b) => a + b, 0) / all.length;
    const sd = Math.sqrt(all.reduce((a, b) => a + (b - mean) ** 2, 0) / (all.length - 1));
    expect(Math.abs(mean)).toBeLessThan(1e-6);
    expect(Math.abs(sd - 1)).toBeLessThan(1e-5);
    expect(w.returns).toEqual(raw.returns);
  });

  it("explained variance: 1 for perfect values, 0 for a constant at the mean", () => {
    const mask = [Uint8Array.from([1, 1, 0, 1])], ret = [Float32Array.from([1, 2, 0, 3])];
    expect(explainedVariance(mask, ret, ret)).toBe(1);
    expect(explainedVariance(mask, [Float32Array.from([2, 2, 0, 2])], ret)).toBeCloseTo(0, 9);
  });

  it("bad input is a clear error naming the sample", () => {
    const s: GaeSample = { lossMask: [1, 1], values: [0, 0], reward: 1, turnRewards: { ends: [7], rewards: [1] } };
    expect(() => computeGae([s], { gamma: 1, lambda: 1 })).toThrow(/sample 0: turn 0 ends at 7, outside the response/);
    expect(() => computeGae([{ ...s, turnRewards: null, values: [0] }], { gamma: 1, lambda: 1 })).toThrow(/sample 0: values has 1 entries/);
    expect(() => computeGae([s], { gamma: 1.5, lambda: 1 })).toThrow(/gamma must be in \[0, 1\]/);
  });
});

describe("GAE on trained samples (policy trainer)", () => {
  it("turn rewards come early, the rest of the episode reward at the end: the undiscounted return is the episode's reward", () => {
    const sample = {
      index: 7, reward: 0.9, lossMask: Uint8Array.from([1, 1, 0, 0, 1, 0, 1]),
      metadata: { turnRewards: { ends: [2, 5, 7], rewards: [0.2, 0.1, 0] } },
    };
    const g = gaeSampleOf(sample, new Float32Array(7));
    expect(g.reward).toBeCloseTo(0.6, 12);
    expect(Array.from(placeRewards(g)).map((x) => Math.round(x * 1e9) / 1e9)).toEqual([0, 0.2, 0, 0, 0.1, 0, 0.6]);
    const { returns } = computeGae([g], { gamma: 1, lambda: 1, whitening: "none" });
    expect(returns[0]![0]).toBeCloseTo(0.9, 6);
    // without turn rewards the whole reward comes at the end
    expect(gaeSampleOf({ ...sample, metadata: {} }, new Float32Array(7)).turnRewards).toBeNull();
    expect(() => gaeSampleOf({ ...sample, metadata: { turnRewards: [1, 2] } }, new Float32Array(7))).toThrow(/sample 7: metadata.turnRewards must be/);
  });
});
