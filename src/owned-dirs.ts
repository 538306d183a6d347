// Temporary directories that name the process owning them (a `.owner` file: pid and the process's
// start time, so a reused pid is not taken for the owner), and the sweep that removes those whose
// owner is gone: what a SIGKILLed job left in the temp directory (the embedded nats-server's config
// with its token, agent workdirs) is removed by the next start, never by a live job's neighbour.
import { readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const OWNER = ".owner";

/** The start time of `pid` (clock ticks since boot, /proc/PID/stat field 22), or null where unknown. */
function startTime(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19] ?? null;
  } catch {
    return null;
  }
}

/** Whether `pid` has exited and waits for its parent to reap it (state Z or X in /proc/PID/stat). */
function zombie(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state === "Z" || state === "X";
  } catch {
    return false;
  }
}

/** Records this process as the owner of `dir` (mode 0600). */
export function markOwner(dir: string): void {
  writeFileSync(join(dir, OWNER), `${process.pid} ${startTime(process.pid) ?? "-"}\n`, { mode: 0o600 });
}

/** Whether the process that wrote `owner` ("PID START") still runs. */
function alive(owner: string): boolean {
  const [pidText, start] = owner.trim().split(" ");
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  if (zombie(pid)) return false; // exited, not yet reaped by its parent
  const now = startTime(pid);
  return start === "-" || now === null || now === start;
}

/**
 * Removes the directories `<dir>/<prefix>*` whose `.owner` process is gone; directories without an
 * owner file (being made, or older than this scheme) are left. Returns the paths removed.
 */
export function sweepDeadOwners(prefix: string, dir = tmpdir()): string[] {
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.startsWith(prefix));
  } catch {
    return removed;
  }
  for (const n of names) {
    const path = join(dir, n);
    let owner: string;
    try {
      owner = readFileSync(join(path, OWNER), "utf8");
    } catch {
      continue;
    }
    if (alive(owner)) continue;
    try {
      rmSync(path, { recursive: true, force: true });
      removed.push(path);
    } catch {
      // another sweeper, or not ours to remove
    }
  }
  return removed;
}
