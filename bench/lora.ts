// LoRA benchmark (`npm run bench -- lora [--presets quickstart,small] [--rank 8] [--seqs N] [--len L]
// [--steps K]`): for each preset, what a weight sync of a rank-r adapter moves against a full
// checkpoint — the bytes of adapter_model.safetensors against model.safetensors, both written by the
// trainer (q/v, PEFT's and ooze's default targets for Llama, and all seven Linear layers) — and the native trainer's time per PPO step
// training the adapter over the frozen base against training the whole model, on the same batch, the
// two trainers' steps interleaved so that both see the same machine load (median over K steps after a
// warm-up). Progress on stderr; one JSON line last on stdout: lora_sync_vs_full (q/v),
// lora_all_sync_vs_full and lora_step_vs_full (all targets) per preset.
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initModelDir } from "../native/model-dir.ts";
import type { LoraConfig } from "../native/index.d.ts";
import { packSamples, Trainer } from "../native/trainer.ts";
import { mulberry32 } from "../src/random.ts";

const flag = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const presets = flag("presets", "quickstart,small").split(",");
const rank = Number(flag("rank", "8"));
const seqs = Number(flag("seqs", "8")), len = Number(flag("len", "96")), steps = Number(flag("steps", "6"));
const ALL: LoraConfig["targets"] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

const median = (a: number[]) => [...a].sort((p, q) => p - q)[Math.floor(a.length / 2)]!;
const dir = mkdtempSync(join(tmpdir(), "ooze-bench-lora-"));
const figures: Record<string, number> = {};
try {
  for (const preset of presets) {
    const model = join(dir, preset, "model");
    await initModelDir(preset, model, 0);
    const full = await Trainer.create({ modelDir: model });
    const lora = await Trainer.create({ modelDir: model });
    await lora.setLora({ rank, alpha: 2 * rank, targets: ALL, seed: 1 });
    const qv = await Trainer.create({ modelDir: model });
    await qv.setLora({ rank, alpha: 2 * rank, targets: ["q_proj", "v_proj"], seed: 1 });

    // Bytes a sync moves: the files each kind of trainer writes for the engines.
    await full.save(join(dir, preset, "full"));
    await lora.saveLora(join(dir, preset, "lora-all"));
    await qv.saveLora(join(dir, preset, "lora-qv"));
    const fullBytes = statSync(join(dir, preset, "full", "model.safetensors")).size;
    const allBytes = statSync(join(dir, preset, "lora-all", "adapter_model.safetensors")).size;
    const qvBytes = statSync(join(dir, preset, "lora-qv", "adapter_model.safetensors")).size;

    const r = mulberry32(1);
    const batch = packSamples(Array.from({ length: seqs }, (_, i) => ({
      tokens: Int32Array.from({ length: len }, () => Math.floor(r() * 256)),
      responseLength: len / 2, lossMask: new Uint8Array(len / 2).fill(1), rolloutLogprobs: null, advantage: (i % 3) - 1,
    })));
    const times: Record<"full" | "lora", number[]> = { full: [], lora: [] };
    const numParams = full.info().numParams;
    console.error(`lora bench: preset ${preset} (${(numParams / 1e6).toFixed(2)}M parameters; rank-${rank} adapter on all targets ${lora.info().lora!.numParams} parameters), ${seqs} × ${len} tokens per step, ${steps} timed steps after one warm-up`);
    for (let s = 0; s <= steps; s++)
      for (const [name, t] of (s % 2 === 0 ? [["full", full], ["lora", lora]] : [["lora", lora], ["full", full]]) as ["full" | "lora", Trainer][]) {
        const t0 = performance.now();
        await t.trainStep(batch, { epsClip: 0.2 }, { lr: 1e-4 });
        const ms = performance.now() - t0;
        if (s > 0) times[name].push(ms);
        console.error(`  step ${s}${s === 0 ? " (warm-up)" : ""} ${name}: ${ms.toFixed(0)} ms`);
      }
    const key = preset.replace(/[^a-z0-9]/gi, "_");
    figures[`${key}_lora_sync_vs_full`] = Number((qvBytes / fullBytes).toFixed(5));
    figures[`${key}_lora_all_sync_vs_full`] = Number((allBytes / fullBytes).toFixed(5));
    figures[`${key}_lora_step_vs_full`] = Number((median(times.lora) / median(times.full)).toFixed(3));
    figures[`${key}_full_step_ms`] = Math.round(median(times.full));
    console.error(`  ${preset}: adapter ${allBytes} B (q/v ${qvBytes} B) vs checkpoint ${fullBytes} B; step ${median(times.lora).toFixed(0)} vs ${median(times.full).toFixed(0)} ms`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(JSON.stringify({ bench: "lora", rank, seqs, len, steps, ...figures }));
