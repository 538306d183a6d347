// Job records: `ooze up` writes one file per running job (its NATS URL and credentials, pid, topology) so
// that `ooze ps`, `ooze down` and `ooze engines …` in another terminal can find and reach it.
// Files live in $OOZE_HOME/jobs (default ~/.ooze/jobs), readable by the owner only (they hold the token).
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { OozeError } from "../../src/errors.ts";

/** What another command needs to reach a running job. */
export interface JobRecord {
  job: string;
  natsUrl: string;
  token: string | null;
  /** User and password instead of a token (the embedded server's unrestricted user); absent in older records. */
  user?: string | null;
  password?: string | null;
  pid: number;
  topology: string | null;
  hosts: string[];
  startedAt: string;
}

/** Directory of job records. */
export function jobsDir(): string {
  return join(process.env.OOZE_HOME ?? join(homedir(), ".ooze"), "jobs");
}

export function writeJob(rec: JobRecord): string {
  const dir = jobsDir();
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, `${rec.job}.json`);
  writeFileSync(file, JSON.stringify(rec, null, 2), { mode: 0o600 });
  chmodSync(file, 0o600);
  return file;
}

/** The credentials of a record, as `connectBus` takes them. */
export function recordAuth(rec: Pick<JobRecord, "token" | "user" | "password">): { token?: string; user?: string; pass?: string } {
  if (rec.user && rec.password) return { user: rec.user, pass: rec.password };
  return rec.token ? { token: rec.token } : {};
}

export function removeJob(job: string): void {
  rmSync(join(jobsDir(), `${job}.json`), { force: true });
}

/** Whether a process is running (a zombie, exited but not yet reaped by its parent, is not). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return true; // no /proc: trust kill(0)
  }
}

/** Running jobs, newest first; records of dead processes are removed. */
export function listJobs(): JobRecord[] {
  let files: string[];
  try {
    files = readdirSync(jobsDir()).filter((f) => f.endsWith(".json"));
  } catch {
    return [];
  }
  const out: { rec: JobRecord; mtime: number }[] = [];
  for (const f of files) {
    const path = join(jobsDir(), f);
    try {
      const rec = JSON.parse(readFileSync(path, "utf8")) as JobRecord;
      if (!processAlive(rec.pid)) {
        rmSync(path, { force: true });
        continue;
      }
      out.push({ rec, mtime: statSync(path).mtimeMs });
    } catch {
      // an unreadable record is skipped, not fatal
    }
  }
  return out.sort((a, b) => b.mtime - a.mtime).map((x) => x.rec);
}

/** The job named `job`, or the only/newest running one. Throws with the list when ambiguous. */
export function findJob(job?: string): JobRecord {
  const jobs = listJobs();
  if (job !== undefined) {
    const rec = jobs.find((j) => j.job === job);
    if (!rec)
      throw new OozeError(
        "ACTOR_NOT_FOUND",
        `no running job '${job}' (running: ${jobs.map((j) => j.job).join(", ") || "none"}); start one with 'ooze up FILE'`,
      );
    return rec;
  }
  const first = jobs[0];
  if (!first) throw new OozeError("ACTOR_NOT_FOUND", "no running ooze job found; start one with 'ooze up FILE', or pass --nats URL --job NAME");
  return first;
}
