// Policy losses: hand-computed cases pin the reference's semantics (PPO clip, dual clip, KL estimators,
// TIS, reductions); the native loss equals the reference on random inputs for every option (fast-check);
// and the Trainer's accumulate applies the loss gradient through the model.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import {
  defaultPolicyLossConfig,
  klEstimate,
  policyLoss,
  ppoClipToken,
  type PolicyLossConfig,
  type PolicyLossInputs,
} from "../../native/reference/losses.ts";
import { referenceForwardBackward } from "../../native/reference/train.ts";
import { checkGrads, checkTensor, randomPacked, randomParams, rng, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { packSamples, Trainer } from "../../native/trainer.ts";

const close = (a: number, b: number, tol = 1e-9): boolean => Math.abs(a - b) <= tol * Math.max(1, Math.abs(b));

describe("reference loss semantics (hand-computed)", () => {
  it("PPO clip: gradient flows inside the band and on the pessimistic side, not where the clip binds", () => {
    // A > 0, ratio above 1 + epsHigh: clipped, loss −A(1+eps), no gradient.
    let r = ppoClipToken(Math.log(1.5), 0, 2, 0.2, 0.28, null);
    expect(close(r.loss, -2 * 1.28)).toBe(true);
    expect(r.grad).toBe(0);
    expect(r.clipped).toBe(true);
    // A > 0, ratio below 1 − eps: unclipped branch is the max, gradient −A·r.
    r = ppoClipToken(Math.log(0.5), 0, 2, 0.2, 0.28, null);
    expect(close(r.loss, -1)).toBe(true);
    expect(close(r.grad, -1)).toBe(true);
    expect(r.clipped).toBe(false);
    // A < 0, ratio above 1 + eps: unclipped −A·r is larger, gradient flows.
    r = ppoClipToken(Math.log(2), 0, -1, 0.2, 0.2, null);
    expect(close(r.loss, 2)).toBe(true);
    expect(close(r.grad, 2)).toBe(true);
    // Dual clip c = 3 bounds it at −A·c = 3 once r > 3, with no gradient.
    r = ppoClipToken(Math.log(5), 0, -1, 0.2, 0.2, 3);
    expect(close(r.loss, 3)).toBe(true);
    expect(r.grad).toBe(0);
    expect(r.dualClipped).toBe(true);
    // Dual clip never touches positive advantages.
    r = ppoClipToken(Math.log(5), 0, 1, 0.2, 0.2, 3);
    expect(r.dualClipped).toBe(false);
  });

  it("KL estimators k1, k2, k3 of δ = logπ − logπ_ref and their derivatives", () => {
    const d = 0.3;
    expect(klEstimate(d, "k1")).toEqual({ value: d, grad: 1 });
    expect(close(klEstimate(d, "k2").value, 0.045)).toBe(true);
    expect(close(klEstimate(d, "k3").value, Math.exp(-d) - 1 + d)).toBe(true);
    expect(close(klEstimate(d, "k3").grad, 1 - Math.exp(-d))).toBe(true);
    expect(klEstimate(0, "k3").value).toBe(0);
  });

  it("per-token vs per-sample reduction, TIS weight and entropy bonus", () => {
    // Two samples: 1 masked token with pg loss 1, and 3 masked tokens with pg loss 3 each.
    const x: PolicyLossInputs = {
      cuSeqlens: new Int32Array([0, 2, 6]),
      logprobs: new Float64Array(6), entropy: Float64Array.from([0, 0.5, 0, 1, 1, 1]),
      lossMask: Uint8Array.from([0, 1, 0, 1, 1, 1]),
      advantages: Float64Array.from([0, -1, 0, -3, -3, -3]), oldLogprobs: new Float64Array(6),
      rolloutLogprobs: Float64Array.from([0, Math.log(0.5), 0, 0, 0, 0]), refLogprobs: null,
    };
    const tok = policyLoss({ ...defaultPolicyLossConfig }, x).metrics;
    expect(close(tok.loss, (1 + 9) / 4)).toBe(true);
    const smp = policyLoss({ ...defaultPolicyLossConfig, reduction: "sample" }, x).metrics;
    expect(close(smp.loss, (1 + 3) / 2)).toBe(true);
    // TIS: token 1 has exp(old − rollout) = 2, capped at 1.5.
    const tis = policyLoss({ ...defaultPolicyLossConfig, tisCap: 1.5 }, x);
    expect(close(tis.metrics.pgLoss, (1.5 + 9) / 4)).toBe(true);
    expect(close(tis.dLogprobs[1]!, (1.5 * 1) / 4)).toBe(true);
    // Entropy bonus lowers the loss and has gradient −coef·weight.
    const ent = policyLoss({ ...defaultPolicyLossConfig, entropyCoef: 0.1 }, x);
    expect(close(ent.metrics.loss, (10 - 0.1 * 3.5) / 4)).toBe(true);
    expect(close(ent.dEntropy[3]!, -0.1 / 4)).toBe(true);
    // The uniform cross-entropy adds coef·uniformCe per token, with gradient coef·weight (masked tokens only).
    const uniformCe = Float64Array.from([9, 4, 9, 5, 5, 6]);
    const uni = policyLoss({ ...defaultPolicyLossConfig, uniformCoef: 0.1 }, { ...x, uniformCe });
    expect(close(uni.metrics.loss, (10 + 0.1 * 20) / 4)).toBe(true);
    expect(close(uni.metrics.uniformCe, 20 / 4)).toBe(true);
    expect(close(uni.dUniform[3]!, 0.1 / 4)).toBe(true);
    expect(uni.dUniform[0]).toBe(0);
    expect(() => policyLoss({ ...defaultPolicyLossConfig, uniformCoef: 0.1 }, x)).toThrow(/uniformCe is missing/);
    // A normalizer replaces the batch's own count.
    expect(close(policyLoss({ ...defaultPolicyLossConfig, normalizer: 8 }, x).metrics.loss, 10 / 8)).toBe(true);
  });
});

/** Random per-token loss inputs over sequences of the given lengths (first token of each masked out). */
function randomInputs(lengths: number[], seed: number, withRollout: boolean, withRef: boolean) {
  const r = rng(seed);
  const cu = new Int32Array(lengths.length + 1);
  lengths.forEach((n, i) => (cu[i + 1] = cu[i]! + n));
  const T = cu[lengths.length]!;
  const f = (g: () => number) => Float32Array.from({ length: T }, g);
  const lossMask = Uint8Array.from({ length: T }, () => (r() < 0.7 ? 1 : 0));
  for (let s = 0; s < lengths.length; s++) if (lengths[s]! > 0) lossMask[cu[s]!] = 0;
  return {
    cuSeqlens: cu, lossMask,
    logprobs: f(() => -3 * r()), entropy: f(() => 2 * r()), uniformCe: f(() => 3 + 2 * r()), advantages: f(() => 4 * r() - 2),
    oldLogprobs: f(() => -3 * r()),
    rolloutLogprobs: withRollout ? f(() => -3 * r()) : null,
    refLogprobs: withRef ? f(() => -3 * r()) : null,
  };
}

describe("native policyLoss equals the reference", () => {
  it("on random inputs for every option (metrics rtol 1e-5, gradients atol 1e-7 + rtol 1e-5)", () => {
    const native = loadNative();
    fc.assert(
      fc.property(
        fc.record({
          lengths: fc.array(fc.integer({ min: 0, max: 12 }), { minLength: 1, maxLength: 5 }),
          seed: fc.integer({ min: 0, max: 1e6 }),
          epsClip: fc.constantFrom(0.1, 0.2),
          epsClipHigh: fc.constantFrom(0.2, 0.28),
          epsClipC: fc.constantFrom(null, 3),
          klCoef: fc.constantFrom(0, 0.05),
          klType: fc.constantFrom("k1" as const, "k2" as const, "k3" as const),
          entropyCoef: fc.constantFrom(0, 0.01),
          uniformCoef: fc.constantFrom(0, 0.02),
          tisCap: fc.constantFrom(null, 2),
          reduction: fc.constantFrom("token" as const, "sample" as const),
          normalizer: fc.constantFrom(null, 50),
        }),
        (p) => {
          const x = randomInputs(p.lengths, p.seed, p.tisCap !== null, p.klCoef !== 0 || p.seed % 2 === 0);
          const cfg: PolicyLossConfig = {
            epsClip: p.epsClip, epsClipHigh: p.epsClipHigh, epsClipC: p.epsClipC, klCoef: p.klCoef, klType: p.klType,
            entropyCoef: p.entropyCoef, uniformCoef: p.uniformCoef, tisCap: p.tisCap, reduction: p.reduction, normalizer: p.normalizer,
          };
          const ref = policyLoss(cfg, x);
          const got = native.policyLoss(x, cfg);
          for (const k of Object.keys(ref.metrics) as (keyof typeof ref.metrics)[])
            expect(close(got.metrics[k], ref.metrics[k], 1e-5), `${k}: ${got.metrics[k]} vs ${ref.metrics[k]}`).toBe(true);
          expect(checkTensor("dLogprobs", got.dLogprobs, ref.dLogprobs, 1e-7, 1e-5)).toBe("");
          expect(checkTensor("dEntropy", got.dEntropy, ref.dEntropy, 1e-7, 1e-5)).toBe("");
          expect(checkTensor("dUniform", got.dUniform, ref.dUniform, 1e-7, 1e-5)).toBe("");
        },
      ),
      { numRuns: Number(process.env.OOZE_FC_RUNS ?? 200) },
    );
  });

  it("rejects a KL coefficient without reference logprobs, naming the field", () => {
    const native = loadNative();
    const x = randomInputs([4], 1, false, false);
    expect(() => native.policyLoss(x, { klCoef: 0.1 })).toThrow(/kl_coef is set but no reference logprobs/);
    expect(() => native.policyLoss({ ...x, uniformCe: null }, { uniformCoef: 0.1 })).toThrow(/uniform_coef is set but the forward's uniform cross-entropy/);
    expect(() => native.policyLoss(x, { uniformCoef: -1 })).toThrow(/uniform_coef must be >= 0/);
  });
});

describe("Trainer.accumulate", () => {
  it("metrics equal the reference loss on the trainer's own logprobs, and its grads equal backward(dLoss)", async () => {
    const cfg = tinyTrainConfig(false);
    const params = randomParams(cfg, 3);
    const packed = randomPacked([7, 5, 8], cfg.vocab_size, 5);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const cur = await t.logprobs(packed, 0.9);
    const x = randomInputs([7, 5, 8], 8, true, true);
    // Old logprobs near the current ones so that some ratios sit inside the band and some are clipped.
    const r = rng(4);
    const old = cur.logprobs.map((v) => v + 1.2 * (r() - 0.5));
    const batch = { ...packed, lossMask: x.lossMask, advantages: x.advantages, oldLogprobs: old, rolloutLogprobs: x.rolloutLogprobs, refLogprobs: x.refLogprobs };
    const cfgLoss: PolicyLossConfig = { ...defaultPolicyLossConfig, epsClipHigh: 0.28, epsClipC: 3, klCoef: 0.1, klType: "k3", entropyCoef: 0.01, tisCap: 2, reduction: "sample" };
    const metrics = await t.accumulate(batch, { ...cfgLoss, temperature: 0.9 });
    const ref = policyLoss(cfgLoss, { ...batch, cuSeqlens: packed.cuSeqlens, logprobs: cur.logprobs, entropy: cur.entropy });
    expect(close(metrics.loss, ref.metrics.loss, 1e-5)).toBe(true);
    expect(close(metrics.clipfrac, ref.metrics.clipfrac, 1e-5)).toBe(true);
    expect(ref.metrics.clipfrac).toBeGreaterThan(0);
    const viaAccumulate = await t.getGrads();
    await t.zeroGrads();
    await t.backward(packed, 0.9, Float32Array.from(ref.dLogprobs), Float32Array.from(ref.dEntropy));
    expect(checkTensor("grads", viaAccumulate, await t.getGrads(), 1e-6, 1e-4)).toBe("");
  });

  it("with the uniform cross-entropy: metrics and every parameter's gradient equal the float64 reference's", async () => {
    const cfg = tinyTrainConfig(true);
    const params = randomParams(cfg, 9);
    const packed = randomPacked([6, 9, 4], cfg.vocab_size, 2);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const fwd = referenceForwardBackward(cfg, params, packed, 0.9, null);
    const x = randomInputs([6, 9, 4], 3, false, false);
    const r = rng(5);
    const old = Float32Array.from(fwd.logprobs, (v) => v + 0.6 * (r() - 0.5));
    const batch = { ...packed, lossMask: x.lossMask, advantages: x.advantages, oldLogprobs: old, rolloutLogprobs: null, refLogprobs: null };
    const cfgLoss: PolicyLossConfig = { ...defaultPolicyLossConfig, entropyCoef: 0.01, uniformCoef: 0.2 };
    const metrics = await t.accumulate(batch, { ...cfgLoss, temperature: 0.9 });
    const ref = policyLoss(cfgLoss, { ...batch, cuSeqlens: packed.cuSeqlens, logprobs: fwd.logprobs, entropy: fwd.entropy, uniformCe: fwd.uniformCe });
    expect(close(metrics.loss, ref.metrics.loss, 1e-5)).toBe(true);
    expect(close(metrics.uniformCe, ref.metrics.uniformCe, 1e-5)).toBe(true);
    expect(ref.metrics.uniformCe).toBeGreaterThan(Math.log(cfg.vocab_size)); // a cross-entropy is at least the uniform's entropy
    const want = referenceForwardBackward(cfg, params, packed, 0.9, { dLogprobs: ref.dLogprobs, dEntropy: ref.dEntropy, dUniform: ref.dUniform }).grads!;
    expect(checkGrads(cfg, await t.getGrads(), want, 3e-5, 1e-3)).toEqual([]);
    // the term moves the gradient: without it the same batch's is different
    const without = referenceForwardBackward(cfg, params, packed, 0.9, { dLogprobs: ref.dLogprobs, dEntropy: ref.dEntropy }).grads!;
    expect(checkGrads(cfg, await t.getGrads(), without, 3e-5, 1e-3)).not.toEqual([]);
  });
});

describe("micro-batch accumulation", () => {
  it.each(["token", "sample"] as const)("two micro-batches with a global normalizer equal one batch (%s reduction)", async (reduction) => {
    const cfg = tinyTrainConfig(true);
    const params = randomParams(cfg, 12);
    const r = rng(6);
    const samples = [9, 6, 11, 4].map((n) => ({
      tokens: Int32Array.from({ length: n }, () => Math.floor(r() * cfg.vocab_size)),
      responseLength: n - 2,
      lossMask: Uint8Array.from({ length: n - 2 }, () => (r() < 0.8 ? 1 : 0)),
      rolloutLogprobs: null,
      advantage: r() - 0.5,
    }));
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const whole = packSamples(samples);
    const old = (await t.logprobs(whole)).logprobs.map((v) => v + 0.1);
    const full = await t.accumulate({ ...whole, oldLogprobs: old }, { reduction });
    const gradsFull = await t.getGrads();
    await t.zeroGrads();
    const normalizer = reduction === "token" ? full.numTokens : full.numSamples;
    let loss = 0;
    for (const part of [samples.slice(0, 2), samples.slice(2)]) {
      const b = packSamples(part);
      const m = await t.accumulate({ ...b, oldLogprobs: (await t.logprobs(b)).logprobs.map((v) => v + 0.1) }, { reduction, normalizer });
      loss += m.loss;
    }
    expect(close(loss, full.loss, 1e-5)).toBe(true);
    expect(checkTensor("accumulated grads", await t.getGrads(), gradsFull, 1e-6, 1e-4)).toBe("");
  });
});
