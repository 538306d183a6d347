// Runs one agent (or reward) command as a child in its own process group (spawned detached): the
// task on stdin, a wall-clock timeout that signals the whole group (SIGTERM, then SIGKILL after a
// grace period), bounded capture of stdout and stderr, and a final SIGKILL of the group when the
// leader exits, so no grandchild an agent left behind outlives its episode. A sandboxed run
// (sandbox.ts: bwrap … init script … command) is stopped through its control socket (fd 3: SIGTERM
// to every process of the sandbox, then SIGKILL of bwrap, which takes the sandbox's PID namespace
// with it) and reports how the command ended over the same socket.
import { spawn, type ChildProcess } from "node:child_process";
import { constants } from "node:os";
import type { Duplex } from "node:stream";

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
  /** `command args` is a sandbox (sandbox.ts): controlled and reporting over fd 3. */
  sandboxed?: boolean;
  /** Run as this uid / gid (ooze as root: the sandbox's own ids). */
  uid?: number;
  gid?: number;
  /** Most bytes of stdout + stderr together before the run is stopped like a timeout (default: no limit). */
  maxTotalOutputBytes?: number;
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
  /** It printed more than maxTotalOutputBytes and was stopped. */
  outputExceeded: boolean;
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
  const ids = spec.uid !== undefined ? { uid: spec.uid, gid: spec.gid ?? spec.uid } : {};
  return new Promise((resolve) => {
    const failed = (message: string): ProcessResult => ({
      exitCode: null, signal: null, timedOut: false, aborted: false, spawnError: message, stdout: "", stderr: "", pgid: null, seconds: 0, outputExceeded: false,
    });
    let child: ChildProcess;
    try {
      child = spawn(spec.command, [...spec.args], {
        cwd: spec.sandboxed ? "/" : spec.cwd, env: spec.env, detached: true, stdio: spec.sandboxed ? ["pipe", "pipe", "pipe", "pipe"] : ["pipe", "pipe", "pipe"], ...ids,
      });
    } catch (e) {
      resolve(failed((e as Error).message));
      return;
    }
    const out = tail(cap);
    const err = tail(cap);
    let printed = 0;
    let outputExceeded = false;
    const count = (b: Buffer) => {
      printed += b.length;
      if (spec.maxTotalOutputBytes !== undefined && printed > spec.maxTotalOutputBytes && !outputExceeded) {
        outputExceeded = true;
        stop(true);
      }
    };
    child.stdout!.on("data", (b: Buffer) => {
      out.push(b);
      count(b);
    });
    child.stderr!.on("data", (b: Buffer) => {
      err.push(b);
      count(b);
    });
    child.stdin!.on("error", () => undefined); // an agent that never reads stdin closes it early: EPIPE
    child.stdin!.end(spec.stdin);
    // The sandbox's control socket: "exit N" / "signal N" / "nostart REASON" come back on it.
    const ctl = spec.sandboxed ? (child.stdio[3] as Duplex) : null;
    let report = "";
    ctl?.on("data", (b: Buffer) => {
      report += b.toString("utf8");
    });
    ctl?.on("error", () => undefined);
    const pgid = child.pid ?? null;
    let timedOut = false;
    let aborted = false;
    let spawnError: string | null = null;
    let killTimer: NodeJS.Timeout | undefined;
    let stopping = false;
    const stop = (now = false) => {
      if (pgid === null || stopping) return;
      stopping = true;
      if (ctl) {
        // SIGTERM to every process of the sandbox (the init script), SIGKILL of bwrap after the grace.
        if (!now && ctl.writable) ctl.write("TERM\n");
        killTimer = setTimeout(() => signalGroup(pgid, "SIGKILL"), now ? 0 : spec.killGraceMs);
      } else {
        signalGroup(pgid, now ? "SIGKILL" : "SIGTERM");
        killTimer = setTimeout(() => signalGroup(pgid, "SIGKILL"), now ? 0 : spec.killGraceMs);
      }
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
        let code = exitCode;
        let sig = signal;
        if (ctl && spawnError === null) {
          // What the init script saw of the command; none: the sandbox itself failed or was killed.
          const m = /^(exit|signal|nostart) (.*)$/m.exec(report);
          if (m?.[1] === "exit") [code, sig] = [Number(m[2]), null];
          else if (m?.[1] === "signal") [code, sig] = [null, signalName(Number(m[2]))];
          else if (m?.[1] === "nostart") spawnError = m[2]!;
          else if (!timedOut && !aborted && !outputExceeded) spawnError = `the sandbox failed (bwrap exit ${exitCode ?? signal}): ${lastLines(err.text())}`;
          else [code, sig] = [null, "SIGKILL"];
        }
        resolve({
          exitCode: code, signal: sig, timedOut, aborted, spawnError, stdout: out.text(), stderr: err.text(),
          pgid: spawnError && !ctl ? null : pgid, seconds: (performance.now() - t0) / 1000, outputExceeded,
        });
      };
      // Read the pipes to their end; a process outside the group (setsid) holding them open is cut off after a while.
      const drain = setTimeout(() => {
        child.stdout!.destroy();
        child.stderr!.destroy();
        ctl?.destroy();
        done();
      }, 5_000);
      const open = [child.stdout!, child.stderr!, ...(ctl ? [ctl] : [])];
      if (open.every((s) => s.closed)) done();
      else child.once("close", done);
    };
    child.on("error", (e) => {
      spawnError = e.message;
      finish(null, null);
    });
    child.on("exit", (code, sig) => finish(code, sig));
  });
}

function signalName(n: number): NodeJS.Signals {
  const e = Object.entries(constants.signals).find(([, v]) => v === n);
  return (e?.[0] ?? `SIG${n}`) as NodeJS.Signals;
}

function lastLines(s: string): string {
  return s.trim().split("\n").slice(-3).join("; ").slice(0, 400);
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
