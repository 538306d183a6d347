// The report of a fault run: the schedule played, what the player did, each invariant's verdict,
// the logs of the processes involved, and the command or seed/path that replays it; as text for a
// terminal and as JSON for a file (which `replaySchedule` reads back, validated).
import { readFileSync, writeFileSync } from "node:fs";
import { OozeError } from "../errors.ts";
import { parseFaultSchedule, type AppliedFault, type FaultSpec } from "./faults.ts";
import type { Verdict } from "./invariants.ts";

/** Everything one fault run produced. */
export interface FaultReport {
  schedule: FaultSpec[];
  applied: AppliedFault[];
  verdicts: Verdict[];
  /** Output of each process involved (last lines), by name. */
  logs: Record<string, string>;
  /** The fast-check seed and path that reproduce the schedule, when it came from an arbitrary. */
  seed: number | null;
  path: string | null;
  /** A command that replays it, when there is one. */
  replay: string | null;
}

/** Whether every invariant held. */
export function reportOk(r: FaultReport): boolean {
  return r.verdicts.every((v) => v.ok);
}

/** A faulted spec in one line: "pause rollout at 1200 ms for 800 ms". */
export function describeFault(f: FaultSpec): string {
  switch (f.kind) {
    case "kill":
      return `${f.signal} ${f.target} at ${f.at} ms`;
    case "pause":
      return `pause ${f.target} at ${f.at} ms for ${f.forMs} ms`;
    case "nats-restart":
      return `restart nats-server${f.server !== undefined ? ` ${f.server}` : ""} at ${f.at} ms (down ${f.downMs} ms)`;
    case "cut":
      return `cut ${f.link} at ${f.at} ms for ${f.forMs} ms`;
    case "engine":
      return `engine ${f.engine}: ${f.fault.kind ?? "none"}${f.fault.rate !== undefined ? ` on ${Math.round(f.fault.rate * 100)} %` : ""} at ${f.at} ms for ${f.forMs} ms`;
    case "actor":
      return `crash actor ${f.target} at ${f.at} ms`;
    case "command":
      return `command ${f.command}: ${f.fault} at ${f.at} ms for ${f.forMs} ms`;
    case "disk-full":
      return `disk ${f.disk} full at ${f.at} ms for ${f.forMs} ms`;
  }
}

/** The report as text: verdicts first, then the schedule, the replay, and the logs' last `logLines` lines (default 20; 0: none). */
export function formatReport(r: FaultReport, opts: { logLines?: number } = {}): string {
  const out: string[] = [];
  out.push(reportOk(r) ? "all invariants held" : "INVARIANT VIOLATED");
  for (const v of r.verdicts) out.push(`  ${v.ok ? "ok  " : "FAIL"} ${v.name}: ${v.detail}`);
  out.push(`schedule (${r.schedule.length} faults):`);
  for (const f of r.schedule) out.push(`  - ${describeFault(f)}`);
  const failed = r.applied.filter((a) => !a.ok);
  if (failed.length) out.push(`faults that could not be injected: ${failed.map((a) => `${a.action} (${a.error})`).join("; ")}`);
  if (r.seed !== null) out.push(`seed ${r.seed}${r.path !== null ? `, path ${r.path}` : ""}`);
  if (r.replay !== null) out.push(`replay: ${r.replay}`);
  const n = opts.logLines ?? 20;
  for (const [name, text] of n > 0 ? Object.entries(r.logs) : []) {
    const lines = text.trimEnd().split("\n");
    out.push(`--- ${name} (last ${Math.min(n, lines.length)} of ${lines.length} lines)`);
    out.push(...lines.slice(-n));
  }
  return out.join("\n");
}

/** Writes the report as JSON. */
export function writeReport(path: string, r: FaultReport): void {
  writeFileSync(path, `${JSON.stringify(r, null, 2)}\n`);
}

/** The schedule of a report file (or of a bare schedule file), validated; errors name the file and field. */
export function replaySchedule(path: string): FaultSpec[] {
  let json: unknown;
  try {
    json = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `${path}: cannot read a schedule (${(e as Error).message})`);
  }
  const body = json && typeof json === "object" && !Array.isArray(json) && "schedule" in json ? (json as { schedule: unknown }).schedule : json;
  return parseFaultSchedule(body, `${path}: schedule`);
}
