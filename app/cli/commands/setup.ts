// `ooze setup torch`: prepares the PyTorch trainer worker's Python environment (python/.venv with
// python/requirements.txt, from the machine's configured pip index), printing progress; safe to rerun.
import type { Command } from "commander";

export function register(program: Command) {
  const setup = program.command("setup").description("prepare optional components");
  setup
    .command("torch")
    .description("create the PyTorch trainer worker's virtual environment (python/.venv) and install its pinned requirements")
    .option("--check <modelDir>", "then check that the worker can build this model directory's model")
    .action(async (opts: { check?: string }) => {
      const { ensureTorchEnv, checkTorchModel, torchEnvReady } = await import("../../../native/worker/torch-env.ts");
      const ready = torchEnvReady();
      const t0 = Date.now();
      const python = await ensureTorchEnv((line) => console.error(`[ooze setup torch] ${line}`));
      console.error(`[ooze setup torch] ${ready ? "already set up" : `set up in ${((Date.now() - t0) / 1000).toFixed(0)} s`}: ${python}`);
      if (opts.check) console.log(`${opts.check}: ${checkTorchModel(python, opts.check)}`);
    });
}
