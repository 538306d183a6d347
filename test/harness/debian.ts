// A Debian package's program for tests that need one (chromium, prometheus): found, or installed with
// apt-get when missing and running as root; otherwise the reason the test is skipped.
import { execFileSync, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";

/** The first existing path of `paths`, after `apt-get install -y PKG` when none exists and we are root. */
export function debianProgram(pkg: string, paths: readonly string[]): { path: string } | { skip: string } {
  const found = () => paths.find((p) => existsSync(p));
  let path = found();
  if (path) return { path };
  if (process.getuid?.() !== 0) return { skip: `${pkg} is not installed and this is not root (install it: apt-get install -y ${pkg})` };
  try {
    execFileSync("apt-get", ["update"], { stdio: "ignore", timeout: 300_000 });
    execFileSync("apt-get", ["install", "-y", pkg], { stdio: "ignore", timeout: 600_000, env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
  } catch (e) {
    return { skip: `${pkg} is not installed and 'apt-get install -y ${pkg}' failed: ${(e as Error).message.split("\n")[0]}` };
  }
  path = found();
  return path ? { path } : { skip: `apt-get installed ${pkg} but none of ${paths.join(", ")} exists` };
}

/** Debian's chromium for the browser tests. */
export function chromium(): { path: string } | { skip: string } {
  return debianProgram("chromium", ["/usr/bin/chromium", "/usr/bin/chromium-browser"]);
}

/** Stops a child: `signal`, then SIGKILL after killAfterMs; resolves when it has exited. */
export async function stopChild(child: ChildProcess | undefined, signal: NodeJS.Signals, killAfterMs: number): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill(signal);
  const killer = setTimeout(() => child.kill("SIGKILL"), killAfterMs);
  await exited;
  clearTimeout(killer);
}
