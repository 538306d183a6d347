// Native training forward/backward over packed sequences vs the float64 TypeScript reference; the
// reference's gradients vs central finite differences; packing isolation; and training-path logprobs
// vs the inference engine's for the same weights and tokens; checkpoint save/load.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { PRESETS } from "../../native/presets.ts";
import { referenceForwardBackward, tensorLayout } from "../../native/reference/train.ts";
import {
  checkGrads,
  checkTensor,
  maxAbsDiff,
  randomPacked,
  randomParams,
  randomUpstream,
  rng,
  tinyTrainConfig,
} from "../../native/reference/train-check.ts";
import { Trainer } from "../../native/trainer.ts";

const LENGTHS = [6, 1, 9, 4]; // includes a one-token sequence (no logprob at all)
const TEMP = 0.8;

/** Random upstream gradients at every position that has a logprob (not a sequence's first token). */
const upstream = randomUpstream;

describe.each([
  ["tied lm_head", true],
  ["untied lm_head", false],
])("native train forward/backward (%s)", (_label, tied) => {
  const cfg = tinyTrainConfig(tied);
  const params = randomParams(cfg, 7);
  const batch = randomPacked(LENGTHS, cfg.vocab_size, 11);

  it("logprobs and entropy equal the reference's (atol 2e-5)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const got = await t.logprobs(batch, TEMP);
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, null);
    expect(checkTensor("logprobs", got.logprobs, ref.logprobs, 2e-5, 0)).toBe("");
    expect(checkTensor("entropy", got.entropy, ref.entropy, 2e-5, 0)).toBe("");
    // First token of every sequence has no logprob.
    for (let s = 0; s + 1 < batch.cuSeqlens.length; s++) expect(got.logprobs[batch.cuSeqlens[s]!]).toBe(0);
  });

  it("every parameter's gradient equals the reference's (atol 3e-5 + rtol 1e-3)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const { dl, de } = upstream(batch.cuSeqlens, batch.tokens.length, 3);
    await t.backward(batch, TEMP, dl, de);
    const got = await t.getGrads();
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, { dLogprobs: dl, dEntropy: de });
    expect(checkGrads(cfg, got, ref.grads!, 3e-5, 1e-3)).toEqual([]);
    // Gradients accumulate across calls.
    await t.backward(batch, TEMP, dl, de);
    const twice = await t.getGrads();
    expect(checkTensor("2x grads", twice, got.map((v) => 2 * v), 1e-6, 1e-5)).toBe("");
  });

  it("packed sequences do not see each other: logprobs equal each sequence run alone", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const packed = await t.logprobs(batch, TEMP);
    for (let s = 0; s + 1 < batch.cuSeqlens.length; s++) {
      const a = batch.cuSeqlens[s]!, b = batch.cuSeqlens[s + 1]!;
      const alone = await t.logprobs({ tokens: batch.tokens.slice(a, b), cuSeqlens: new Int32Array([0, b - a]) }, TEMP);
      expect(maxAbsDiff(packed.logprobs.subarray(a, b), alone.logprobs)).toBeLessThanOrEqual(1e-6);
    }
  });
});

describe("reference gradients vs central finite differences (float64)", () => {
  it.each([true, false])("tied=%s: sampled coordinates of every tensor agree to 1e-6 relative", (tied) => {
    const cfg = tinyTrainConfig(tied, 13);
    const p32 = randomParams(cfg, 5);
    const params = Float64Array.from(p32);
    const batch = randomPacked([5, 7], cfg.vocab_size, 2);
    const { dl, de } = upstream(batch.cuSeqlens, batch.tokens.length, 9);
    const du = upstream(batch.cuSeqlens, batch.tokens.length, 10).dl; // the uniform cross-entropy's upstream
    const f = (p: Float64Array): number => {
      const r = referenceForwardBackward(cfg, p, batch, TEMP, null);
      let s = 0;
      for (let i = 0; i < dl.length; i++) s += dl[i]! * r.logprobs[i]! + de[i]! * r.entropy[i]! + du[i]! * r.uniformCe[i]!;
      return s;
    };
    const grads = referenceForwardBackward(cfg, params, batch, TEMP, { dLogprobs: dl, dEntropy: de, dUniform: du }).grads!;
    const r = rng(17);
    const bad: string[] = [];
    for (const ts of tensorLayout(cfg).tensors) {
      for (let k = 0; k < 3; k++) {
        let i = ts.offset + Math.floor(r() * ts.numel);
        if (ts.name.includes("embed_tokens")) i = ts.offset + batch.tokens[k]! * cfg.hidden_size + k; // a used row
        const h = 1e-5;
        const p1 = params.slice(), p2 = params.slice();
        p1[i]! += h;
        p2[i]! -= h;
        const fd = (f(p1) - f(p2)) / (2 * h);
        const err = Math.abs(fd - grads[i]!) / Math.max(1e-4, Math.abs(fd));
        if (err > 1e-6) bad.push(`${ts.name}[${i - ts.offset}]: analytic ${grads[i]} vs fd ${fd}`);
      }
    }
    expect(bad).toEqual([]);
  });
});

