// The agent sandbox when ooze is not root: bubblewrap then makes a user namespace as ooze's own uid
// (no setpriv, no uid of its own), and the sandbox must still hide ooze's files, its processes and
// the host's loopback, keep the system read-only and bound the process count. The suite runs as
// root, so this test runs test/fixtures/sandbox-nonroot.mts as `nobody` (setpriv), or as itself
// when it is not root; each case is a command that tries one thing (docs/sandbox.md).
import { execFileSync, spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";

const root = process.getuid?.() === 0;
const asUser = root ? ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all"] : [];

/** Why the fixture cannot run as nobody here (the checkout under a directory nobody may not enter), or null. */
function unreachable(): string | null {
  if (!root) return null;
  const r = spawnSync(asUser[0]!, [...asUser.slice(1), "test", "-r", "package.json", "-a", "-x", "node_modules/.bin"], { encoding: "utf8" });
  return r.status === 0 ? null : `user nobody cannot read this checkout (${process.cwd()}): the non-root sandbox is checked only from a checkout other users may read`;
}

describe("the agent sandbox with ooze as an unprivileged user", () => {
  it("hides ooze's files, processes and loopback, keeps the system read-only and bounds the processes", (ctx) => {
    const why = unreachable();
    if (why) {
      console.warn(`sandbox-nonroot: skipped: ${why}`);
      ctx.skip();
    }
    const cmd = [...asUser, process.execPath, "--import", "tsx", "test/fixtures/sandbox-nonroot.mts"];
    const out = execFileSync(cmd[0]!, cmd.slice(1), { encoding: "utf8", env: { ...process.env, HOME: "/tmp" }, timeout: 120_000 });
    const r = JSON.parse(out.trim().split("\n").at(-1)!) as {
      uid: number; ids: unknown; victimAlive: boolean; planted: boolean; outFile: boolean;
      results: Record<string, { exitCode: number | null; stdout: string; stderr: string }>;
    };
    const c = r.results;
    expect(r.uid).not.toBe(0);
    expect(r.ids).toBeNull(); // not root: the sandbox runs as ooze's own uid, in a user namespace
    // a well-behaved command works in its workdir, as ooze's uid
    expect(c.good).toMatchObject({ exitCode: 0, stdout: `hello\n${r.uid}` });
    expect(r.outFile).toBe(true);
    // ooze's private files are not there
    expect(c.readSecret!.exitCode).not.toBe(0);
    expect(c.readSecret!.stderr).toMatch(/No such file or directory/);
    // a process outside can be neither seen nor signalled
    expect(c.signalOutside!.stdout).not.toContain("BREACH");
    expect(c.seeOutside!.stdout).not.toContain("BREACH");
    expect(r.victimAlive).toBe(true);
    // writes outside the workdir: the host's /tmp is a private one, the root and the system read-only
    expect(c.writeHostTmp!.stdout).toBe("wrote");
    expect(r.planted).toBe(false);
    expect(c.writeRoot!.stdout).not.toContain("BREACH");
    expect(c.writeRoot!.stderr).toMatch(/Read-only file system/);
    expect(c.writeSystem!.stdout).not.toContain("BREACH");
    expect(c.writeSystem!.stderr).toMatch(/Read-only file system|Permission denied/);
    // the host's loopback is not reachable (network: gateway, no gateway here)
    expect(c.network!.stdout).not.toContain("BREACH");
    expect(c.network!.stderr).toMatch(/connect: /);
    // RLIMIT_NPROC (pids: 64) stops a fork bomb
    expect(c.forkBomb!.stdout).not.toContain("BREACH");
    expect(c.forkBomb!.stderr).toMatch(/Cannot fork|Resource temporarily unavailable/);
  }, 150_000);
});
