// Machine-wide CPU time from /proc/stat (Linux), for benchmarks that explain a throughput by what
// the cores spent on it: busy and total seconds summed over all cores (USER_HZ = 100 ticks/s, as
// Linux reports /proc/stat to user space). null where /proc/stat is missing.
import { existsSync, readFileSync } from "node:fs";

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

