// A cgroup per sandbox: one memory budget, one process count and one CPU-time budget for all of a
// sandbox's processes together, with the kernel's OOM accounting, on top of the per-process rlimits
// (sandbox.ts). cgroup v2 (memory.max, pids.max, cpu.stat in one directory) where its memory and pids
// controllers can be enabled, else cgroup v1's memory, pids and cpuacct hierarchies
// (memory.limit_in_bytes, pids.max, cpuacct.usage); neither (ooze not root, no controllers, a
// read-only /sys/fs/cgroup): null, and the rlimits alone apply. The kernel enforces memory and
// processes; the CPU budget is the kernel's count, read by `watchCpu` while the sandbox runs (no
// cgroup file caps a total of CPU seconds, only a rate). Each job process makes its sandboxes'
// cgroups under `ooze/PID-N`; a start removes those of processes that are gone (a SIGKILLed job's).
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = "/sys/fs/cgroup";

/** Where sandbox cgroups are made: v2's one directory, or v1's memory, pids and (where present) cpuacct hierarchies. */
export type CgroupSupport = { v: 2; dir: string } | { v: 1; memory: string; pids: string; cpuacct: string | null };

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
  return parentsOf(s).flatMap((d) => (existsSync(d) ? readdirSync(d).filter((n) => n.startsWith(`${pid}-`)).map((n) => join(d, n)) : []));
}

/** The directories sandbox cgroups are made in. */
function parentsOf(s: CgroupSupport | null): string[] {
  return !s ? [] : s.v === 2 ? [s.dir] : [s.memory, s.pids, ...(s.cpuacct ? [s.cpuacct] : [])];
}

/** Removes the sandbox cgroups that job processes now gone left behind (each start does it once). */
export function sweepCgroups(): void {
  const s = cgroupSupport();
  for (const d of parentsOf(s)) sweep(d);
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
    // CPU accounting where the cpuacct hierarchy is there (alone or mounted with cpu)
    const acct = ["cpuacct", "cpu,cpuacct"].map((h) => join(ROOT, h)).find((h) => existsSync(join(h, "cpuacct.usage")));
    const cpuacct = acct && made(join(acct, "ooze")) ? join(acct, "ooze") : null;
    support = { v: 1, memory, pids, cpuacct };
    for (const d of parentsOf(support)) sweep(d);
    return support;
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
    const mem = join(s.memory, name), pids = join(s.pids, name), acct = s.cpuacct ? [join(s.cpuacct, name)] : [];
    const ok = made(mem) && made(pids) && acct.every(made) && write(join(mem, "memory.limit_in_bytes"), String(bytes)) && write(join(pids, "pids.max"), String(limits.pids));
    if (ok) write(join(mem, "memory.memsw.limit_in_bytes"), String(bytes)); // where swap accounting is on
    if (!ok) {
      for (const d of [mem, pids, ...acct]) removeCgroup(d);
      return null;
    }
    return new SandboxCgroup(1, [mem, pids, ...acct], bytes);
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

  /** CPU seconds its processes have used (user and system, the exited ones' included); null without CPU accounting. */
  cpuSeconds(): number | null {
    if (this.v === 2) {
      const m = /^usage_usec (\d+)$/m.exec(read(join(this.dirs[0]!, "cpu.stat")));
      return m ? Number(m[1]) / 1e6 : null;
    }
    const acct = this.dirs[2];
    const ns = acct ? read(join(acct, "cpuacct.usage")).trim() : "";
    return ns === "" ? null : Number(ns) / 1e9;
  }

  /** SIGKILLs every process in it now (it stays; close() removes it). */
  kill(): void {
    if (this.v === 2 && write(join(this.dirs[0]!, "cgroup.kill"), "1")) return;
    for (const pid of read(join(this.dirs[0]!, "cgroup.procs")).split("\n").filter(Boolean)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // gone
      }
    }
  }

  /**
   * Reads its CPU use every `everyMs` and calls `over(seconds)` once when it passes `budgetS`; returns
   * the stop. Nothing is watched without CPU accounting (the per-process RLIMIT_CPU still applies).
   */
  watchCpu(budgetS: number, over: (seconds: number) => void, everyMs = 100): () => void {
    if (this.cpuSeconds() === null) return () => undefined;
    const timer = setInterval(() => {
      const used = this.cpuSeconds();
      if (used !== null && used > budgetS) {
        clearInterval(timer);
        over(used);
      }
    }, everyMs);
    timer.unref();
    return () => clearInterval(timer);
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
