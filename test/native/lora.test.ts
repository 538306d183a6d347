// LoRA in the native trainer: forward and adapter gradients vs the float64 reference (which merges the
// adapter into the base and takes gradients by the chain rule), the reference vs finite differences,
// adapters written by Hugging Face PEFT (test/fixtures/peft-lora-tiny) vs the logits PEFT computed, the
// base frozen while the adapter trains, PEFT-format save/load, and clear errors for adapters that do
// not fit the base.
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig, LoraConfig } from "../../native/index.d.ts";
import { referenceLogprob } from "../../native/reference/model.ts";
import { loraScaling, referenceLoraForwardBackward, referenceLoraLayout } from "../../native/reference/lora.ts";
import { checkTensor, randomPacked, randomParams, randomUpstream, rng, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { Trainer } from "../../native/trainer.ts";

const fixtures = join(dirname(fileURLToPath(import.meta.url)), "..", "fixtures");
const TEMP = 0.9;
const ALL: LoraConfig["targets"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
const tmp = mkdtempSync(join(tmpdir(), "ooze-lora-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** Random adapter values (B nonzero, unlike PEFT's init, so the adapter changes the model). */
function randomAdapter(n: number, seed: number, scale = 0.3): Float32Array {
  const r = rng(seed);
  return Float32Array.from({ length: n }, () => scale * 2 * (r() - 0.5));
}

const configs: [string, LlamaHfConfig][] = [
  ["llama, untied, GQA", tinyTrainConfig(false)],
  ["qwen3 (q/k norm, head_dim 6)", { ...tinyTrainConfig(true), model_type: "qwen3", head_dim: 6 }],
  ["qwen2 (q/k/v biases)", { ...tinyTrainConfig(true), model_type: "qwen2" }],
];

describe.each(configs)("LoRA forward and backward, %s", (_label, cfg) => {
  const params = randomParams(cfg, 3);
  const batch = randomPacked([7, 1, 5], cfg.vocab_size, 8);
  const lora: LoraConfig = { rank: 3, alpha: 5, targets: ALL, rslora: false };
  const { numel } = referenceLoraLayout(cfg, lora);
  const adapter = randomAdapter(numel, 4);

  it("has PEFT's layout and names, and logprobs equal the merged reference's (atol 2e-5)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.setLora({ ...lora, params: adapter });
    const got = (await t.getLora())!;
    const want = referenceLoraLayout(cfg, lora).slots.flatMap((s) => [s.A, s.B]);
    expect(got.tensors).toEqual(want);
    expect(got.config).toEqual(lora);
    const lp = await t.logprobs(batch, TEMP);
    const ref = referenceLoraForwardBackward(cfg, params, lora, adapter, batch, TEMP, null);
    expect(checkTensor("logprobs", lp.logprobs, ref.logprobs, 2e-5, 0)).toBe("");
    expect(checkTensor("entropy", lp.entropy, ref.entropy, 2e-5, 0)).toBe("");
  });

  it("the adapter's gradients equal the reference's (atol 3e-5 + rtol 1e-3); the base gets none", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.setLora({ ...lora, params: adapter });
    const { dl, de } = randomUpstream(batch.cuSeqlens, batch.tokens.length, 5);
    await t.backward(batch, TEMP, dl, de);
    const got = (await t.getLora())!.grads;
    const ref = referenceLoraForwardBackward(cfg, params, lora, adapter, batch, TEMP, { dLogprobs: dl, dEntropy: de });
    expect(checkTensor("adapter grads", got, ref.grads!, 3e-5, 1e-3)).toBe("");
    await expect(t.getGrads()).rejects.toThrow(/base is frozen/);
  });
});

describe("the LoRA reference's gradients vs central finite differences (float64)", () => {
  it("sampled coordinates of every A and B agree to 1e-6 relative, rsLoRA scaling", () => {
    const cfg = tinyTrainConfig(false, 13);
    const params = Float64Array.from(randomParams(cfg, 9));
    const lora: LoraConfig = { rank: 2, alpha: 3, targets: ["q_proj", "v_proj", "o_proj", "down_proj"], rslora: true };
    const layout = referenceLoraLayout(cfg, lora);
    const adapter = Float64Array.from(randomAdapter(layout.numel, 6));
    const batch = randomPacked([5, 6], cfg.vocab_size, 3);
    const { dl, de } = randomUpstream(batch.cuSeqlens, batch.tokens.length, 2);
    const f = (a: Float64Array): number => {
      const r = referenceLoraForwardBackward(cfg, params, lora, a, batch, TEMP, null);
      let s = 0;
      for (let i = 0; i < dl.length; i++) s += dl[i]! * r.logprobs[i]! + de[i]! * r.entropy[i]!;
      return s;
    };
    const grads = referenceLoraForwardBackward(cfg, params, lora, adapter, batch, TEMP, { dLogprobs: dl, dEntropy: de }).grads!;
    const r = rng(1);
    const bad: string[] = [];
    for (const slot of layout.slots)
      for (const ts of [slot.A, slot.B]) {
        const n = ts.shape[0]! * ts.shape[1]!;
        for (let k = 0; k < 2; k++) {
          const i = ts.offset + Math.floor(r() * n), h = 1e-5;
          const a1 = adapter.slice(), a2 = adapter.slice();
          a1[i]! += h;
          a2[i]! -= h;
          const fd = (f(a1) - f(a2)) / (2 * h);
          if (Math.abs(fd - grads[i]!) / Math.max(1e-4, Math.abs(fd)) > 1e-6) bad.push(`${ts.name}[${i - ts.offset}]: ${grads[i]} vs fd ${fd}`);
        }
      }
    expect(bad).toEqual([]);
    expect(loraScaling(lora)).toBeCloseTo(3 / Math.SQRT2, 12);
  });
});

describe("adapters written by Hugging Face PEFT", () => {
  const dir = join(fixtures, "peft-lora-tiny");
  const expected = JSON.parse(readFileSync(join(dir, "expected.json"), "utf8")) as {
    input_ids: number[];
    vocab_size: number;
    base_logits: number[];
    adapters: Record<string, { logits: number[]; scaling: number }>;
  };
  const ids = Int32Array.from(expected.input_ids);
  const batch = { tokens: ids, cuSeqlens: new Int32Array([0, ids.length]) };
  const V = expected.vocab_size;

  /** PEFT's logprob of each next token from its logits. */
  const peftLogprobs = (logits: number[]) => {
    const l = Float32Array.from(logits), out = new Float64Array(ids.length);
    for (let i = 1; i < ids.length; i++) out[i] = referenceLogprob(l, V, i - 1, ids[i]!);
    return out;
  };

  it.each(["adapter-all", "adapter-qv-rslora"])("%s loads over the base and gives PEFT's logprobs (atol 2e-5)", async (name) => {
    const t = await Trainer.create({ modelDir: join(fixtures, "hf-llama-tiny", "model") });
    const base = await t.logprobs(batch);
    expect(checkTensor("base logprobs", base.logprobs, peftLogprobs(expected.base_logits), 2e-5, 0)).toBe("");
    await t.loadLora(join(dir, name));
    const info = t.info().lora!;
    expect(loraScaling(info)).toBeCloseTo(expected.adapters[name]!.scaling, 6);
    const got = await t.logprobs(batch);
    const want = peftLogprobs(expected.adapters[name]!.logits);
    expect(checkTensor(`${name} logprobs`, got.logprobs, want, 2e-5, 0)).toBe("");
    // The adapter does change the model here, so the comparison above is not the base's again.
    let moved = 0;
    for (let i = 1; i < ids.length; i++) moved = Math.max(moved, Math.abs(want[i]! - base.logprobs[i]!));
    expect(moved).toBeGreaterThan(1e-3);
  });

  it("an adapter saved by ooze reads back identically and in PEFT's form", async () => {
    const t = await Trainer.create({ modelDir: join(fixtures, "hf-llama-tiny", "model") });
    await t.loadLora(join(dir, "adapter-all"));
    const before = (await t.getLora())!;
    const out = join(tmp, "saved");
    await t.saveLora(out, "7", "hf-llama-tiny");
    const cfg = JSON.parse(readFileSync(join(out, "adapter_config.json"), "utf8"));
    expect(cfg).toMatchObject({ peft_type: "LORA", task_type: "CAUSAL_LM", r: 4, lora_alpha: 8, bias: "none", use_rslora: false });
    expect([...cfg.target_modules].sort()).toEqual([...ALL].sort());
    const t2 = await Trainer.create({ modelDir: join(fixtures, "hf-llama-tiny", "model") });
    expect(await t2.loadLora(out)).toEqual({ weightVersion: "7" });
    const after = (await t2.getLora())!;
    expect(after.tensors).toEqual(before.tensors);
    expect(checkTensor("params", after.params, before.params, 0, 0)).toBe("");
  });

  it("an adapter that does not fit is refused with the file and the field or tensor", async () => {
    const t = await Trainer.create({ modelDir: join(fixtures, "hf-llama-tiny", "model") });
    const bad = (name: string, edit: (c: Record<string, unknown>) => void) => {
      const d = join(tmp, name);
      cpSync(join(dir, "adapter-all"), d, { recursive: true });
      const p = join(d, "adapter_config.json");
      const c = JSON.parse(readFileSync(p, "utf8"));
      edit(c);
      writeFileSync(p, JSON.stringify(c));
      return d;
    };
    await expect(t.loadLora(bad("rank", (c) => (c.r = 8)))).rejects.toThrow(/adapter_model\.safetensors: tensor '.*lora_A\.weight': shape \[4, \d+\] but the config needs \[8, \d+\]/);
    await expect(t.loadLora(bad("lm-head", (c) => (c.target_modules = ["q_proj", "lm_head"])))).rejects.toThrow(
      /adapter_config\.json: target_modules: 'lm_head' is not a Linear layer ooze adapts/,
    );
    await expect(t.loadLora(bad("fewer", (c) => (c.target_modules = ["q_proj"])))).rejects.toThrow(/_proj\.lora_A\.weight' is not part of a rank-4 adapter of this base and these target_modules/);
    await expect(t.loadLora(bad("dora", (c) => (c.use_dora = true)))).rejects.toThrow(/use_dora is set/);
    await expect(t.loadLora(join(tmp, "nowhere"))).rejects.toThrow(/adapter_config\.json: not found/);
    expect(t.info().lora).toBeNull(); // nothing half-loaded
  });
});

describe("training an adapter", () => {
  const cfg = tinyTrainConfig(false);
  const params = randomParams(cfg, 12);
  const batch = randomPacked([9, 6], cfg.vocab_size, 1);
  const T = batch.tokens.length;
  const train = {
    ...batch,
    lossMask: new Uint8Array(T).fill(1),
    advantages: new Float32Array(T).fill(1),
    oldLogprobs: new Float32Array(T),
    rolloutLogprobs: null,
    refLogprobs: null,
  };

  it("moves only the adapter, keeps AdamW state for the adapter alone, and raises the rewarded logprobs", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.setLora({ rank: 4, alpha: 8, targets: ["q_proj", "v_proj", "up_proj"], seed: 3 });
    const init = (await t.getLora())!;
    // PEFT's init: B = 0, so the adapter starts as a no-op; A uniform in ±1/√in.
    for (const ts of init.tensors) {
      const v = init.params.subarray(ts.offset, ts.offset + ts.shape[0]! * ts.shape[1]!);
      if (ts.name.endsWith("lora_B.weight")) expect(v.every((x) => x === 0)).toBe(true);
      else {
        const most = Math.max(...v.map(Math.abs)), bound = 1 / Math.sqrt(ts.shape[1]!);
        expect(most).toBeLessThanOrEqual(bound);
        expect(most).toBeGreaterThan(bound / 2);
      }
    }
    const start = await t.logprobs(train);
    train.oldLogprobs.set(start.logprobs);
    for (let s = 0; s < 8; s++) await t.trainStep(train, { epsClip: 10 }, { lr: 0.02 });
    expect(await t.getParams()).toEqual(params);
    const after = await t.logprobs(train);
    const sum = (a: Float32Array) => a.reduce((x, y) => x + y, 0);
    expect(sum(after.logprobs)).toBeGreaterThan(sum(start.logprobs));
    const info = t.info();
    expect(info.step).toBe(8);
    expect(info.lora).toMatchObject({ rank: 4, alpha: 8, rslora: false, numParams: init.params.length });
    const opt = join(tmp, "adapter-optim.bin");
    await t.saveOptimizer(opt);
    // The moments file holds the adapter's count: a full-model trainer cannot take it.
    const full = await Trainer.create({ config: cfg, params, seed: null });
    await expect(full.loadOptimizer(opt)).rejects.toThrow(/parameters/);
    const again = await Trainer.create({ config: cfg, params, seed: null });
    await again.setLora({ rank: 4, alpha: 8, targets: ["q_proj", "v_proj", "up_proj"], seed: 3 });
    expect(await again.loadOptimizer(opt)).toEqual({ step: 8 });
  });

  it("a checkpoint is a PEFT adapter directory over its base, with the adapter's optimizer state", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await t.setLora({ rank: 2, alpha: 4, targets: ["o_proj", "down_proj"], seed: 1 });
    for (let s = 0; s < 2; s++) await t.trainStep(train, {}, { lr: 0.01 });
    const dir = join(tmp, "ckpt");
    await t.save(dir, "2", { optimizer: true });
    // Built from params, the trainer has no base directory to name: the base is written beside the adapter, once.
    expect(JSON.parse(readFileSync(join(dir, "adapter_config.json"), "utf8")).base_model_name_or_path).toBe(join(dir, "base"));
    expect(existsSync(join(dir, "model.safetensors"))).toBe(false);
    const back = await Trainer.create({ modelDir: dir });
    expect(back.info().lora).toMatchObject({ rank: 2, alpha: 4, targets: ["o_proj", "down_proj"] });
    expect(back.info().step).toBe(2);
    expect(checkTensor("adapter", (await back.getLora())!.params, (await t.getLora())!.params, 0, 0)).toBe("");
    expect(await back.getParams()).toEqual(params);
    // A trainer loaded from a checkpoint names that base and writes no copy.
    await back.trainStep(train, {}, { lr: 0.01 });
    const next = join(tmp, "ckpt-3");
    await back.save(next, "3", { optimizer: true });
    expect(JSON.parse(readFileSync(join(next, "adapter_config.json"), "utf8")).base_model_name_or_path).toBe(join(dir, "base"));
    expect(existsSync(join(next, "base"))).toBe(false);
    expect((await (await Trainer.create({ modelDir: next })).load(next)).weightVersion).toBe("3");
  });

  it("refuses a bad adapter config with the field named", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    await expect(t.setLora({ rank: 0 })).rejects.toThrow(/setLora\.rank must be a positive integer/);
    await expect(t.setLora({ targets: ["q_proj", "embed_tokens" as never] })).rejects.toThrow(/setLora\.targets\[1\] 'embed_tokens'/);
    await expect(t.setLora({ rank: 2, targets: ["q_proj"], params: new Float32Array(3) })).rejects.toThrow(/params has 3 floats/);
    await expect(t.setLoraParams(new Float32Array(1))).rejects.toThrow(/no adapter/);
  });
});
