// A checkpoint written by Hugging Face transformers (test/fixtures/hf-llama-tiny, made by its
// make_fixture.py: bfloat16 weights, transformers-5 config with rope_parameters, GQA, untied head,
// rope_theta 5000, eps 1e-6) loads and gives the logits transformers computed for it.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { referenceArgmax, referenceLogits } from "../../native/reference/model.ts";

const fixture = join(dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "hf-llama-tiny");
const expected = JSON.parse(readFileSync(join(fixture, "expected.json"), "utf8")) as {
  input_ids: number[];
  vocab_size: number;
  logits: number[];
};

function firstDiffs(got: ArrayLike<number>, want: ArrayLike<number>, tol: number): string[] {
  const bad: string[] = [];
  for (let i = 0; i < want.length; i++)
    if (!(Math.abs(got[i]! - want[i]!) <= tol)) bad.push(`[${i}] got ${got[i]} want ${want[i]}`);
  return bad;
}

describe("a Hugging Face-written Llama checkpoint", () => {
  const native = loadNative();
  const model = join(fixture, "model");

  it("loads (BF16, rope_parameters) with the config transformers wrote", () => {
    const m = native.loadModelDir(model);
    expect(m.config).toMatchObject({ hidden_size: 32, num_key_value_heads: 2, rope_theta: 5000, tie_word_embeddings: false });
    expect(m.config.rms_norm_eps).toBeCloseTo(1e-6, 12);
  });

  it("the native engine and the TS reference give transformers' logits within 1e-4", async () => {
    const ids = Int32Array.from(expected.input_ids);
    const engine = new native.Engine({ modelDir: model });
    const got = engine.forwardLogits(ids);
    const bad = firstDiffs(got, expected.logits, 1e-4);
    if (bad.length) console.error(`native vs transformers: ${bad.length} differ; first: ${bad.slice(0, 5).join(", ")}`);
    expect(bad).toEqual([]);
    const m = native.loadModelDir(model);
    const ref = referenceLogits(m.config, m.params, ids);
    const badRef = firstDiffs(ref, expected.logits, 1e-4);
    if (badRef.length) console.error(`reference vs transformers: first: ${badRef.slice(0, 5).join(", ")}`);
    expect(badRef).toEqual([]);
    // Greedy decoding through the KV cache picks transformers' argmax at every position.
    const prefix = ids.subarray(0, 5);
    engine.add("g", prefix, { maxNewTokens: 1, temperature: 0, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: true, seed: 0 });
    const [ev] = await engine.step();
    expect(ev!.tokenId).toBe(referenceArgmax(Float32Array.from(expected.logits), expected.vocab_size, 4));
    engine.close();
  });
});
