// The PyTorch trainer worker in tests: its Python environment made ready once per process (the test
// files of a vitest worker share it: pip from the machine's configured index on a fresh machine, about
// 40 s; a stamp check afterwards), and the command that starts it on CPU.
import { ensureTorchEnv, torchWorkerCommand, type TorchWorkerSettings } from "../../native/worker/torch-env.ts";

let python: Promise<string> | null = null;

/** The worker's interpreter, set up on first use (a failed setup is not kept: the next file tries again). */
export function torchPython(): Promise<string> {
  python ??= ensureTorchEnv((line) => process.stderr.write(`[torch setup] ${line}\n`)).catch((e: unknown) => {
    python = null;
    throw e;
  });
  return python;
}

/** The command of a CPU PyTorch worker (fp32, one process unless gpus says otherwise). */
export async function torchCommand(s: Partial<TorchWorkerSettings> = {}): Promise<{ file: string; args: string[]; env: Record<string, string> }> {
  return torchWorkerCommand(await torchPython(), { device: "cpu", dtype: "fp32", gpus: 1, gradientCheckpointing: false, threads: 1, ...s });
}
