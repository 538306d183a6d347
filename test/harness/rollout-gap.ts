// On-policy checks of a training run: how far the logprobs the engines returned for sampled tokens
// are from what the trainer computes for them under a given checkpoint (a model, or a LoRA adapter
// over its base).
import { packSamples, Trainer } from "../../native/trainer.ts";
import type { Sample } from "../../src/sample.ts";

/** The largest |trainer logprob − rollout logprob| over the samples' model tokens, under the checkpoint in `modelDir`. */
export async function rolloutLogprobGap(modelDir: string, samples: readonly Sample[]): Promise<number> {
  const packed = packSamples(samples.map((s) => ({ tokens: s.tokens, responseLength: s.responseLength, lossMask: s.lossMask, rolloutLogprobs: s.rolloutLogprobs, advantage: 0 })));
  const lp = (await (await Trainer.create({ modelDir })).logprobs(packed)).logprobs;
  let worst = 0;
  for (let i = 0; i < lp.length; i++) if (packed.lossMask[i]) worst = Math.max(worst, Math.abs(lp[i]! - packed.rolloutLogprobs![i]!));
  return worst;
}
