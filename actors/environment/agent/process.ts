// Runs one agent (or reward) command as a child in its own process group (spawned detached): the
// task on stdin, a wall-clock timeout that signals the whole group (SIGTERM, then SIGKILL after a
// grace period), bounded capture of stdout and stderr, and a final SIGKILL of the group when the
// leader exits, so no grandchild an agent left behind outlives its episode.
import { spawn } from "node:child_process";

/** What to run. */
export interface ProcessSpec {
  command: string;
  args: readonly string[];
  cwd: string;
  /** The child's whole environment. */
  env: NodeJS.ProcessEnv;
  /** Written to stdin, which is then closed. */
  stdin: string;
  timeoutMs: number;
  /** Between SIGTERM and SIGKILL of the group on timeout. */
  killGraceMs: number;
  /** Most bytes kept of stdout and of stderr each (the tail is kept). Default 64 KiB. */
  maxOutputBytes?: number;
  /** Aborts the run like a timeout (the group is killed). */
  signal?: AbortSignal;
}

/** How the process ended. */
export interface ProcessResult {
  /** Exit code, or null when a signal ended it. */
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  timedOut: boolean;
  aborted: boolean;
  /** spawn failed (command not found, not executable): the error message. */
  spawnError: string | null;
  stdout: string;
  stderr: string;
  /** Process group id (the leader's pid), null when spawn failed. */
  pgid: number | null;
  seconds: number;
}

/** Sends `sig` to the process group `pgid`; false when the group is gone. */
export function signalGroup(pgid: number, sig: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, sig);
    return true;
  } catch {
    return false;
  }
}

/** Runs the command to its end (or its timeout); never throws for the child's failures. */
export function runProcess(spec: ProcessSpec): Promise<ProcessResult> {
  const t0 = performance.now();
  const cap = spec.maxOutputBytes ?? 64 * 1024;
  return new Promise((resolve) => {
    let child;
    try {
      child = spawn(spec.command, [...spec.args], { cwd: spec.cwd, env: spec.env, detached: true, stdio: ["pipe", "pipe", "pipe"] });
    } catch (e) {
      resolve({ exitCode: null, signal: null, timedOut: false, aborted: false, spawnError: (e as Error).message, stdout: "", stderr: "", pgid: null, seconds: 0 });
      return;
    }
    const out = tail(cap);
    const err = tail(cap);
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => err.push(b));
    child.stdin.on("error", () => undefined); // an agent that never reads stdin closes it early: EPIPE
    child.stdin.end(spec.stdin);
    const pgid = child.pid ?? null;
    let timedOut = false;
    let aborted = false;
    let spawnError: string | null = null;
    let killTimer: NodeJS.Timeout | undefined;
    const stop = () => {
      if (pgid === null) return;
      signalGroup(pgid, "SIGTERM");
      killTimer = setTimeout(() => signalGroup(pgid, "SIGKILL"), spec.killGraceMs);
    };
    const timer = setTimeout(() => {
      timedOut = true;
      stop();
    }, spec.timeoutMs);
    const onAbort = () => {
      aborted = true;
      stop();
    };
    spec.signal?.addEventListener("abort", onAbort, { once: true });
    if (spec.signal?.aborted) onAbort();
    let settled = false;
    const finish = (exitCode: number | null, signal: NodeJS.Signals | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(killTimer);
      spec.signal?.removeEventListener("abort", onAbort);
      // The leader is gone; whatever it left in its group goes with it.
      if (pgid !== null) signalGroup(pgid, "SIGKILL");
      const done = () => {
        clearTimeout(drain);
        resolve({ exitCode, signal, timedOut, aborted, spawnError, stdout: out.text(), stderr: err.text(), pgid: spawnError ? null : pgid, seconds: (performance.now() - t0) / 1000 });
      };
      // Read the pipes to their end; a process outside the group (setsid) holding them open is cut off after a while.
      const drain = setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
        done();
      }, 5_000);
      if (child.stdout.closed && child.stderr.closed) done();
      else child.once("close", done);
    };
    child.on("error", (e) => {
      spawnError = e.message;
      finish(null, null);
    });
    child.on("exit", (code, sig) => finish(code, sig));
  });
}

/** Keeps the last `cap` bytes pushed. */
function tail(cap: number) {
  const chunks: Buffer[] = [];
  let size = 0;
  return {
    push(b: Buffer) {
      chunks.push(b);
      size += b.length;
      while (size > cap && chunks.length > 1) size -= chunks.shift()!.length;
    },
    text(): string {
      const all = Buffer.concat(chunks);
      return all.subarray(Math.max(0, all.length - cap)).toString("utf8");
    },
  };
}
