// Variable batch size with the right normalisation (issue 12, part 4): a step whose prompts produced
// uneven numbers of episodes and each episode an uneven number of samples (agent segments) goes
// through the buffer (GroupBuffer: episode-weighted GRPO advantages) and the native trainer; the
// gradient equals the float64 reference of −(1/N)·Σ A_t ∇log π(t) over the N real (loss-mask 1)
// tokens of the whole step — no padding, no per-sample or per-prompt reweighting, nothing dropped —
// and micro-batching the step changes nothing.
import { describe, expect, it } from "vitest";
import { GroupBuffer } from "../../actors/buffer/groups.ts";
import { referenceForwardBackward, tensorLayout } from "../../native/reference/train.ts";
import { checkTensor, randomParams, rng, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { packSamples, Trainer } from "../../native/trainer.ts";
import { SampleBuilder, type Sample } from "../../src/sample.ts";

const cfg = tinyTrainConfig(true);
const params = randomParams(cfg, 5);

/** group → episodes → [segments] with the episode's reward: 3, 1 and 2 episodes; 1–3 segments each. */
const PLAN: { group: number; episodes: { reward: number; segments: number }[] }[] = [
  { group: 0, episodes: [{ reward: 1, segments: 1 }, { reward: 0, segments: 3 }, { reward: 0.5, segments: 2 }] },
  { group: 1, episodes: [{ reward: 1, segments: 1 }] }, // one episode: advantage 0, still trained on (tokens count in N)
  { group: 2, episodes: [{ reward: 0, segments: 1 }, { reward: 1, segments: 2 }] },
];

/** Samples of the plan: random prompts (2–5 tokens) and responses (model spans and tool spans of random lengths). */
function planSamples(): Sample[] {
  const r = rng(17);
  const id = () => Math.floor(r() * cfg.vocab_size);
  const out: Sample[] = [];
  let index = 0;
  for (const g of PLAN)
    g.episodes.forEach((e, k) => {
      for (let seg = 0; seg < e.segments; seg++) {
        const prompt = Array.from({ length: 2 + Math.floor(r() * 4) }, id);
        const b = new SampleBuilder(index++, g.group, `g${g.group}e${k}`, null, prompt);
        const turns = 1 + Math.floor(r() * 3);
        for (let t = 0; t < turns; t++) {
          const n = 1 + Math.floor(r() * 4);
          b.appendModel(Array.from({ length: n }, id), Array.from({ length: n }, () => 0), "0");
          if (t + 1 < turns) b.appendEnv(Array.from({ length: 1 + Math.floor(r() * 3) }, id));
        }
        out.push(b.build(e.reward, "completed"));
      }
    });
  return out;
}

/** Episode-level GRPO in float64, written out: mean and unbiased std over the group's episodes. */
function expectedAdvantage(group: number, episode: number): number {
  const rs = PLAN.find((g) => g.group === group)!.episodes.map((e) => e.reward);
  if (rs.length < 2) return 0;
  const m = rs.reduce((a, b) => a + b, 0) / rs.length;
  const sd = Math.sqrt(rs.reduce((a, b) => a + (b - m) ** 2, 0) / (rs.length - 1));
  return (rs[episode]! - m) / (sd + 1e-6);
}

describe("a step of uneven groups and episodes", () => {
  it("advantages are per episode (each episode counted once, whatever its segments) and the loss is normalised over the step's real tokens", async () => {
    const buf = new GroupBuffer({ batchGroups: PLAN.length, estimator: "grpo", dropZeroVariance: false, maxStaleness: null });
    const samples = planSamples();
    for (const s of samples) buf.add(s);
    for (const g of PLAN) buf.close(g.group, samples.filter((s) => s.groupIndex === g.group).length);
    const { batch } = buf.takeBatch(0);
    expect(batch!.samples).toHaveLength(samples.length); // every sample of every episode is in the step
    for (const s of batch!.samples) expect(s.advantage).toBeCloseTo(expectedAdvantage(s.groupIndex, Number(s.rolloutId.split("e")[1])), 12);

    // On-policy: old logprobs are the trainer's own, so the ratio is 1 and the PPO loss is −A·ratio.
    const trainer = await Trainer.create({ config: cfg, params, seed: null });
    const packed = packSamples(batch!.samples);
    const { logprobs } = await trainer.logprobs(packed, 1);
    packed.oldLogprobs = logprobs.slice();
    packed.rolloutLogprobs = logprobs.slice();
    const metrics = await trainer.accumulate(packed, { entropyCoef: 0, klCoef: 0, tisCap: null });
    const grads = await trainer.getGrads();

    // float64 reference: N = every loss-mask-1 token of the step; dL/dlogp_t = −A_t / N there, 0 elsewhere.
    let N = 0;
    for (const s of batch!.samples) for (const m of s.lossMask) N += m;
    const dl = new Float64Array(packed.tokens.length);
    let loss = 0;
    for (let t = 0; t < dl.length; t++)
      if (packed.lossMask[t]) {
        dl[t] = -packed.advantages[t]! / N;
        loss += -packed.advantages[t]! / N;
      }
    expect(metrics.numTokens).toBe(N);
    expect(metrics.numSamples).toBe(samples.length);
    expect(metrics.pgLoss).toBeCloseTo(loss, 5);
    const ref = referenceForwardBackward(cfg, params, packed, 1, { dLogprobs: dl, dEntropy: new Float64Array(dl.length) });
    const errors: string[] = [];
    for (const ts of tensorLayout(cfg).tensors) {
      const e = checkTensor(ts.name, grads.subarray(ts.offset, ts.offset + ts.numel), ref.grads!.subarray(ts.offset, ts.offset + ts.numel), 3e-5, 1e-3);
      if (e) errors.push(e);
    }
    expect(errors).toEqual([]);
  });

  it("micro-batches of the uneven step (whole sequences) give the unsplit step's weights", async () => {
    const buf = new GroupBuffer({ batchGroups: PLAN.length, estimator: "grpo", dropZeroVariance: false, maxStaleness: null });
    const samples = planSamples();
    for (const s of samples) buf.add(s);
    for (const g of PLAN) buf.close(g.group, samples.filter((s) => s.groupIndex === g.group).length);
    const packed = packSamples(buf.takeBatch(0).batch!.samples);
    const whole = await Trainer.create({ config: cfg, params, seed: null });
    const split = await Trainer.create({ config: cfg, params, seed: null });
    const optim = { lr: 1e-2, maxGradNorm: 1e9 };
    const a = await whole.trainStep(packed, {}, optim, { microBatchTokens: null });
    const b = await split.trainStep(packed, {}, optim, { microBatchTokens: 12 });
    expect(b.numTokens).toBe(a.numTokens);
    expect(checkTensor("params after the step", await split.getParams(), await whole.getParams(), 1e-6, 1e-4)).toBe("");
  });
});
