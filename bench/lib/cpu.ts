// Machine-wide CPU time from /proc/stat (Linux), for benchmarks that explain a throughput by what
// the cores spent on it: busy and total seconds summed over all cores (USER_HZ = 100 ticks/s, as
// Linux reports /proc/stat to user space), and the CPU seconds of one process tree. null where /proc is missing.
import { existsSync, readdirSync, readFileSync } from "node:fs";

/** Busy (not idle or iowait) and total CPU seconds of the whole machine since boot, over all cores. */
export interface CpuTimes {
  busy: number;
  total: number;
}

export function machineCpu(): CpuTimes | null {
  if (!existsSync("/proc/stat")) return null;
  const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!;
  // cpu  user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user)
  const f = line.trim().split(/\s+/).slice(1, 9).map(Number);
  if (f.length < 8 || f.some((x) => !Number.isFinite(x))) return null;
  const total = f.reduce((a, b) => a + b, 0);
  const idle = f[3]! + f[4]!;
  return { busy: (total - idle) / 100, total: total / 100 };
}

/** CPU used between two readings (busy and total core-seconds); null without both readings. */
export function cpuBetween(a: CpuTimes | null, b: CpuTimes | null): CpuTimes | null {
  if (!a || !b || b.total <= a.total) return null;
  return { busy: b.busy - a.busy, total: b.total - a.total };
}

/**
 * CPU seconds (user + system) that process `root` and every live descendant (engines, trainer
 * workers, nats-server) have used, from /proc/PID/stat; null where /proc is missing. Unlike
 * machineCpu it does not count other work on the machine, so two runs measured under different
 * background load still compare.
 */
export function processTreeCpu(root = process.pid): number | null {
  if (!existsSync("/proc/self/stat")) return null;
  const stats = new Map<number, { ppid: number; seconds: number }>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    let line: string;
    try {
      line = readFileSync(`/proc/${name}/stat`, "utf8");
    } catch {
      continue; // exited meanwhile
    }
    // pid (comm) state ppid ... utime(14) stime(15): fields after the command's closing parenthesis
    const f = line.slice(line.lastIndexOf(")") + 2).split(" ");
    stats.set(Number(name), { ppid: Number(f[1]), seconds: (Number(f[11]) + Number(f[12])) / 100 });
  }
  let total = 0;
  const queue = [root];
  const seen = new Set<number>();
  while (queue.length > 0) {
    const pid = queue.pop()!;
    if (seen.has(pid)) continue;
    seen.add(pid);
    total += stats.get(pid)?.seconds ?? 0;
    for (const [child, s] of stats) if (s.ppid === pid) queue.push(child);
  }
  return total;
}
