// AdamW and gradient clipping: native steps equal the float64 reference (clipping active, weight decay
// on matrices only), a non-finite gradient skips the step, and a tiny model overfits a fixed batch.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { adamwStep, newAdamWState, type AdamWConfig } from "../../native/reference/optim.ts";
import { tensorLayout } from "../../native/reference/train.ts";
import { checkTensor, randomPacked, randomParams, rng, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { packSamples, Trainer } from "../../native/trainer.ts";

describe("AdamW", () => {
  it("three clipped steps with weight decay equal the reference (atol 1e-6 + rtol 1e-5)", async () => {
    const cfg = tinyTrainConfig(true);
    const params = randomParams(cfg, 1);
    const batch = randomPacked([8, 6], cfg.vocab_size, 2);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const optim: AdamWConfig = { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, maxGradNorm: 0.5 };
    const ref = Float64Array.from(params);
    const state = newAdamWState(ref.length);
    const { tensors } = tensorLayout(cfg);
    const r = rng(3);
    for (let step = 1; step <= 3; step++) {
      const dl = Float32Array.from({ length: batch.tokens.length }, () => r() - 0.5);
      const de = Float32Array.from({ length: batch.tokens.length }, () => r() - 0.5);
      await t.backward(batch, 1, dl, de);
      const grads = Float64Array.from(await t.getGrads());
      // The reference steps from the native params so that only the optimizer is compared.
      ref.set(await t.getParams());
      const want = adamwStep(ref, grads, state, optim, tensors);
      const got = await t.applyGrads(optim);
      expect(got.step).toBe(step);
      expect(got.skipped).toBe(false);
      expect(Math.abs(got.gradNorm - want.gradNorm)).toBeLessThanOrEqual(1e-5 * want.gradNorm);
      expect(got.clipCoef).toBeLessThan(1); // clipping was active
      expect(checkTensor(`params after step ${step}`, await t.getParams(), ref, 1e-6, 1e-5)).toBe("");
      expect((await t.getGrads()).every((g) => g === 0)).toBe(true); // applyGrads zeroes the grads
    }
    expect(t.info().step).toBe(3);
  });

  it("RMSNorm weights are not decayed: with zero gradients only matrices shrink", async () => {
    const cfg = tinyTrainConfig(false);
    const params = randomParams(cfg, 4);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.applyGrads({ lr: 0.1, weightDecay: 0.5 });
    const after = await t.getParams();
    for (const ts of tensorLayout(cfg).tensors) {
      const i = ts.offset;
      if (ts.shape.length === 1) expect(after[i]).toBe(params[i]);
      else expect(after[i]).toBeCloseTo(params[i]! * 0.95, 6);
    }
  });

  it("a non-finite gradient norm skips the update and reports it", async () => {
    const cfg = tinyTrainConfig(true);
    const params = randomParams(cfg, 5);
    const batch = randomPacked([4], cfg.vocab_size, 1);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.backward(batch, 1, Float32Array.from([0, NaN, 0, 0]), new Float32Array(4));
    const res = await t.applyGrads({ lr: 0.1 });
    expect(res.skipped).toBe(true);
    expect(Number.isFinite(res.gradNorm)).toBe(false);
    expect(res.step).toBe(0);
    expect(checkTensor("params", await t.getParams(), params, 0, 0)).toBe("");
  });
});

describe("optimizer state on disk", () => {
  it("a checkpoint saved with its optimizer resumes bit-identically; bad files are refused with the path", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ooze-optim-"));
    try {
      const cfg = tinyTrainConfig(true);
      const batch = packSamples([
        { tokens: Int32Array.from([1, 4, 6, 8, 10]), responseLength: 3, lossMask: Uint8Array.from([1, 1, 1]), rolloutLogprobs: null, advantage: 1 },
        { tokens: Int32Array.from([2, 3, 5, 7]), responseLength: 2, lossMask: Uint8Array.from([1, 1]), rolloutLogprobs: null, advantage: -1 },
      ]);
      const step = async (t: Trainer) => {
        const { logprobs } = await t.logprobs(batch);
        return t.trainStep({ ...batch, oldLogprobs: logprobs.map((v) => v - 0.05) }, {}, { lr: 1e-2, weightDecay: 0.01 });
      };
      const a = await Trainer.create({ config: cfg, params: null, seed: 9 });
      await step(a);
      await step(a);
      await a.save(join(dir, "ck"), "v2", { optimizer: true });
      const b = await Trainer.create({ modelDir: join(dir, "ck") });
      expect(b.info().step).toBe(2);
      await step(a);
      await step(b);
      expect(checkTensor("resumed params", await b.getParams(), await a.getParams(), 0, 0)).toBe("");
      // Without optimizer.bin the state starts fresh.
      await a.save(join(dir, "plain"), "v3");
      expect((await b.load(join(dir, "plain"))).optimizerStep).toBeNull();
      expect(b.info().step).toBe(0);
      writeFileSync(join(dir, "bad.bin"), "not an optimizer state");
      await expect(b.loadOptimizer(join(dir, "bad.bin"))).rejects.toThrow(/bad.bin: not an ooze optimizer state/);
      const other = await Trainer.create({ config: tinyTrainConfig(false), params: null, seed: 1 });
      await other.saveOptimizer(join(dir, "other.bin"));
      await expect(b.loadOptimizer(join(dir, "other.bin"))).rejects.toThrow(/parameters, the model has/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("overfitting a fixed batch", () => {
  it("on-policy PPO with positive advantages raises the response logprobs step after step", async () => {
    const cfg = tinyTrainConfig(false, 31);
    const t = await Trainer.create({ config: cfg, params: null, seed: 42 });
    const r = rng(8);
    const sample = (n: number, p: number) => ({
      tokens: Int32Array.from({ length: n }, () => Math.floor(r() * cfg.vocab_size)),
      responseLength: n - p,
      lossMask: Uint8Array.from({ length: n - p }, (_, i) => (i === 2 ? 0 : 1)), // one environment token
      rolloutLogprobs: null,
      advantage: 1,
    });
    const batch = packSamples([sample(12, 4), sample(9, 3), sample(15, 5)]);
    const meanResponseLogprob = (lp: Float32Array): number => {
      let s = 0, n = 0;
      for (let i = 0; i < lp.length; i++) if (batch.lossMask[i]) (s += lp[i]!), n++;
      return s / n;
    };
    const history: number[] = [];
    for (let step = 0; step < 8; step++) {
      const { logprobs } = await t.logprobs(batch);
      history.push(meanResponseLogprob(logprobs));
      const m = await t.trainStep({ ...batch, oldLogprobs: logprobs }, { epsClip: 0.2 }, { lr: 3e-2, maxGradNorm: 1 });
      expect(m.ratioMean).toBeCloseTo(1, 5); // on-policy: old = current
      expect(m.loss).toBeCloseTo(-1, 5);
    }
    history.push(meanResponseLogprob((await t.logprobs(batch)).logprobs));
    for (let i = 1; i < history.length; i++) expect(history[i]!).toBeGreaterThan(history[i - 1]!);
    expect(history.at(-1)! - history[0]!).toBeGreaterThan(1);
  });
});

describe("trainStep in micro-batches", () => {
  it("splitting by microBatchTokens gives the same step as the whole batch (params atol 1e-6)", async () => {
    const cfg = tinyTrainConfig(false);
    const r = rng(31);
    const samples = [7, 12, 5, 9, 6].map((n, i) => ({
      tokens: Int32Array.from({ length: n }, () => Math.floor(r() * cfg.vocab_size)),
      responseLength: n - 2,
      lossMask: Uint8Array.from({ length: n - 2 }, () => (r() < 0.8 ? 1 : 0)),
      rolloutLogprobs: null,
      advantage: i % 2 ? 0.7 : -0.4,
    }));
    const batch = packSamples(samples);
    for (const reduction of ["token", "sample"] as const) {
      const a = await Trainer.create({ config: cfg, params: null, seed: 2 });
      const b = await Trainer.create({ config: cfg, params: null, seed: 2 });
      const old = (await a.logprobs(batch)).logprobs.map((v) => v + 0.05);
      const whole = await a.trainStep({ ...batch, oldLogprobs: old }, { reduction }, { lr: 1e-2 });
      const split = await b.trainStep({ ...batch, oldLogprobs: old }, { reduction }, { lr: 1e-2 }, { microBatchTokens: 14 });
      expect(Math.abs(split.loss - whole.loss)).toBeLessThanOrEqual(1e-6);
      expect(Math.abs(split.gradNorm - whole.gradNorm)).toBeLessThanOrEqual(1e-5 * whole.gradNorm);
      expect(split.numTokens).toBe(whole.numTokens);
      expect(split.ratioMax).toBeCloseTo(whole.ratioMax, 6);
      expect(checkTensor(`params (${reduction})`, await b.getParams(), await a.getParams(), 1e-6, 1e-4)).toBe("");
    }
  });
});
