// A run directory's metrics for the dashboard: reads DIR/metrics.jsonl once, then follows it (fs.watch
// on the directory; only the bytes appended since are read), so a run opened after its job ended, or
// while `ooze train` still writes it, shows its curves. A missing directory, a missing file or
// malformed lines give a readable reason (which file, which line, what is wrong) beside whatever
// lines were good — never a silently empty chart.
import { closeSync, existsSync, openSync, readSync, statSync, watch, type FSWatcher } from "node:fs";
import { join, resolve } from "node:path";
import type { DashMetrics, DashRun } from "./hub.ts";

/** Reads the complete lines appended to a file since `offset`; returns them and the new offset. */
function readAppended(file: string, offset: number): { lines: string[]; offset: number } {
  const size = statSync(file).size;
  if (size < offset) offset = 0; // truncated or replaced: read again from the start
  if (size === offset) return { lines: [], offset };
  const fd = openSync(file, "r");
  try {
    const buf = Buffer.alloc(size - offset);
    const n = readSync(fd, buf, 0, buf.length, offset);
    const text = buf.subarray(0, n).toString("utf8");
    const end = text.lastIndexOf("\n");
    if (end < 0) return { lines: [], offset }; // a line still being written
    return { lines: text.slice(0, end).split("\n"), offset: offset + Buffer.byteLength(text.slice(0, end + 1)) };
  } finally {
    closeSync(fd);
  }
}

/** Parses one metrics.jsonl line: the record, or why it is not one. */
export function parseMetricsLine(line: string): DashMetrics | string {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (e) {
    return `not JSON (${(e as Error).message})`;
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) return "not a JSON object";
  const rec = v as Record<string, unknown>;
  if (typeof rec.step !== "number" || !Number.isFinite(rec.step)) return "field 'step' is missing or not a number";
  const out: DashMetrics = {};
  for (const [k, x] of Object.entries(rec)) {
    if (typeof x === "number") out[k] = x;
    else if (Array.isArray(x) && x.every((y) => typeof y === "number")) out[k] = x as number[];
  }
  return out;
}

/** A followed run directory. */
export interface RunFeed {
  /** The run as read so far. */
  readonly run: DashRun;
  stop(): void;
}

/**
 * Opens `dir` (relative paths against `cwd`) and calls `onChange` with the run after each read that
 * changed it (new lines, a new error). The first read happens before this returns.
 */
export function followRun(dir: string, onChange: (run: DashRun) => void, cwd = process.cwd()): RunFeed {
  const abs = resolve(cwd, dir);
  const file = join(abs, "metrics.jsonl");
  const run: DashRun = { dir: abs, metrics: [], error: null };
  let offset = 0;
  let lineNo = 0;
  let bad: string | null = null;
  let badCount = 0;
  let watcher: FSWatcher | null = null;

  const read = (): boolean => {
    const before = { n: run.metrics.length, error: run.error };
    if (!existsSync(abs)) run.error = `run directory ${abs} does not exist`;
    else if (!statSync(abs).isDirectory()) run.error = `${abs} is not a directory (give the run directory that holds metrics.jsonl)`;
    else if (!existsSync(file)) run.error = `no metrics.jsonl in ${abs} yet (an ooze train run directory has one after its first step)`;
    else {
      const got = readAppended(file, offset);
      offset = got.offset;
      for (const line of got.lines) {
        lineNo++;
        if (line.trim() === "") continue;
        const m = parseMetricsLine(line);
        if (typeof m === "string") {
          badCount++;
          bad ??= `${file} line ${lineNo}: ${m}`;
        } else run.metrics.push(m);
      }
      run.error = bad === null ? null : `${bad}${badCount > 1 ? ` (and ${badCount - 1} more malformed line${badCount > 2 ? "s" : ""})` : ""}; showing the ${run.metrics.length} good line${run.metrics.length === 1 ? "" : "s"}`;
      if (run.metrics.length === 0 && bad === null) run.error = `${file} has no steps yet`;
    }
    return run.metrics.length !== before.n || run.error !== before.error;
  };

  read();
  if (existsSync(abs) && statSync(abs).isDirectory()) {
    try {
      watcher = watch(abs, (_event, name) => {
        if (name !== null && name !== "metrics.jsonl") return;
        try {
          if (read()) onChange(run);
        } catch (e) {
          run.error = `reading ${file}: ${(e as Error).message}`;
          onChange(run);
        }
      });
      watcher.on("error", () => undefined);
    } catch {
      // no watcher (e.g. too many watches): the first read stands
    }
  }
  return {
    run,
    stop: () => watcher?.close(),
  };
}
