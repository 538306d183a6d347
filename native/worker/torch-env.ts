// The PyTorch trainer worker's Python environment: a virtual environment inside the package
// (python/.venv) with python/requirements.txt installed by pip from the machine's configured package
// index, or the interpreter OOZE_TORCH_PYTHON names (a GPU machine's own CUDA build of torch). The
// embedded default (the native worker) never needs any of it.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../../src/errors.ts";
import { packageRoot } from "../../src/package-root.ts";

/** The Python package's directory (python/ooze_torch lies in it). */
export function torchPackageDir(): string {
  return join(packageRoot(), "python");
}

/** The virtual environment ooze creates. */
export function torchVenvDir(): string {
  return join(torchPackageDir(), ".venv");
}

/** The modules the worker imports, with the pip requirement that provides each. */
const MODULES: [module: string, pkg: string][] = [["torch", "torch"], ["transformers", "transformers"], ["safetensors", "safetensors"], ["msgpack", "msgpack"], ["numpy", "numpy"], ["peft", "peft"]];

/** A virtual environment and the requirements file it is made from (the package's own by default). */
export interface TorchEnvPlace {
  venv: string;
  requirements: string;
}

function defaultPlace(): TorchEnvPlace {
  return { venv: torchVenvDir(), requirements: join(torchPackageDir(), "requirements.txt") };
}

/** Where the interpreter comes from: OOZE_TORCH_PYTHON, else the venv. */
export function torchPython(place: TorchEnvPlace = defaultPlace()): { python: string; fromEnv: boolean } {
  const env = process.env.OOZE_TORCH_PYTHON;
  if (env) return { python: env, fromEnv: true };
  return { python: join(place.venv, "bin", "python"), fromEnv: false };
}

/** The modules an interpreter cannot import (empty: all there). */
export function missingModules(python: string): string[] {
  const code = `import importlib.util, sys\nprint(",".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))`;
  const r = spawnSync(python, ["-c", code, ...MODULES.map(([m]) => m)], { encoding: "utf8" });
  if (r.error || r.status !== 0) throw new OozeError("TORCH_SETUP", `cannot run ${python}: ${r.error?.message ?? r.stderr.trim()}`);
  const out = r.stdout.trim();
  return out ? out.split(",") : [];
}

/** The requirements file's text, recorded in the venv after a successful install. */
function requirements(place: TorchEnvPlace): string {
  return readFileSync(place.requirements, "utf8");
}

const STAMP = ".ooze-requirements";

/** Whether the venv holds exactly the current requirements (no pip run needed). */
export function torchEnvReady(place: TorchEnvPlace = defaultPlace()): boolean {
  const { python, fromEnv } = torchPython(place);
  if (fromEnv) return existsSync(python);
  const stamp = join(place.venv, STAMP);
  return existsSync(python) && existsSync(stamp) && readFileSync(stamp, "utf8") === requirements(place);
}

/**
 * Makes the worker's Python environment ready and returns its interpreter: with OOZE_TORCH_PYTHON,
 * checks that it imports what the worker needs; else creates python/.venv when missing and installs
 * python/requirements.txt into it (skipped when the venv already holds exactly those). Progress goes to
 * `log`; a failure says what was missing and how to fix it.
 */
