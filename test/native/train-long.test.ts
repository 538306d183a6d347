// Native training over sequences longer than one block of attention queries (train.cc runs attention
// as matmuls over blocks of 72 queries per sequence and kv head) against the float64 TypeScript
// reference: logprobs, entropies and every gradient, with full causal attention and with a sliding
// window (Mistral) narrower than a block, so that blocks start past a sequence's first key.
import { describe, expect, it } from "vitest";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { referenceForwardBackward } from "../../native/reference/train.ts";
import { checkGrads, checkTensor, randomPacked, randomParams, randomUpstream, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { Trainer } from "../../native/trainer.ts";

const LENGTHS = [170, 1, 75, 40]; // three blocks, one token, two blocks, one block
const TEMP = 0.9;

const configs: Array<[string, LlamaHfConfig]> = [
  ["llama (full causal attention)", { ...tinyTrainConfig(true), max_position_embeddings: 256 }],
  [
    "mistral (sliding window of 50)",
    { ...tinyTrainConfig(false), model_type: "mistral", sliding_window: 50, max_position_embeddings: 256 } as LlamaHfConfig,
  ],
];

describe.each(configs)("%s over multi-block sequences", (_name, cfg) => {
  const params = randomParams(cfg, 5, 0.3);
  const batch = randomPacked(LENGTHS, cfg.vocab_size, 6);
  const T = batch.tokens.length;

  it("logprobs and entropy equal the reference's (atol 2e-5)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const got = await t.logprobs(batch, TEMP);
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, null);
    expect(checkTensor("logprobs", got.logprobs, ref.logprobs, 2e-5, 0)).toBe("");
    expect(checkTensor("entropy", got.entropy, ref.entropy, 2e-5, 0)).toBe("");
  });

  it("every parameter's gradient equals the reference's (atol 3e-5 + rtol 1e-3)", async () => {
    const t = await Trainer.create({ config: cfg, params, seed: null });
    const { dl, de } = randomUpstream(batch.cuSeqlens, T, 7);
    await t.backward(batch, TEMP, dl, de);
    const got = await t.getGrads();
    const ref = referenceForwardBackward(cfg, params, batch, TEMP, { dLogprobs: dl, dEntropy: de });
    expect(checkGrads(cfg, got, ref.grads!, 3e-5, 1e-3)).toEqual([]);
  });
});
