// The agent episode directories a process made in the temp directory: other jobs and test files
// running on the machine at the same time make their own, so checks of what an episode left behind
// look only at their own process's (each directory's .owner file names its maker's pid).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The episode directories (`ooze-agent-N-…`) in the temp directory that process `pid` made. */
export function episodeDirsOf(pid: number = process.pid): string[] {
  const owner = (d: string) => {
    const f = join(tmpdir(), d, ".owner");
    try {
      return existsSync(f) ? readFileSync(f, "utf8") : "";
    } catch {
      return ""; // removed while reading
    }
  };
  return readdirSync(tmpdir()).filter((d) => /^ooze-agent-\d/.test(d) && owner(d).startsWith(`${pid} `));
}
