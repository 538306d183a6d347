// The model families ooze implements natively, against checkpoints and numbers written by Hugging Face
// transformers (test/fixtures/hf-families, made by its make_fixture.py): Llama 3 (llama3 rope scaling,
// untied), Qwen2 (q/k/v biases, tied, GQA ratio 3), Qwen3 (per-head q/k norms, head_dim ≠ hidden /
// heads, one kv head, yarn) and Mistral (sliding window shorter than the sequence). For each: the
// engine's and the trainer's logprobs of every next token within 1e-4 of transformers, the TS
// reference's too, and the gradient of a loss over logprobs and entropies (two packed sequences,
// temperature 0.9) within 1e-4 of torch autograd, relative to each tensor's largest entry.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { referenceLogits, referenceLogprob } from "../../native/reference/model.ts";
import { referenceForwardBackward } from "../../native/reference/train.ts";
import { Trainer } from "../../native/trainer.ts";

const fixture = join(dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "hf-families");
interface FamilyExpected { logprobs: number[][]; loss: number }
const expected = JSON.parse(readFileSync(join(fixture, "expected.json"), "utf8")) as {
  sequences: number[][]; vocab_size: number; temperature: number; a: number[][]; b: number[][];
} & Record<string, FamilyExpected>;
const FAMILIES = ["llama3", "qwen2", "qwen3", "mistral"] as const;
const V = expected.vocab_size;
const tmp = mkdtempSync(join(tmpdir(), "ooze-families-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** The two sequences packed, and the per-token upstream gradients aligned with them (0 at each first token). */
function packed(): { tokens: Int32Array; cuSeqlens: Int32Array; dl: Float32Array; de: Float32Array } {
  const tokens = Int32Array.from(expected.sequences.flat());
  const cu = [0];
  for (const s of expected.sequences) cu.push(cu[cu.length - 1]! + s.length);
  const dl = new Float32Array(tokens.length), de = new Float32Array(tokens.length);
  expected.sequences.forEach((s, k) => {
    for (let i = 1; i < s.length; i++) (dl[cu[k]! + i] = expected.a[k]![i - 1]!), (de[cu[k]! + i] = expected.b[k]![i - 1]!);
  });
  return { tokens, cuSeqlens: Int32Array.from(cu), dl, de };
}

function worstDiff(got: ArrayLike<number>, want: ArrayLike<number>): { worst: number; at: number } {
  let worst = 0, at = -1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i]! - want[i]!);
    if (!(d <= worst)) (worst = d), (at = i);
  }
  return { worst, at };
}

