// `ooze model init --preset NAME --out DIR`: writes a randomly initialised Llama model directory
// (config.json + model.safetensors) that is a valid Hugging Face checkpoint.
import type { Command } from "commander";

export function register(program: Command) {
  const model = program.command("model").description("create and inspect model directories");
  model
    .command("init")
    .description("write a randomly initialised model (config.json + model.safetensors)")
    .requiredOption("--preset <name>", "model size preset (tiny, quickstart, small, base100m)")
    .requiredOption("--out <dir>", "output directory")
    .option("--seed <n>", "random seed", "0")
    .action(async (opts: { preset: string; out: string; seed: string }) => {
      const { initModelDir } = await import("../../../native/model-dir.ts");
      await initModelDir(opts.preset, opts.out, Number(opts.seed));
      console.log(`wrote ${opts.out} (preset ${opts.preset})`);
    });
}