export async function ensureTorchEnv(log: (line: string) => void = () => undefined, place: TorchEnvPlace = defaultPlace()): Promise<string> {
  const { python, fromEnv } = torchPython(place);
  if (fromEnv) {
    if (!existsSync(python)) throw new OozeError("TORCH_SETUP", `OOZE_TORCH_PYTHON=${python}: no such file`);
    const missing = missingModules(python);
    if (missing.length) throw new OozeError("TORCH_SETUP", `OOZE_TORCH_PYTHON=${python} cannot import ${missing.join(", ")}: install them into that environment (pip install ${missing.join(" ")}), or unset OOZE_TORCH_PYTHON to let ooze make its own`);
    return python;
  }
  if (torchEnvReady(place)) return python;
  // one installer at a time (two test files, or two jobs, starting together): the others wait for it
  const lock = `${place.venv}.lock`;
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      const age = Date.now() - (existsSync(lock) ? statSync(lock).mtimeMs : 0);
      if (age > 15 * 60_000) rmSync(lock, { recursive: true, force: true }); // left by an installer that died
      else await new Promise((r) => setTimeout(r, 1000));
      if (torchEnvReady(place)) return python;
    }
  }
  try {
    return await install(python, log, place);
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

async function install(python: string, log: (line: string) => void, place: TorchEnvPlace): Promise<string> {
  const venv = place.venv;
  if (!existsSync(python)) {
    const base = process.env.OOZE_PYTHON ?? "python3";
    log(`creating a Python virtual environment in ${venv} (with ${base})`);
    await run(base, ["-m", "venv", venv], log, (out) =>
      /ensurepip|No module named venv/.test(out)
        ? `${base} cannot create virtual environments: install Debian's python3-venv (apt-get install python3-venv)`
        : `'${base} -m venv ${venv}' failed${/ENOENT/.test(out) ? `: ${base} is not on PATH (install python3, or set OOZE_PYTHON to an interpreter)` : ""}`);
  }
  const req = place.requirements;
  log(`installing ${requirementNames(place).join(", ")} into ${venv} with pip (from the machine's configured package index)`);
  // --retries 0: an unreachable index fails at once and pip goes on to the next configured one
  await run(python, ["-m", "pip", "install", "--disable-pip-version-check", "--retries", "0", "--progress-bar", "off", "-r", req], log, (out) => {
    const missing = [...out.matchAll(/No matching distribution found for ([^\s]+)/g)].map((m) => m[1]!);
    return missing.length
      ? `pip found no ${missing.join(", ")} in the configured package index (pip config list shows it): add that wheel to the index, or set OOZE_TORCH_PYTHON to an interpreter that has it`
      : `pip install -r ${req} failed`;
  });
  const missing = missingModules(python);
  if (missing.length) throw new OozeError("TORCH_SETUP", `after pip install, ${python} still cannot import ${missing.join(", ")}`);
  writeFileSync(join(venv, STAMP), requirements(place));
  log(`ready: ${python}`);
  return python;
}

function requirementNames(place: TorchEnvPlace): string[] {
  return requirements(place).split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
}

/** Runs a command, passing each output line to log; rejects with why(output) on failure. */
function run(file: string, args: string[], log: (line: string) => void, why: (output: string) => string): Promise<void> {
  return new Promise((res, rej) => {
    const child = spawn(file, args, { stdio: ["ignore", "pipe", "pipe"] });
    let tail = "";
    const onData = (b: Buffer) => {
      const s = b.toString("utf8");
      tail = (tail + s).slice(-20_000);
      for (const line of s.split("\n")) if (/^(Collecting|Installing collected|Successfully installed|ERROR)/.test(line.trim())) log(line.trim());
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("error", (e) => rej(new OozeError("TORCH_SETUP", `${why(String(e))}: ${e.message}`)));
    child.on("exit", (code, signal) => {
      if (code === 0) return res();
      const last = tail.trim().split("\n").slice(-6).join("\n");
      rej(new OozeError("TORCH_SETUP", `${why(tail)} (${signal ?? `exit ${code}`}):\n${last}`));
    });
  });
}

/** How a TorchTrainer worker runs: device, precision, ranks. */
export interface TorchWorkerSettings {
  device: "auto" | "cpu" | "cuda";
  dtype: "fp32" | "bf16";
  /** Ranks of the FSDP2 group (1: one process). */
  gpus: number;
  gradientCheckpointing: boolean;
  /** transformers attention implementation (sdpa by default). */
  attn?: string;
  /** torch CPU threads per rank (0 or absent: torch's default). */
  threads?: number;
}

/** The command that starts a PyTorch worker (for TrainerWorkerOptions.command). */
export function torchWorkerCommand(python: string, s: TorchWorkerSettings): { file: string; args: string[]; env: Record<string, string> } {
  const args = ["-m", "ooze_torch", "--device", s.device, "--dtype", s.dtype, "--gpus", String(s.gpus), "--attn", s.attn ?? "sdpa"];
  if (s.gradientCheckpointing) args.push("--gradient-checkpointing");
  if (s.threads) args.push("--threads", String(s.threads));
  const pp = process.env.PYTHONPATH;
  return { file: python, args, env: { PYTHONPATH: pp ? `${torchPackageDir()}:${pp}` : torchPackageDir(), PYTHONUNBUFFERED: "1",
    // no hub access, no progress bars on the job's stderr
    HF_HUB_OFFLINE: "1", HF_HUB_DISABLE_PROGRESS_BARS: "1", TRANSFORMERS_VERBOSITY: "error" } };
}

/**
 * Checks, without loading weights, that the PyTorch worker can build `modelDir`'s model (transformers
 * knows its architecture, it has weight files); returns the model class, or throws naming the directory.
 */
export function checkTorchModel(python: string, modelDir: string): string {
  const { file, args, env } = torchWorkerCommand(python, { device: "cpu", dtype: "fp32", gpus: 1, gradientCheckpointing: false });
  const r = spawnSync(file, [...args, "--check-model", modelDir], { encoding: "utf8", env: { ...process.env, ...env } });
  if (r.error) throw new OozeError("TORCH_SETUP", `cannot run ${file}: ${r.error.message}`);
  if (r.status !== 0) throw new OozeError("CHECKPOINT_INVALID", (r.stderr.trim().split("\n").pop() ?? `${modelDir}: the torch worker cannot load it`) + " (train.trainer.backend: torch)");
  return r.stdout.trim();
}