describe.each(FAMILIES)("%s written by transformers", (family) => {
  const native = loadNative();
  const dir = join(fixture, family);
  const want = expected[family]!;

  it("the engine and the TS reference give transformers' logprobs within 1e-4", () => {
    const engine = new native.Engine({ modelDir: dir });
    const m = native.loadModelDir(dir);
    try {
      expected.sequences.forEach((seq, k) => {
        const ids = Int32Array.from(seq);
        const logits = engine.forwardLogits(ids);
        const ref = referenceLogits(m.config, m.params, ids);
        const got = seq.slice(1).map((t, i) => referenceLogprob(logits, V, i, t));
        const refLp = seq.slice(1).map((t, i) => referenceLogprob(ref, V, i, t));
        const e = worstDiff(got, want.logprobs[k]!), r = worstDiff(refLp, want.logprobs[k]!);
        if (e.worst > 1e-4) console.error(`${family} seq ${k}: engine ${got[e.at]} vs transformers ${want.logprobs[k]![e.at]} at ${e.at}`);
        expect(e.worst).toBeLessThanOrEqual(1e-4);
        expect(r.worst).toBeLessThanOrEqual(1e-4);
      });
    } finally {
      engine.close();
    }
  });

  it("the trainer's logprobs and gradients match transformers and torch autograd (1e-4, relative per tensor)", async () => {
    const m = native.loadModelDir(dir);
    const grads = native.loadModelDir(join(dir, "grads"));
    const b = packed();
    const t = await Trainer.create({ config: m.config, params: m.params, seed: null });
    const fwd = await t.logprobs({ tokens: b.tokens, cuSeqlens: b.cuSeqlens }, 1);
    expected.sequences.forEach((seq, k) => {
      const got = Array.from(fwd.logprobs.subarray(b.cuSeqlens[k]! + 1, b.cuSeqlens[k]! + seq.length));
      expect(worstDiff(got, want.logprobs[k]!).worst).toBeLessThanOrEqual(1e-4);
    });
    await t.backward({ tokens: b.tokens, cuSeqlens: b.cuSeqlens }, expected.temperature, b.dl, b.de);
    const g = await t.getGrads();
    const bad: string[] = [];
    for (const tensor of grads.tensors) {
      const w = grads.params.subarray(tensor.offset, tensor.offset + tensor.shape.reduce((x, y) => x * y, 1));
      const got = g.subarray(tensor.offset, tensor.offset + w.length);
      let scale = 0;
      for (const v of w) scale = Math.max(scale, Math.abs(v));
      const { worst, at } = worstDiff(got, w);
      if (!(worst <= 1e-4 * scale)) bad.push(`${tensor.name}[${at}]: native ${got[at]} torch ${w[at]} (scale ${scale})`);
    }
    if (bad.length) console.error(`${family}: ${bad.length} tensors differ; ${bad.slice(0, 4).join("; ")}`);
    expect(bad).toEqual([]);
    expect(grads.tensors.map((x) => x.name)).toEqual(m.tensors.map((x) => x.name));
  });

  it("the TS reference's gradients match torch autograd too", () => {
    const m = native.loadModelDir(dir);
    const grads = native.loadModelDir(join(dir, "grads"));
    const b = packed();
    const ref = referenceForwardBackward(m.config, m.params, { tokens: b.tokens, cuSeqlens: b.cuSeqlens }, expected.temperature, { dLogprobs: b.dl, dEntropy: b.de });
    let worstRel = 0;
    for (const tensor of grads.tensors) {
      const n = tensor.shape.reduce((x, y) => x * y, 1);
      const w = grads.params.subarray(tensor.offset, tensor.offset + n);
      let scale = 0;
      for (const v of w) scale = Math.max(scale, Math.abs(v));
      worstRel = Math.max(worstRel, worstDiff(ref.grads!.subarray(tensor.offset, tensor.offset + n), w).worst / scale);
    }
    expect(worstRel).toBeLessThanOrEqual(1e-4);
  });

  it("a checkpoint ooze saves is the same family and loads to the same logits", () => {
    const m = native.loadModelDir(dir);
    const out = join(tmp, family);
    native.saveModelDir(out, m.config, m.params);
    const written = JSON.parse(readFileSync(join(out, "config.json"), "utf8")) as Record<string, unknown>;
    const original = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
    expect(written.model_type).toBe(original.model_type);
    expect(written.architectures).toEqual(original.architectures);
    const a = new native.Engine({ modelDir: dir }), c = new native.Engine({ modelDir: out });
    const ids = Int32Array.from(expected.sequences[0]!);
    expect(worstDiff(c.forwardLogits(ids), a.forwardLogits(ids)).worst).toBe(0);
    a.close(), c.close();
  });
});

describe("what the native model does not implement is refused with the field named", () => {
  const native = loadNative();
  const cases: [string, string, (c: Record<string, unknown>) => Record<string, unknown>, RegExp][] = [
    ["qwen2", "sliding", (c) => ({ ...c, use_sliding_window: true, sliding_window: 4 }), /use_sliding_window = true is not supported/],
    ["qwen3", "layer-types", (c) => ({ ...c, layer_types: ["full_attention", "sliding_attention"] }), /layer_types\[1\] 'sliding_attention' is not supported/],
    ["qwen3", "moe", (c) => ({ ...c, model_type: "qwen3_moe", num_experts: 8 }), /model_type 'qwen3_moe' is not supported \(llama, mistral, qwen2, qwen3\)/],
    ["llama3", "mlp-bias", (c) => ({ ...c, mlp_bias: true }), /mlp_bias = true is not supported/],
    ["llama3", "partial-rotary", (c) => ({ ...c, partial_rotary_factor: 0.5 }), /partial_rotary_factor other than 1 is not supported/],
    ["llama3", "longrope", (c) => ({ ...c, rope_parameters: { rope_theta: 5000, rope_type: "longrope", factor: 4 } }), /rope_parameters\.rope_type 'longrope' is not supported \(default, linear, llama3, yarn\)/],
    ["llama3", "gemma", (c) => ({ ...c, model_type: undefined, architectures: ["GemmaForCausalLM"] }), /model_type 'architectures\[0\] GemmaForCausalLM' is not supported/],
  ];
  it.each(cases)("%s with %s", (family, label, edit, message) => {
    const out = join(tmp, `${family}-${label}`);
    const m = native.loadModelDir(join(fixture, family));
    native.saveModelDir(out, m.config, m.params);
    const c = JSON.parse(readFileSync(join(fixture, family, "config.json"), "utf8")) as Record<string, unknown>;
    writeFileSync(join(out, "config.json"), JSON.stringify(edit(c)));
    expect(() => native.loadModelDir(out)).toThrow(message);
  });
});
