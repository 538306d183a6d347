// The OpenBLAS baseline for bench/native.ts: builds bench/native/openblas_sgemm.cc against Debian's
// libopenblas-dev (installing it with apt-get when missing and running as root) and talks to it over
// stdin/stdout, one timing request per line.
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from "node:child_process";
import { mkdirSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface, type Interface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, "openblas_sgemm.cc");

function log(msg: string): void {
  process.stderr.write(`[bench native] ${msg}\n`);
}

function compile(out: string): string | null {
  const r = spawnSync("g++", ["-O2", "-o", out, source, "-lopenblas"], { encoding: "utf8" });
  if (r.error) return `g++ could not run: ${r.error.message}`;
  return r.status === 0 ? null : r.stderr.trim().split("\n").slice(-3).join(" | ");
}

function aptInstall(): string | null {
  const install = () =>
    spawnSync("apt-get", ["install", "-y", "--no-install-recommends", "libopenblas-dev"], {
      encoding: "utf8",
      env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
    });
  let r = install();
  if (r.status !== 0) {
    spawnSync("apt-get", ["update"], { encoding: "utf8" });
    r = install();
  }
  if (r.error) return `apt-get could not run: ${r.error.message}`;
  return r.status === 0 ? null : `apt-get install libopenblas-dev failed: ${r.stderr.trim().slice(-300)}`;
}

/**
 * Builds the baseline program (cached in the temp dir by source mtime). Returns its path, or the
 * reason it is unavailable (with the fix) when it cannot be built.
 */
export function buildOpenblasProgram(): { path: string } | { reason: string } {
  const dir = join(tmpdir(), "ooze-bench");
  mkdirSync(dir, { recursive: true });
  const out = join(dir, `openblas_sgemm-${Math.floor(statSync(source).mtimeMs)}`);
  try {
    statSync(out);
    return { path: out };
  } catch {
    // not built yet
  }
  let err = compile(out);
  if (err === null) return { path: out };
  log(`building the OpenBLAS baseline failed (${err})`);
  if (process.getuid?.() !== 0) {
    return {
      reason:
        "libopenblas-dev is missing and this bench is not running as root, so it cannot install it; " +
        "run `sudo apt-get install -y libopenblas-dev` and re-run `npm run bench -- native`",
    };
  }
  log("installing Debian's libopenblas-dev (apt-get install -y libopenblas-dev) for the baseline");
  const aptErr = aptInstall();
  if (aptErr) return { reason: `${aptErr}; install libopenblas-dev by hand and re-run` };
  err = compile(out);
  return err === null ? { path: out } : { reason: `g++ ... -lopenblas failed after install: ${err}` };
}

/** A running baseline program: time(kind, M, N, K, window) → seconds per cblas_sgemm call. */
export class OpenblasTimer {
  private readonly child: ChildProcessWithoutNullStreams;
  private readonly lines: Interface;
  private readonly waiting: Array<(line: string) => void> = [];

  constructor(path: string, threads: number, env: Record<string, string> = {}) {
    this.child = spawn(path, [], {
      env: { ...process.env, OPENBLAS_NUM_THREADS: String(threads), OMP_NUM_THREADS: String(threads), ...env },
    });
    this.child.stderr.on("data", (d: Buffer) => process.stderr.write(d));
    this.lines = createInterface({ input: this.child.stdout });
    this.lines.on("line", (line) => this.waiting.shift()?.(line));
  }

  /**
   * Seconds per call, averaged over a window of at least `window` seconds; with `copies` > 1 the calls
   * cycle through that many distinct operand sets (operands from memory rather than cache).
   */
  async time(kind: string, M: number, N: number, K: number, window: number, copies = 1): Promise<number> {
    return (await this.measure(kind, M, N, K, window, copies)).wall;
  }

  /**
   * As time(), with the baseline process's CPU seconds per call beside the wall-clock seconds, each
   * the best of `rounds` windows.
   */
  measure(kind: string, M: number, N: number, K: number, window: number, copies = 1, rounds = 1): Promise<{ wall: number; cpu: number }> {
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null) => reject(new Error(`openblas_sgemm exited with ${code}`));
      this.child.once("exit", onExit);
      this.waiting.push((line) => {
        this.child.off("exit", onExit);
        const [wall, cpu] = line.trim().split(/\s+/).map(Number);
        resolve({ wall: wall!, cpu: cpu ?? wall! });
      });
      this.child.stdin.write(`${kind} ${M} ${N} ${K} ${window} ${copies} ${rounds}\n`);
    });
  }

  close(): void {
    this.child.stdin.end();
    this.lines.close();
  }
}
