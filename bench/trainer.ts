// Trainer benchmark (`npm run bench -- trainer [--preset P | --arch A --size S] [--seqs N] [--len L]
// [--steps K] [--threads T] [--dtypes fp32,bf16]`): training tokens/s of the native worker and of the
// PyTorch worker (python/ooze_torch, CPU) on the same model directory and the same batch, one PPO-clip
// trainStep at a time, the workers' steps interleaved so that both see the same machine load. Both get
// T threads (OMP_NUM_THREADS for the native one, torch.set_num_threads for torch; default 2). The
// figure is the median step's tokens/s; the ratio torch_vs_native is taken within the run.
// Progress on stderr; one JSON line last on stdout.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initFamilyModelDir, initModelDir } from "../native/model-dir.ts";
import { paramCount } from "../native/presets.ts";
import { packSamples } from "../native/trainer.ts";
import { TrainerWorker } from "../native/worker/client.ts";
import { ensureTorchEnv, torchWorkerCommand } from "../native/worker/torch-env.ts";
import { mulberry32 } from "../src/random.ts";

const flag = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const arch = flag("arch", ""), size = flag("size", "small"), preset = flag("preset", "small");
const seqs = Number(flag("seqs", "16")), len = Number(flag("len", "128")), steps = Number(flag("steps", "6"));
const threads = Number(flag("threads", "2"));
const dtypes = flag("dtypes", "fp32").split(",") as ("fp32" | "bf16")[];

const dir = mkdtempSync(join(tmpdir(), "ooze-bench-trainer-"));
try {
  const model = join(dir, "model");
  const config = arch
    ? await initFamilyModelDir({ arch, size, outDir: model, seed: 0, tokenizerDir: null })
    : (await initModelDir(preset, model, 0), null);
  const label = arch ? `${arch} ${size}` : `preset ${preset}`;
  const r = mulberry32(1);
  const vocab = config?.vocab_size ?? 256;
  const batch = packSamples(Array.from({ length: seqs }, (_, i) => ({
    tokens: Int32Array.from({ length: len }, () => Math.floor(r() * vocab)),
    responseLength: len / 2, lossMask: new Uint8Array(len / 2).fill(1), rolloutLogprobs: null, advantage: (i % 3) - 1,
  })));
  const python = await ensureTorchEnv((l) => console.error(`[torch setup] ${l}`));
  const workers: { name: string; w: TrainerWorker; times: number[] }[] = [];
  workers.push({ name: "native", w: await TrainerWorker.start({ source: { modelDir: model }, env: { OMP_NUM_THREADS: String(threads) } }), times: [] });
  for (const dtype of dtypes)
    workers.push({ name: `torch_${dtype}`, w: await TrainerWorker.start({ source: { modelDir: model }, command: torchWorkerCommand(python, { device: "cpu", dtype, gpus: 1, gradientCheckpointing: false, threads }) }), times: [] });
  const params = (await workers[0]!.w.info()).numParams;
  console.error(`trainer bench: ${label} (${(params / 1e6).toFixed(2)}M parameters${config ? `, ${paramCount(config)} counted` : ""}), ${seqs} × ${len} tokens per step, ${threads} threads, ${steps} timed steps after one warm-up`);
  for (let s = 0; s <= steps; s++)
    for (const x of workers) {
      const t0 = performance.now();
      await x.w.trainStep(batch, { epsClip: 0.2 }, { lr: 1e-5 });
      const ms = performance.now() - t0;
      if (s > 0) x.times.push(ms);
      console.error(`  step ${s}${s === 0 ? " (warm-up)" : ""} ${x.name}: ${ms.toFixed(0)} ms`);
    }
  for (const x of workers) await x.w.close();
  const median = (a: number[]) => [...a].sort((p, q) => p - q)[Math.floor(a.length / 2)]!;
  const tokens = batch.tokens.length;
  const tps = Object.fromEntries(workers.map((x) => [`${x.name}_tokens_per_s`, Math.round((tokens / median(x.times)) * 1000)]));
  const native = tps["native_tokens_per_s"]!;
  const ratios = Object.fromEntries(dtypes.map((d) => [`torch_${d}_vs_native`, Number((tps[`torch_${d}_tokens_per_s`]! / native).toFixed(3))]));
  console.log(JSON.stringify({ bench: "trainer", model: label, params, tokens_per_step: tokens, threads, steps, ...tps, ...ratios }));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
