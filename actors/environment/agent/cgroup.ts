// A cgroup per sandbox: one memory budget and one process count for all of a sandbox's processes
// together, with the kernel's OOM accounting, on top of the per-process rlimits (sandbox.ts). cgroup
// v2 (memory.max, pids.max in one directory) where its memory and pids controllers can be enabled,
// else cgroup v1's memory and pids hierarchies (memory.limit_in_bytes, pids.max); neither (ooze not
// root, no controllers, a read-only /sys/fs/cgroup): null, and the rlimits alone apply. Each job
// process makes its sandboxes' cgroups under `ooze/PID-N`; a start removes those of processes that
// are gone (a SIGKILLed job's).
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = "/sys/fs/cgroup";

/** Where sandbox cgroups are made: v2's one directory, or v1's two hierarchies. */
export type CgroupSupport = { v: 2; dir: string } | { v: 1; memory: string; pids: string };

let support: CgroupSupport | null | undefined;
let seq = 0;

function write(file: string, value: string): boolean {
  try {
    writeFileSync(file, value);
    return true;
  } catch {
    return false;
  }
}

function read(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch {
    return "";
  }
}

/** Makes `dir` (a cgroup); false when it cannot be made. */
function made(dir: string): boolean {
  try {
    mkdirSync(dir, { recursive: true });
    return true;
  } catch {
    return false;
  }
}

/** Whether process `pid` is alive. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** The sandbox cgroups of job process `pid` (its own `PID-N` directories), for tests and operators. */
export function cgroupsOf(pid: number): string[] {
  const s = cgroupSupport();
  const parents = !s ? [] : s.v === 2 ? [s.dir] : [s.memory, s.pids];
  return parents.flatMap((d) => (existsSync(d) ? readdirSync(d).filter((n) => n.startsWith(`${pid}-`)).map((n) => join(d, n)) : []));
}

/** Removes the sandbox cgroups that job processes now gone left behind (each start does it once). */
export function sweepCgroups(): void {
  const s = cgroupSupport();
  if (s) for (const d of s.v === 2 ? [s.dir] : [s.memory, s.pids]) sweep(d);
}

/** Removes the sandbox cgroups under `parent` left by job processes that are gone. */
function sweep(parent: string): void {
  for (const name of existsSync(parent) ? readdirSync(parent) : []) {
    const m = /^(\d+)-\d+$/.exec(name);
    if (m && !alive(Number(m[1]))) removeCgroup(join(parent, name));
  }
}

/** Kills what is left in cgroup `dir` and removes it (a v2 cgroup.kill, else SIGKILL to each pid); false if it stays. */
function removeCgroup(dir: string): boolean {
  if (!existsSync(dir)) return true;
  if (!write(join(dir, "cgroup.kill"), "1"))
    for (const pid of read(join(dir, "cgroup.procs")).split("\n").filter(Boolean)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // gone
      }
    }
  try {
    rmdirSync(dir);
    return true;
  } catch {
    return false; // processes still exiting
  }
}

/** How this machine gives sandboxes cgroups (checked once per process); null: it does not. */
export function cgroupSupport(): CgroupSupport | null {
  if (support !== undefined) return support;
  support = null;
  if (process.getuid?.() !== 0) return null;
  const controllers = read(join(ROOT, "cgroup.controllers")).split(/\s+/);
  if (controllers.includes("memory") && controllers.includes("pids")) {
    const dir = join(ROOT, "ooze");
    if (write(join(ROOT, "cgroup.subtree_control"), "+memory +pids") && made(dir) && write(join(dir, "cgroup.subtree_control"), "+memory +pids")) {
      sweep(dir);
      return (support = { v: 2, dir });
    }
  }
  const memory = join(ROOT, "memory", "ooze"), pids = join(ROOT, "pids", "ooze");
  if (existsSync(join(ROOT, "memory", "cgroup.procs")) && existsSync(join(ROOT, "pids", "cgroup.procs")) && made(memory) && made(pids)) {
    sweep(memory);
    sweep(pids);
    return (support = { v: 1, memory, pids });
  }
  return null;
}

/** One sandbox's cgroup (in v1, one directory in each hierarchy). */
export class SandboxCgroup {
  private constructor(
    private readonly v: 1 | 2,
    private readonly dirs: string[],
    /** The memory limit, bytes. */
    readonly memoryBytes: number,
  ) {}

  /** Makes a cgroup for one sandbox with these limits; null when the machine gives none. */
  static make(limits: { memoryMB: number; pids: number }): SandboxCgroup | null {
    const s = cgroupSupport();
    if (!s) return null;
    const name = `${process.pid}-${++seq}`;
    const bytes = limits.memoryMB * 1024 * 1024;
    if (s.v === 2) {
      const dir = join(s.dir, name);
      // memory.swap.max 0: the budget is memory, not memory plus swap
      const ok = made(dir) && write(join(dir, "memory.max"), String(bytes)) && write(join(dir, "pids.max"), String(limits.pids));
      if (ok) write(join(dir, "memory.swap.max"), "0");
      return ok ? new SandboxCgroup(2, [dir], bytes) : (removeCgroup(dir), null);
    }
    const mem = join(s.memory, name), pids = join(s.pids, name);
    const ok = made(mem) && made(pids) && write(join(mem, "memory.limit_in_bytes"), String(bytes)) && write(join(pids, "pids.max"), String(limits.pids));
    if (ok) write(join(mem, "memory.memsw.limit_in_bytes"), String(bytes)); // where swap accounting is on
    if (!ok) {
      removeCgroup(mem);
      removeCgroup(pids);
      return null;
    }
    return new SandboxCgroup(1, [mem, pids], bytes);
  }

  /** The files the sandbox's first process writes its pid into before it runs anything. */
  get procs(): string[] {
    return this.dirs.map((d) => join(d, "cgroup.procs"));
  }

  /** Processes the kernel OOM-killed in it for going over its memory limit. */
  oomKills(): number {
    const file = this.v === 2 ? join(this.dirs[0]!, "memory.events") : join(this.dirs[0]!, "memory.oom_control");
    const m = /^oom_kill (\d+)$/m.exec(read(file));
    return m ? Number(m[1]) : 0;
  }

  /** Kills every process left in it and removes it (retrying while they exit, up to ~1 s). */
  async close(): Promise<void> {
    for (let i = 0; i < 20; i++) {
      if (this.dirs.map((d) => removeCgroup(d)).every(Boolean)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/**
 * `argv` run inside cgroup `cg`: a shell writes its own pid into each of the cgroup's procs files,
 * then execs the program, so nothing of it runs outside the cgroup (exit 125 when it cannot join).
 */
export function inCgroup(cg: SandboxCgroup, argv: readonly string[]): string[] {
  return ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"', "ooze-cgroup", ...cg.procs, "--", ...argv];
}
