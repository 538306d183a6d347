// Embedded engines of the fleet actor: child processes running `ooze serve` (a preset or a model
// directory) on a free port, attached once they print their URL, restarted on the same port when
// they die unexpectedly (up to a limit), and stopped with SIGTERM (SIGKILL after a grace period).
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { OozeError } from "../../src/errors.ts";
import { oozeBin } from "../../src/package-root.ts";

/** What an embedded engine serves. */
export interface EmbeddedSpec {
  preset?: string | undefined;
  modelDir?: string | undefined;
  seed?: number | undefined;
  weightVersion?: string | undefined;
  maxRunning?: number | undefined;
  cacheTokens?: number | undefined;
  /** Bind address (default 127.0.0.1): a host's own address where rollouts on other hosts use the engine. */
  host?: string | undefined;
}

/** `ooze serve`'s flags for what an engine serves: its model, its limits, its bind address. */
export function serveArgs(s: EmbeddedSpec): string[] {
  const args = s.preset !== undefined ? ["--preset", s.preset, "--seed", String(s.seed ?? 0)] : ["--model", s.modelDir!];
  if (s.weightVersion !== undefined) args.push("--weight-version", s.weightVersion);
  if (s.maxRunning !== undefined) args.push("--max-running", String(s.maxRunning));
  if (s.cacheTokens !== undefined) args.push("--cache-tokens", String(s.cacheTokens));
  if (s.host !== undefined) args.push("--host", s.host);
  return args;
}

/** One embedded engine process. */
export class EmbeddedEngine {
  url: string | null = null;
  private child: ChildProcess | null = null;
  private port = 0;
  private stopping = false;
  private restarts = 0;

  constructor(
    private readonly spec: EmbeddedSpec,
    private readonly index: number,
    private readonly log: (line: string) => void,
    private readonly onStarted: (url: string, pid: number) => void = () => {},
    private readonly maxRestarts = 5,
  ) {
    if ((spec.preset === undefined) === (spec.modelDir === undefined)) {
      throw new OozeError("CONFIG_INVALID", "fleet: embedded engines need exactly one of 'preset' or 'modelDir'");
    }
  }

  /** Starts the process and resolves with its URL once it listens. */
  start(timeoutMs = 60_000): Promise<string> {
    const args = [oozeBin(), "serve", "--port", String(this.port), "--parent-pid", String(process.pid), ...serveArgs(this.spec)];
    const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.child = child;
    let out = "";
    return new Promise<string>((resolve, reject) => {
      let up = false;
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        reject(new OozeError("ENGINE_UNAVAILABLE", `fleet: embedded engine ${this.index} did not print its URL within ${timeoutMs} ms:\n${out.slice(-2000)}`));
      }, timeoutMs);
      child.stderr!.on("data", (d: Buffer) => {
        out += d.toString();
        if (up) for (const l of d.toString().split("\n")) if (l.trim()) this.log(`[engine ${this.index}] ${l}`);
      });
      child.stdout!.on("data", (d: Buffer) => {
        out += d.toString();
        const m = /at (https?:\/\/[^\s]+)/.exec(out);
        if (m && !up) {
          up = true;
          clearTimeout(timer);
          this.url = m[1]!;
          this.port = Number(new URL(this.url).port);
          this.onStarted(this.url, child.pid!);
          resolve(this.url);
        }
      });
      child.once("exit", (code, sig) => {
        clearTimeout(timer);
        if (!up) {
          reject(new OozeError("ENGINE_UNAVAILABLE", `fleet: embedded engine ${this.index} exited (${sig ?? code}) before it listened:\n${out.slice(-2000)}`));
          return;
        }
        if (this.stopping || this.child !== child) return;
        if (this.restarts >= this.maxRestarts) {
          this.log(`fleet: embedded engine ${this.index} (${this.url}) exited (${sig ?? code}); not restarting after ${this.restarts} restarts`);
          return;
        }
        this.restarts++;
        this.log(`fleet: embedded engine ${this.index} (${this.url}) exited (${sig ?? code}); restarting on port ${this.port}`);
        this.start(timeoutMs).catch((e: Error) => this.log(e.message));
      });
    });
  }

  /** Process id, or null when not running. */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  /** Stops the process: SIGTERM, then SIGKILL after `graceMs`. */
  async stop(graceMs = 5_000): Promise<void> {
    this.stopping = true;
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * Stops an engine process an earlier incarnation started and did not stop (it crashed): only when
 * the pid still runs `ooze serve`, so a reused pid is never killed. Returns whether it killed it.
 */
export function killOrphan(pid: number): boolean {
  let cmd: string;
  try {
    cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8").replace(/\0/g, " ");
  } catch {
    return false; // gone (or no /proc: nothing known to be safe to kill)
  }
  if (!cmd.includes("ooze") || !cmd.includes(" serve ")) return false;
  try {
    process.kill(pid, "SIGKILL");
    return true;
  } catch {
    return false;
  }
}
