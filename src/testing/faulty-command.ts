// A command that can be made to fail on demand (ooze/testing's `command` fault): a small POSIX sh
// wrapper runs the real command given as its arguments, unless its mode file says `crash` (it exits
// 1 at once, as a reward or agent command that crashes) or `hang` (it sleeps and never exits, as a
// command stuck on a lock or the network; the caller's timeout has to end it). Each invocation is
// recorded with the mode it met, so a test can see that the fault met real calls.
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** What a wrapped command does while faulted. */
export const COMMAND_FAULTS = ["crash", "hang"] as const;
export type CommandFault = (typeof COMMAND_FAULTS)[number];

/** A wrapper around a command whose behaviour a fault schedule switches. */
export interface FaultyCommand {
  /** The wrapper script (executable). */
  readonly path: string;
  /** The command line that runs `command args…` through the wrapper: `{command: path, args: [command, ...args]}`. */
  wrap(command: string, args?: readonly string[]): { command: string; args: string[] };
  /** Sets (or, with null, clears) the fault that calls from now on meet. */
  setFault(fault: CommandFault | null): void;
  /** Invocations so far, by the mode each met (`ok`, `crash`, `hang`). */
  stats(): Record<"ok" | CommandFault, number>;
}

/**
 * Writes the wrapper `NAME.sh` and its mode and call-log files into `dir` (an existing directory). An
 * agent or reward command run in ooze's sandbox (the default) sees `dir` read-only: list it in
 * `train.agent.sandbox.writablePaths` so the wrapper can log its calls (give it a directory of its own).
 */
export function createFaultyCommand(dir: string, name: string): FaultyCommand {
  const path = join(dir, `${name}.sh`);
  const mode = join(dir, `${name}.mode`);
  const calls = join(dir, `${name}.calls`);
  const q = (s: string) => `'${s.replaceAll("'", "'\\''")}'`;
  writeFileSync(
    path,
    [
      "#!/bin/sh",
      `# ooze/testing faulty command '${name}': runs "$@" unless ${mode} says crash or hang`,
      `m=$(cat ${q(mode)} 2>/dev/null)`,
      'case "$m" in',
      `  crash) echo crash >> ${q(calls)}; echo "ooze/testing: injected crash of '${name}'" >&2; exit 1 ;;`,
      `  hang) echo hang >> ${q(calls)}; exec sleep 86400 ;;`,
      "esac",
      `echo ok >> ${q(calls)}`,
      'exec "$@"',
      "",
    ].join("\n"),
  );
  chmodSync(path, 0o755);
  writeFileSync(mode, "");
  // the call log exists and is writable by anyone: the sandbox runs the command as a fresh unprivileged uid
  writeFileSync(calls, "");
  chmodSync(calls, 0o666);
  return {
    path,
    wrap: (command, args = []) => ({ command: path, args: [command, ...args] }),
    setFault: (fault) => writeFileSync(mode, fault ?? ""),
    stats() {
      const out = { ok: 0, crash: 0, hang: 0 };
      if (!existsSync(calls)) return out;
      for (const l of readFileSync(calls, "utf8").split("\n")) if (l === "ok" || l === "crash" || l === "hang") out[l]++;
      return out;
    },
  };
}
