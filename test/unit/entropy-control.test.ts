import { describe, expect, it } from "vitest";
import { entropyTargetAt, nextEntropyCoef } from "../../actors/trainer/policy-trainer.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";

describe("adaptive entropy control", () => {
  it("has no target without entropyTarget, a constant one without entropyTargetFinal", () => {
    expect(entropyTargetAt({ entropyTarget: null }, 50)).toBeNull();
    expect(nextEntropyCoef({ entropyTarget: null, entropyCoefStep: 0.01 }, 0.02, 0.1, 50)).toBe(0.02);
    expect([0, 10, 5000].map((s) => entropyTargetAt({ entropyTarget: 0.3 }, s))).toEqual([0.3, 0.3, 0.3]);
  });

  it("moves the target linearly to entropyTargetFinal at entropyTargetSteps and keeps it there", () => {
    const c = { entropyTarget: 0.3, entropyTargetFinal: 0.1, entropyTargetSteps: 600 };
    expect(entropyTargetAt(c, 0)).toBeCloseTo(0.3, 15);
    expect(entropyTargetAt(c, 300)).toBeCloseTo(0.2, 15);
    expect(entropyTargetAt(c, 600)).toBeCloseTo(0.1, 15);
    expect(entropyTargetAt(c, 5000)).toBeCloseTo(0.1, 15);
  });

  it("steps the coefficient toward the step's target, never below 0 nor above entropyCoefMax", () => {
    const c = { entropyTarget: 0.3, entropyTargetFinal: 0.1, entropyTargetSteps: 600, entropyCoefStep: 0.01, entropyCoefMax: 0.03 };
    // entropy 0.25: below the target at step 0 (0.3), above it at step 600 (0.1)
    expect(nextEntropyCoef(c, 0.01, 0.25, 0)).toBeCloseTo(0.02, 15);
    expect(nextEntropyCoef(c, 0.01, 0.25, 600)).toBeCloseTo(0, 15);
    expect(nextEntropyCoef(c, 0, 0.25, 600)).toBe(0);
    // wind-up stops at the cap
    let coef = 0;
    for (let s = 0; s < 20; s++) coef = nextEntropyCoef(c, coef, 0.05, s);
    expect(coef).toBeCloseTo(0.03, 15);
    // no cap: it keeps rising
    coef = 0;
    for (let s = 0; s < 20; s++) coef = nextEntropyCoef({ ...c, entropyCoefMax: null }, coef, 0.05, s);
    expect(coef).toBeCloseTo(0.2, 12);
  });

  it("reads the fields from a topology's train: section", () => {
    const train = { entropyTarget: 0.3, entropyTargetFinal: 0.1, entropyTargetSteps: 600, entropyCoefMax: 0.1 };
    expect(trainConfigOf({ train, engines: undefined, file: "t.yaml" }).train).toMatchObject(train);
    expect(trainConfigOf({ train: {}, engines: undefined, file: "t.yaml" }).train).toMatchObject({ entropyTargetFinal: null, entropyCoefMax: null });
    expect(() => trainConfigOf({ train: { entropyCoefMax: -1 }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: entropyCoefMax/);
  });
});
