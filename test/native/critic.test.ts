// The critic: the clipped value loss (native vs the TypeScript reference, hand-computed cases, and the
// reference's gradient vs float64 finite differences), the value head on the shared trunk (native
// values and gradients — head and every trunk tensor — vs the float64 reference, the reference vs
// central finite differences), accumulate = value loss through the head and the trunk, AdamW over
// policy and head, and the head's file beside an unchanged HF checkpoint.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { referenceForwardBackward, tensorLayout } from "../../native/reference/train.ts";
import { checkTensor, randomPacked, randomParams, rng, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { Trainer, VALUE_HEAD_FILE } from "../../native/trainer.ts";
import { valueLoss, type ValueLossConfig } from "../../src/algorithms/value-loss.ts";

const TEMP = 0.9;
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** Uneven sequences with prompt (mask 0), model and environment tokens; values/old/returns random. */
function valueInputs(seed: number) {
  const r = rng(seed);
  const lengths = [7, 1, 12, 4];
  const cu = new Int32Array(lengths.length + 1);
  lengths.forEach((n, i) => (cu[i + 1] = cu[i]! + n));
  const T = cu[lengths.length]!;
  const lossMask = new Uint8Array(T), values = new Float32Array(T), oldValues = new Float32Array(T), returns = new Float32Array(T);
  for (let t = 0; t < T; t++) {
    lossMask[t] = r() < 0.6 ? 1 : 0;
    oldValues[t] = 2 * r() - 1;
    values[t] = oldValues[t]! + (r() - 0.5) * 0.8; // some inside ±0.2, some outside
    returns[t] = 2 * r() - 1;
  }
  return { cuSeqlens: cu, lossMask, values, oldValues, returns };
}

describe("value loss", () => {
  it("hand-computed: the clipped term binds only outside old ± clip, where it has no gradient", () => {
    const cfg: ValueLossConfig = { valueCoef: 1, valueClip: 0.2, reduction: "token", normalizer: null };
    const one = (v: number, old: number, R: number) =>
      valueLoss(cfg, { cuSeqlens: new Int32Array([0, 1]), lossMask: [1], values: [v], oldValues: [old], returns: [R] });
    // V moved away from R beyond the clip: unclipped (V−R)²/2 is larger, gradient V − R.
    let r = one(1.0, 0.5, 0);
    expect(r.loss).toBeCloseTo(0.5, 12);
    expect(r.dValues[0]).toBeCloseTo(1.0, 12);
    expect(r.metrics.valueClipfrac).toBe(0);
    // V moved toward R beyond the clip: clipped (0.7 − 1)²/2 = 0.045 is larger, no gradient.
    r = one(0.9, 0.5, 1);
    expect(r.loss).toBeCloseTo(0.045, 12);
    expect(r.dValues[0]).toBe(0);
    expect(r.metrics.valueClipfrac).toBe(1);
    // Inside the band both terms agree.
    r = one(0.6, 0.5, 1);
    expect(r.loss).toBeCloseTo(0.08, 12);
    expect(r.dValues[0]).toBeCloseTo(-0.4, 12);
  });

  it.each([
    ["token, clip 0.2", { valueCoef: 0.5, valueClip: 0.2, reduction: "token", normalizer: null }],
    ["sample, clip 0.1", { valueCoef: 1, valueClip: 0.1, reduction: "sample", normalizer: null }],
    ["token, unclipped, normalizer 40", { valueCoef: 2, valueClip: null, reduction: "token", normalizer: 40 }],
  ] as const)("native equals the reference (%s) within 1e-6", (_l, cfg) => {
    const addon = loadNative();
    for (const seed of [1, 2, 3]) {
      const x = valueInputs(seed);
      const ref = valueLoss(cfg, x);
      const got = addon.valueLoss(x, cfg);
      expect(Math.abs(got.metrics.valueLoss - ref.metrics.valueLoss)).toBeLessThanOrEqual(1e-6);
      expect(Math.abs(got.metrics.loss - ref.loss)).toBeLessThanOrEqual(1e-6);
      expect(Math.abs(got.metrics.valueClipfrac - ref.metrics.valueClipfrac)).toBeLessThanOrEqual(1e-9);
      expect(Math.abs(got.metrics.valueMean - ref.metrics.valueMean)).toBeLessThanOrEqual(1e-6);
      expect(checkTensor("dValues", got.dValues, ref.dValues, 1e-7, 1e-6)).toBe("");
    }
  });

  it("the reference's dValues equal central finite differences in float64 (away from the clip kinks)", () => {
    const cfg: ValueLossConfig = { valueCoef: 0.7, valueClip: 0.2, reduction: "sample", normalizer: null };
    const x = valueInputs(5);
    const v = Float64Array.from(x.values);
    const { dValues } = valueLoss(cfg, { ...x, values: v });
    const h = 1e-6;
    const bad: string[] = [];
    for (let t = 0; t < v.length; t++) {
      if (Math.abs(Math.abs(v[t]! - x.oldValues[t]!) - 0.2) < 1e-3) continue; // kink of the clip
      const p = v.slice(), m = v.slice();
      p[t]! += h;
      m[t]! -= h;
      const fd = (valueLoss(cfg, { ...x, values: p }).loss - valueLoss(cfg, { ...x, values: m }).loss) / (2 * h);
      if (Math.abs(fd - dValues[t]!) > 1e-8 + 1e-6 * Math.abs(fd)) bad.push(`[${t}] analytic ${dValues[t]} vs fd ${fd}`);
    }
    expect(bad).toEqual([]);
  });
});

describe.each([
  ["tied lm_head", true],
  ["untied lm_head", false],
])("value head on the shared trunk (%s)", (_label, tied) => {
  const cfg = tinyTrainConfig(tied);
  const params = randomParams(cfg, 7);
  const batch = randomPacked([6, 1, 9, 4], cfg.vocab_size, 11);
  const head = Float32Array.from({ length: cfg.hidden_size + 1 }, (_, i) => Math.sin(i + 1) * 0.5);

  it("values equal the reference's (atol 2e-5), 0 at sequence starts; none without a head", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    expect((await t.logprobs(batch, TEMP)).values).toBeNull();
    await t.setValueHead(head);
    const got = await t.logprobs(batch, TEMP);
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, null, head);
    expect(checkTensor("values", got.values!, ref.values!, 2e-5, 0)).toBe("");
    expect(checkTensor("logprobs", got.logprobs, ref.logprobs, 2e-5, 0)).toBe("");
    for (let s = 0; s + 1 < batch.cuSeqlens.length; s++) expect(got.values![batch.cuSeqlens[s]!]).toBe(0);
  });

  it("dValues reach the head and every trunk tensor as in the reference (atol 3e-5 + rtol 1e-3)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.setValueHead(head);
    const T = batch.tokens.length, r = rng(3);
    const zeros = new Float32Array(T);
    const dv = Float32Array.from({ length: T }, () => r() - 0.5);
    await t.backward(batch, TEMP, zeros, zeros, dv);
    const grads = await t.getGrads();
    const got = (await t.getValueHead())!;
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, { dLogprobs: zeros, dEntropy: zeros, dValues: dv }, head);
    const errors: string[] = [];
    for (const ts of tensorLayout(cfg).tensors) {
      const e = checkTensor(ts.name, grads.subarray(ts.offset, ts.offset + ts.numel), ref.grads!.subarray(ts.offset, ts.offset + ts.numel), 3e-5, 1e-3);
      if (e) errors.push(e);
    }
    const e = checkTensor("value_head", got.grads, ref.headGrads!, 3e-5, 1e-3);
    if (e) errors.push(e);
    expect(errors).toEqual([]);
    expect(ref.grads!.some((g) => Math.abs(g) > 1e-4)).toBe(true); // the trunk does receive the critic's gradient
  });

  it("accumulate with valueCoef adds exactly the value loss's gradient (dValues from the native loss, through backward)", async () => {
    const a = await Trainer.create({ config: cfg, params, seed: null });
    const b = await Trainer.create({ config: cfg, params, seed: null });
    await a.setValueHead(head);
    await b.setValueHead(head);
    const T = batch.tokens.length, r = rng(8);
    const lossMask = Uint8Array.from({ length: T }, (_, i) => (i % 3 === 0 ? 0 : 1));
    const { values } = await a.logprobs(batch, TEMP);
    const oldValues = values!.map((v) => v + (r() - 0.5) * 0.3), returns = Float32Array.from({ length: T }, () => 2 * r() - 1);
    const zeros = new Float32Array(T);
    const m = await a.accumulate(
      { ...batch, lossMask, advantages: zeros, oldLogprobs: zeros, rolloutLogprobs: null, refLogprobs: null, oldValues, returns },
      { temperature: TEMP, valueCoef: 0.5, valueClip: 0.2 },
    );
    const ref = valueLoss({ valueCoef: 0.5, valueClip: 0.2, reduction: "token", normalizer: null }, { cuSeqlens: batch.cuSeqlens, lossMask, values: values!, oldValues, returns });
    expect(Math.abs(m.valueLoss - ref.metrics.valueLoss)).toBeLessThanOrEqual(1e-6);
    expect(m.pgLoss).toBe(0);
    await b.backward(batch, TEMP, zeros, zeros, Float32Array.from(ref.dValues));
    expect(checkTensor("grads", await a.getGrads(), await b.getGrads(), 1e-7, 1e-4)).toBe("");
    expect(checkTensor("head grads", (await a.getValueHead())!.grads, (await b.getValueHead())!.grads, 1e-7, 1e-4)).toBe("");
  });
});

