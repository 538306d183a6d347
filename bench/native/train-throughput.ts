// Training tokens/s of the native trainer (forward + backward + PPO loss + AdamW) on a randomly
// initialised preset, for bench/native.ts: one warm-up step, then the median of `steps` timed steps
// over a fixed packed batch of `sequences` × `seqLen` tokens whose responses are all loss-masked.
import { PRESETS, type PresetName } from "../../native/presets.ts";
import { packSamples, Trainer } from "../../native/trainer.ts";

export interface TrainThroughput {
  preset: string;
  tokensPerStep: number;
  stepMs: number;
  tokensPerS: number;
}

export async function measureTraining(preset: PresetName, sequences: number, seqLen: number, steps: number): Promise<TrainThroughput> {
  const config = PRESETS[preset];
  const trainer = await Trainer.create({ config, params: null, seed: 1 });
  let s = 12345;
  const rand = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  const prompt = 16;
  const samples = Array.from({ length: sequences }, (_, i) => {
    const tokens = Int32Array.from({ length: seqLen }, () => rand() % 256);
    const resp = seqLen - prompt;
    return {
      tokens,
      responseLength: resp,
      lossMask: new Uint8Array(resp).fill(1),
      rolloutLogprobs: new Float32Array(resp).fill(-5.5),
      advantage: i % 2 === 0 ? 1 : -1,
    };
  });
  const batch = packSamples(samples);
  const optim = { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0, maxGradNorm: 1 };
  const loss = { epsClip: 0.2, epsClipHigh: 0.2, epsClipC: null, klCoef: 0, klType: "k3" as const, entropyCoef: 0, tisCap: null, reduction: "token" as const, normalizer: null, temperature: 1 };
  await trainer.trainStep(batch, loss, optim);
  const times: number[] = [];
  for (let i = 0; i < steps; i++) {
    const t0 = performance.now();
    await trainer.trainStep(batch, loss, optim);
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  const stepMs = times[Math.floor(times.length / 2)]!;
  const tokensPerStep = sequences * seqLen;
  return { preset, tokensPerStep, stepMs, tokensPerS: (tokensPerStep / stepMs) * 1000 };
}
