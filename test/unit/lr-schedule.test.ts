import { describe, expect, it } from "vitest";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { learningRate, policyTrainerConfig } from "../../actors/trainer/policy-trainer.ts";

describe("learning-rate schedule", () => {
  const lr = 1e-3;
  it("warms up linearly, then stays constant by default", () => {
    expect([1, 2, 4, 9, 1000].map((v) => learningRate({ lr, lrWarmupSteps: 4 }, v))).toEqual([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3]);
    expect(learningRate({ lr }, 7)).toBe(lr);
  });

  it("decays linearly or along a half cosine from the end of the warmup to lr × lrMinRatio at lrDecaySteps", () => {
    const lin = { lr, lrWarmupSteps: 10, lrDecay: "linear" as const, lrDecaySteps: 110, lrMinRatio: 0.2 };
    expect(learningRate(lin, 5)).toBeCloseTo(5e-4, 15);
    expect(learningRate(lin, 10)).toBeCloseTo(1e-3, 15);
    expect(learningRate(lin, 60)).toBeCloseTo(1e-3 * (0.2 + 0.8 * 0.5), 15);
    expect(learningRate(lin, 110)).toBeCloseTo(2e-4, 15);
    expect(learningRate(lin, 500)).toBeCloseTo(2e-4, 15);
    const cos = { ...lin, lrDecay: "cosine" as const };
    expect(learningRate(cos, 10)).toBeCloseTo(1e-3, 15);
    expect(learningRate(cos, 60)).toBeCloseTo(1e-3 * (0.2 + 0.8 * 0.5), 15);
    expect(learningRate(cos, 35)).toBeCloseTo(1e-3 * (0.2 + 0.8 * 0.5 * (1 + Math.cos(Math.PI / 4))), 15);
    expect(learningRate(cos, 110)).toBeCloseTo(2e-4, 15);
    // monotone after the warmup
    const xs = Array.from({ length: 120 }, (_, i) => learningRate(cos, i + 10));
    for (let i = 1; i < xs.length; i++) expect(xs[i]!).toBeLessThanOrEqual(xs[i - 1]!);
  });

  it("decays to lrDecaySteps when the topology gives it, else to the run's last step", () => {
    const cfg = (train: Record<string, unknown>) => policyTrainerConfig(trainConfigOf({ train, engines: undefined, file: "t.yaml" }).train);
    expect(cfg({ steps: 5000, lrDecay: "cosine" }).lrDecaySteps).toBe(5000);
    const c = cfg({ steps: 5000, lr: 1e-3, lrDecay: "cosine", lrDecaySteps: 1000, lrMinRatio: 0.1 });
    expect(c.lrDecaySteps).toBe(1000);
    expect(learningRate(c, 1000)).toBeCloseTo(1e-4, 15);
    expect(learningRate(c, 3000)).toBeCloseTo(1e-4, 15);
    expect(() => cfg({ lrDecaySteps: 0 })).toThrow(/t\.yaml: train: lrDecaySteps/);
  });
});