describe("value head reference vs central finite differences (float64)", () => {
  it("head and sampled trunk coordinates agree to 1e-6 relative", () => {
    const cfg = tinyTrainConfig(true, 13);
    const params = Float64Array.from(randomParams(cfg, 5));
    const head = Float64Array.from({ length: cfg.hidden_size + 1 }, (_, i) => Math.cos(i) * 0.4);
    const batch = randomPacked([5, 7], cfg.vocab_size, 2);
    const T = batch.tokens.length, r = rng(9);
    const dv = Float64Array.from({ length: T }, () => r() - 0.5), zeros = new Float64Array(T);
    const f = (p: Float64Array, hd: Float64Array) => {
      const v = referenceForwardBackward(cfg, p, batch, 1, null, hd).values!;
      return v.reduce((s, x, i) => s + x * dv[i]!, 0);
    };
    const ref = referenceForwardBackward(cfg, params, batch, 1, { dLogprobs: zeros, dEntropy: zeros, dValues: dv }, head);
    const h = 1e-5;
    const bad: string[] = [];
    for (let i = 0; i < head.length; i++) {
      const p = head.slice(), m = head.slice();
      p[i]! += h;
      m[i]! -= h;
      const fd = (f(params, p) - f(params, m)) / (2 * h);
      if (Math.abs(fd - ref.headGrads![i]!) / Math.max(1e-4, Math.abs(fd)) > 1e-6) bad.push(`head[${i}]: ${ref.headGrads![i]} vs fd ${fd}`);
    }
    for (const ts of tensorLayout(cfg).tensors) {
      for (let k = 0; k < 3; k++) {
        let i = ts.offset + Math.floor(r() * ts.numel);
        if (ts.name.includes("embed_tokens")) i = ts.offset + batch.tokens[k]! * cfg.hidden_size + k;
        const p = params.slice(), m = params.slice();
        p[i]! += h;
        m[i]! -= h;
        const fd = (f(p, head) - f(m, head)) / (2 * h);
        if (Math.abs(fd - ref.grads![i]!) / Math.max(1e-4, Math.abs(fd)) > 1e-6) bad.push(`${ts.name}[${i - ts.offset}]: ${ref.grads![i]} vs fd ${fd}`);
      }
    }
    expect(bad).toEqual([]);
  });
});

