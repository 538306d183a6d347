// The sweep of temporary directories whose owner process is gone (src/owned-dirs.ts), with real
// processes: a directory owned by a process that exited is removed; one owned by a live process, and
// one with no owner file, are kept; a pid that was reused by another process does not keep it.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { markOwner, sweepDeadOwners } from "../../src/owned-dirs.ts";

const base = mkdtempSync(join(tmpdir(), "ooze-owned-test-"));
afterAll(() => rmSync(base, { recursive: true, force: true }));

it("removes the directories of owners that are gone and keeps the others", () => {
  const mine = mkdtempSync(join(base, "ooze-x-"));
  markOwner(mine);
  const dead = mkdtempSync(join(base, "ooze-x-"));
  const gone = spawnSync("true").pid!; // a process that has exited
  writeFileSync(join(dead, ".owner"), `${gone} 1\n`);
  const reused = mkdtempSync(join(base, "ooze-x-"));
  writeFileSync(join(reused, ".owner"), `${process.pid} 1\n`); // this pid, but not this process's start time
  const unowned = mkdtempSync(join(base, "ooze-x-"));
  const other = mkdtempSync(join(base, "ooze-y-"));
  writeFileSync(join(other, ".owner"), `${gone} 1\n`);
  expect(sweepDeadOwners("ooze-x-", base).sort()).toEqual([dead, reused].sort());
  expect([mine, unowned, other].map(existsSync)).toEqual([true, true, true]);
});
