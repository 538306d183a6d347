// `ooze model init`: writes a randomly initialised model directory (config.json + model.safetensors,
// a valid Hugging Face checkpoint) from a size preset of the embedded byte-level model, or of a real
// family's shape (--arch llama3|qwen2|qwen3 --size tiny|small|0.5b-shape) with its tokenizer copied in.
import type { Command } from "commander";

export function register(program: Command) {
  const model = program.command("model").description("create and inspect model directories");
  model
    .command("init")
    .description("write a randomly initialised model (config.json + model.safetensors)")
    .option("--preset <name>", "byte-level model size preset (tiny, quickstart, small, base100m)")
    .option("--arch <family>", "a real family's shape instead: llama3, qwen2 or qwen3")
    .option("--size <size>", "with --arch: tiny, small or 0.5b-shape", "tiny")
    .option("--tokenizer <dir>", "with --arch: a directory with the family's tokenizer.json and tokenizer_config.json, copied into the model")
    .requiredOption("--out <dir>", "output directory")
    .option("--seed <n>", "random seed", "0")
    .action(async (opts: { preset?: string; arch?: string; size: string; tokenizer?: string; out: string; seed: string }) => {
      const { initModelDir, initFamilyModelDir } = await import("../../../native/model-dir.ts");
      const { paramCount } = await import("../../../native/presets.ts");
      if (opts.preset && opts.arch) throw new Error("give --preset or --arch, not both");
      if (opts.arch) {
        const c = await initFamilyModelDir({ arch: opts.arch, size: opts.size, outDir: opts.out, seed: Number(opts.seed), tokenizerDir: opts.tokenizer ?? null });
        console.log(`wrote ${opts.out} (${opts.arch} ${opts.size}: ${(paramCount(c) / 1e6).toFixed(1)}M parameters, vocabulary ${c.vocab_size}${opts.tokenizer ? `, tokenizer from ${opts.tokenizer}` : ", no tokenizer: byte ids"})`);
        return;
      }
      if (opts.tokenizer) throw new Error("--tokenizer goes with --arch");
      const preset = opts.preset ?? "quickstart";
      await initModelDir(preset, opts.out, Number(opts.seed));
      console.log(`wrote ${opts.out} (preset ${preset})`);
    });
}
