// Machine-wide CPU time from /proc/stat (Linux), for benchmarks that explain a throughput by what
// the cores spent on it: busy and total seconds summed over all cores (USER_HZ = 100 ticks/s, as
// Linux reports /proc/stat to user space). null where /proc/stat is missing.
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { promisify } from "node:util";

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

/** The fields of /proc/PID/stat after the command name (field 3, the state, first). */
function statFields(pid: number | "self"): string[] {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
}

/** CPU seconds (user + system) a process has used, from /proc/PID/stat (0 where it cannot be read). */
export function processCpuSeconds(pid: number): number {
  try {
    const f = statFields(pid);
    return (Number(f[11]) + Number(f[12])) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch {
    return 0;
  }
}

/** CPU seconds (user + system) of this process's children that have been waited for (Linux). */
export function waitedChildrenCpuSeconds(): number {
  const f = statFields("self");
  return (Number(f[13]) + Number(f[14])) / 100; // cutime, cstime
}

/** CPU used between two readings (busy and total core-seconds); null without both readings. */
export function cpuBetween(a: CpuTimes | null, b: CpuTimes | null): CpuTimes | null {
  if (!a || !b || b.total <= a.total) return null;
  return { busy: b.busy - a.busy, total: b.total - a.total };
}

const run = promisify(execFile);

/**
 * A CPU gauge: the CPU milliseconds a fixed piece of JavaScript work takes in a fresh node process,
 * the same work every time — JSON bodies of token ids built and parsed (as a /generate exchange is),
 * typed arrays filled and copied, a Map churned — with nothing else in that process. This machine's
 * CPU time for one piece of work varies up to 2× over a day (docs/reliability.md: the suite's time
 * follows the hour), so a figure in CPU time is compared across runs as a multiple of the gauge read
 * beside it. Resolves with the median of `reads` reads.
 */
export async function cpuGaugeMs(reads = 3): Promise<number> {
  const work = `
    const t0 = process.cpuUsage();
    let keep = 0;
    const seen = new Map();
    for (let i = 0; i < 400; i++) {
      const ids = new Int32Array(1024);
      for (let j = 0; j < ids.length; j++) ids[j] = (i * 7919 + j * 104729) % 32000;
      const body = JSON.stringify({ input_ids: Array.from(ids), sampling_params: { max_new_tokens: 128, temperature: 1 }, rid: "r" + i });
      const back = JSON.parse(body);
      const lp = Float32Array.from(back.input_ids, (x) => -x / 32000);
      keep += lp[i % lp.length] + back.input_ids.length;
      seen.set("r" + i, lp.slice(0, 64));
      if (seen.size > 64) seen.delete(seen.keys().next().value);
    }
    const u = process.cpuUsage(t0);
    process.stdout.write(String((u.user + u.system) / 1000 + (keep === -1 ? 1 : 0)));
  `;
  const ms: number[] = [];
  // (not execFileSync: a bench reads it beside a running job, whose process must not stop meanwhile)
  for (let i = 0; i < reads; i++) ms.push(Number((await run(process.execPath, ["-e", work], { encoding: "utf8" })).stdout));
  return ms.sort((a, b) => a - b)[Math.floor(ms.length / 2)]!;
}