describe("training path vs inference path", () => {
  it.each([
    ["a tied GQA toy", tinyTrainConfig(true, 37), [12, 7]],
    ["the tiny preset", PRESETS.tiny, [40, 17]],
  ] as const)("logprobs equal the engine's forwardLogits log-softmax for the same weights, %s (max abs diff <= 1e-5)", async (_label, cfg, lengths) => {
    const addon = loadNative();
    const params = randomParams(cfg, 21, 0.1);
    const batch = randomPacked([...lengths], cfg.vocab_size, 4);
    const t = await Trainer.create({ config: cfg, params, seed: null });
    for (const temp of [1, 0.7]) {
      const got = await t.logprobs(batch, temp);
      const engine = new addon.Engine({ config: cfg, params, cacheTokens: 128 });
      try {
        let worst = 0;
        for (let s = 0; s + 1 < batch.cuSeqlens.length; s++) {
          const a = batch.cuSeqlens[s]!, b = batch.cuSeqlens[s + 1]!;
          const logits = engine.forwardLogits(batch.tokens.slice(a, b));
          const V = cfg.vocab_size;
          for (let i = a + 1; i < b; i++) {
            const row = logits.subarray((i - 1 - a) * V, (i - a) * V);
            let mx = -Infinity;
            for (const z of row) mx = Math.max(mx, z / temp);
            let sum = 0;
            for (const z of row) sum += Math.exp(z / temp - mx);
            const lp = row[batch.tokens[i]!]! / temp - mx - Math.log(sum);
            worst = Math.max(worst, Math.abs(lp - got.logprobs[i]!));
          }
        }
        expect(worst).toBeLessThanOrEqual(1e-5);
      } finally {
        engine.close();
      }
    }
  });
});

describe("batch validation", () => {
  it("rejects bad offsets and out-of-vocabulary ids with a message that says what is wrong", async () => {
    const cfg = tinyTrainConfig(true);
    const t = await Trainer.create({ config: cfg, params: null, seed: 1 });
    await expect(t.logprobs({ tokens: new Int32Array([1, 2, 3]), cuSeqlens: new Int32Array([0, 2]) })).rejects.toThrow(/end at the number of tokens/);
    await expect(t.logprobs({ tokens: new Int32Array([1, 99]), cuSeqlens: new Int32Array([0, 2]) })).rejects.toThrow(/outside the vocabulary/);
    // The trainer still works after a rejected call.
    const ok = await t.logprobs({ tokens: new Int32Array([1, 2]), cuSeqlens: new Int32Array([0, 2]) });
    expect(ok.logprobs.length).toBe(2);
  });
});

describe("checkpoints", () => {
  it("save(dir) then Trainer.create({modelDir}) gives the same params and logprobs; initModelDir dirs load too", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ooze-train-ckpt-"));
    try {
      const cfg = tinyTrainConfig(false);
      const params = randomParams(cfg, 8);
      const t = await Trainer.create({ config: cfg, params, seed: null });
      await t.save(join(dir, "a"), "v7");
      const u = await Trainer.create({ modelDir: join(dir, "a") });
      expect(checkTensor("params", await u.getParams(), params, 0, 0)).toBe("");
      expect(await u.load(join(dir, "a"))).toEqual({ weightVersion: "v7", optimizerStep: null, valueHead: false });
      const batch = randomPacked([5, 7], cfg.vocab_size, 3);
      expect(checkTensor("logprobs", (await u.logprobs(batch)).logprobs, (await t.logprobs(batch)).logprobs, 0, 0)).toBe("");
      await initModelDir("tiny", join(dir, "b"), 5);
      const v = await Trainer.create({ modelDir: join(dir, "b") });
      expect(v.info().config.hidden_size).toBe(64);
      await expect(Trainer.create({ modelDir: join(dir, "missing") })).rejects.toThrow(/missing/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