describe("critic training and checkpoints", () => {
  const cfg = tinyTrainConfig(true);
  const params = randomParams(cfg, 4, 0.1);
  const batch = randomPacked([8, 6, 10], cfg.vocab_size, 6);
  const T = batch.tokens.length;
  const lossMask = Uint8Array.from({ length: T }, (_, i) => (i % 4 === 0 ? 0 : 1));
  const returns = Float32Array.from({ length: T }, (_, i) => (batch.tokens[i]! % 3) - 1); // a target the state can predict
  const zeros = new Float32Array(T);

  it("AdamW over policy and head: repeated steps drive the value loss down; both move; one step count", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.ensureValueHead();
    expect(await t.ensureValueHead()).toBe(false); // already there
    const losses: number[] = [];
    for (let k = 0; k < 40; k++) {
      const { values } = await t.logprobs(batch, 1);
      const m = await t.trainStep(
        { ...batch, lossMask, advantages: zeros, oldLogprobs: zeros, rolloutLogprobs: null, refLogprobs: null, oldValues: values!, returns },
        { valueCoef: 1, valueClip: null }, { lr: 0.01 },
      );
      losses.push(m.valueLoss);
    }
    expect(losses.at(-1)!).toBeLessThan(losses[0]! * 0.5);
    const h = (await t.getValueHead())!;
    expect(h.step).toBe(40);
    expect(t.info().step).toBe(40);
    expect(h.params.some((x) => x !== 0)).toBe(true);
    const moved = await t.getParams();
    expect(moved.some((x, i) => x !== params[i])).toBe(true);
  });

  it("valueCoef without a head, or without returns, is a clear error", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const b = { ...batch, lossMask, advantages: zeros, oldLogprobs: zeros, rolloutLogprobs: null, refLogprobs: null, oldValues: zeros, returns };
    await expect(t.accumulate(b, { valueCoef: 1 })).rejects.toThrow(/no value head/);
    await t.ensureValueHead();
    await expect(t.accumulate({ ...b, returns: null }, { valueCoef: 1 })).rejects.toThrow(/oldValues and returns are required/);
  });

  it("save writes value_head.bin beside a plain HF checkpoint; load restores head and moments; a checkpoint without it loads without a head", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ooze-critic-"));
    dirs.push(dir);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.ensureValueHead();
    await t.trainStep(
      { ...batch, lossMask, advantages: zeros, oldLogprobs: zeros, rolloutLogprobs: null, refLogprobs: null, oldValues: zeros, returns },
      { valueCoef: 1 }, { lr: 0.01 },
    );
    await t.save(join(dir, "a"), "1", { optimizer: true });
    expect(existsSync(join(dir, "a", VALUE_HEAD_FILE))).toBe(true);
    // the HF files know nothing of the critic
    const st = readFileSync(join(dir, "a", "model.safetensors"));
    const header = st.subarray(8, 8 + Number(st.readBigUInt64LE(0))).toString();
    expect(header).not.toMatch(/value/);
    expect(loadNative().loadModelDir(join(dir, "a")).tensors.map((x) => x.name)).toEqual(t.info().tensors.map((x) => x.name));
    const u = await Trainer.create({ modelDir: join(dir, "a") });
    const a = (await t.getValueHead())!, b = (await u.getValueHead())!;
    expect(Array.from(b.params)).toEqual(Array.from(a.params));
    expect(b.step).toBe(1);
    const plain = await Trainer.create({ config: cfg, params, seed: null });
    await plain.save(join(dir, "b"));
    expect(existsSync(join(dir, "b", VALUE_HEAD_FILE))).toBe(false);
    await u.load(join(dir, "b"));
    expect(await u.getValueHead()).toBeNull();
  });
});
