// The per-episode sandbox of agent and reward commands, made with bubblewrap (Debian's `bubblewrap`):
// its own mount, PID, IPC, UTS and (unless `network: host`) network namespaces; the system
// read-only, the workdir and a private /tmp writable, nothing else of the machine's files. When ooze
// runs as root, bwrap runs as root (so it can bind paths under directories only root may enter) and
// util-linux's `setpriv` then becomes a fresh unprivileged uid with no capabilities, before anything
// of the agent's runs; otherwise bwrap makes a user namespace as ooze's user. Then rlimits set by
// util-linux's `prlimit`,
// and the init script (sandbox-init.ts) that forwards 127.0.0.1:PORT to the episode's gateway socket,
// starts the command, and ends every process of the sandbox with it. Why bubblewrap rather than
// `unshare` and how it is checked: docs/sandbox.md.
import { spawnSync } from "node:child_process";
import { randomInt } from "node:crypto";
import { chmodSync, existsSync, lstatSync, mkdtempSync, readlinkSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, isAbsolute, join, resolve } from "node:path";
import { OozeError } from "../../../src/errors.ts";
import type { SandboxConfig } from "../../protocol/agent-config.ts";
import { SANDBOX_INIT } from "./sandbox-init.ts";

/** The settings of a sandbox that is on (`sandbox: none` is handled by the caller). */
export type SandboxSettings = Exclude<SandboxConfig, "none">;

/** The programs a sandbox needs, found on PATH or in the usual directories. */
export interface SandboxTools {
  bwrap: string;
  prlimit: string;
  perl: string;
  setpriv: string;
}

/** System directories shown read-only (those that exist; a symlink such as merged-usr's /bin stays a symlink). */
const SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"];
const SEARCH = ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"];
/** Where the gateway socket appears inside the sandbox. */
export const SANDBOX_GATEWAY_SOCKET = "/.ooze/gateway.sock";

function which(name: string): string | null {
  const dirs = [...(process.env.PATH ?? "").split(delimiter).filter((d) => d !== ""), ...SEARCH];
  for (const d of dirs) {
    const p = join(d, name);
    try {
      if (statSync(p).isFile()) return p;
    } catch {
      // not here
    }
  }
  return null;
}

const INSTALL = "install it (Debian/Ubuntu: apt-get install bubblewrap util-linux perl-base; scripts/setup.sh installs bubblewrap)";
const NONE = "or set train.agent.sandbox: none in the topology to run agents unconfined (not advised: they can then read ooze's files and the NATS token)";

let tools: SandboxTools | null = null;

/** The sandbox's programs (looked up once); throws SANDBOX_UNAVAILABLE naming the one missing and how to install it. */
export function sandboxTools(): SandboxTools {
  if (tools) return tools;
  const found = { bwrap: which("bwrap"), prlimit: which("prlimit"), perl: which("perl"), setpriv: which("setpriv") };
  const missing = Object.entries(found).filter(([, p]) => p === null).map(([k]) => k);
  if (missing.length > 0) throw new OozeError("SANDBOX_UNAVAILABLE", `the agent sandbox needs ${missing.join(", ")}, not found on PATH; ${INSTALL}, ${NONE}`);
  const t = found as SandboxTools;
  tools = t;
  return t;
}

/** The uid and gid of one sandbox: a fresh unprivileged id when ooze runs as root, else ooze's own (null: no switch). */
export function sandboxIds(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  // Far above the ids of real users and of subuid ranges; one per episode, so RLIMIT_NPROC counts
  // only the episode's own processes and no two episodes share an owner.
  const id = 1_500_000_000 + randomInt(0, 500_000_000);
  return { uid: id, gid: id };
}

/** What one sandboxed run sees. */
export interface SandboxLayout {
  settings: SandboxSettings;
  tools: SandboxTools;
  /** The agent's working directory (writable, same path inside). */
  workdir: string;
  /** More paths shown read-only / writable at the same path (absolute). */
  readOnly: readonly string[];
  writable: readonly string[];
  /** The episode's gateway socket and the loopback port the agent's URLs name; null: no endpoint. */
  gateway: { socket: string; port: number } | null;
  /** The sandbox's own ids (ooze as root: bwrap runs as root and setpriv drops to them); null: ooze's user, in a user namespace. */
  ids: { uid: number; gid: number } | null;
}

/** The sandbox's argv: bwrap, then prlimit, then the init script, then `command args`. */
export function sandboxArgv(l: SandboxLayout, command: string, args: readonly string[]): string[] {
  const s = l.settings;
  const a: string[] = [l.tools.bwrap, ...(l.ids ? [] : ["--unshare-user"]), "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"];
  if (s.network === "gateway") a.push("--unshare-net");
  a.push("--die-with-parent", "--new-session", "--hostname", "ooze-sandbox");
  // As root: keep only what setpriv needs to become the sandbox's uid (it then drops every capability).
  if (l.ids) a.push("--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID");
  for (const p of SYSTEM) {
    let st;
    try {
      st = lstatSync(p);
    } catch {
      continue;
    }
    if (st.isSymbolicLink()) a.push("--symlink", readlinkSync(p), p);
    else a.push("--ro-bind", p, p);
  }
  // /tmp and /dev/shm: private, in memory, sized; /dev itself (bwrap's tmpfs of device nodes) read-only.
  const tmp = String(s.tmpMB * 1024 * 1024);
  a.push("--proc", "/proc", "--dev", "/dev", "--size", tmp, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", tmp, "--tmpfs", "/tmp");
  a.push("--chmod", "1777", "/tmp", "--chmod", "1777", "/dev/shm"); // as /tmp is anywhere (bwrap as root makes them 0755 root)
  for (const p of l.readOnly) if (!underSystem(p)) a.push("--ro-bind", p, p);
  a.push("--bind", l.workdir, l.workdir);
  for (const p of l.writable) a.push("--bind", p, p);
  if (l.gateway) a.push("--bind", l.gateway.socket, SANDBOX_GATEWAY_SOCKET);
  // The directories bwrap made to hold those mount points copy their source's mode (a 0700 home or
  // mkdtemp directory): let the sandbox's uid through them.
  for (const d of mountParents([...l.readOnly, l.workdir, ...l.writable, ...(l.gateway ? [SANDBOX_GATEWAY_SOCKET] : [])])) a.push("--chmod", "0755", d);
  // The sandbox's root (a tmpfs of bwrap's, holding the mount points) is read-only too.
  a.push("--remount-ro", "/", "--chdir", l.workdir, "--");
  if (l.ids) {
    a.push(l.tools.setpriv, `--reuid=${l.ids.uid}`, `--regid=${l.ids.gid}`, "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs");
  }
  const mb = 1024 * 1024;
  a.push(
    l.tools.prlimit, `--data=${s.memoryMB * mb}`, `--nproc=${s.pids}`, `--cpu=${s.cpuSeconds}`, `--fsize=${s.fileSizeMB * mb}`,
    `--nofile=${s.openFiles}`, `--core=0`, "--",
    l.tools.perl, "-e", SANDBOX_INIT, l.gateway ? SANDBOX_GATEWAY_SOCKET : "", String(l.gateway?.port ?? 0), "--", command, ...args,
  );
  return a;
}

/** The directories above the mounted paths that bwrap creates (not "/" or /tmp, not mounted themselves, not under the system). */
function mountParents(paths: readonly string[]): string[] {
  const mounted = new Set(paths);
  const out = new Set<string>();
  for (const p of paths) {
    if (underSystem(p)) continue;
    for (let d = dirname(p); d !== "/" && d !== "." && d !== "/tmp" && !mounted.has(d); d = dirname(d)) out.add(d);
  }
  return [...out].sort();
}

function underSystem(p: string): boolean {
  return SYSTEM.some((s) => p === s || p.startsWith(`${s}/`));
}

/**
 * The paths an agent command needs to run, shown read-only: the Node installation ooze runs on (so
 * `node` agents work wherever Node lives), the command's directory and that of its first argument
 * when either is an absolute path to a file outside the system (`node /x/agent.mjs`), with the
 * nearest node_modules above each, then `readOnlyPaths`. Nothing else of the machine's files.
 */
export function programPaths(command: string, args: readonly string[], extra: readonly string[]): string[] {
  const out = new Set<string>();
  const nodeHome = dirname(dirname(process.execPath));
  if (!underSystem(process.execPath)) out.add(nodeHome);
  const programs = [command, args[0] ?? ""].filter((p) => isAbsolute(p) && isFile(p) && !underSystem(p) && !p.startsWith(`${nodeHome}/`));
  for (const program of programs) {
    const dir = dirname(program);
    out.add(dir);
    for (let d = dir; ; d = dirname(d)) {
      const nm = join(d, "node_modules");
      if (existsSync(nm)) {
        out.add(nm);
        break;
      }
      if (dirname(d) === d) break;
    }
  }
  for (const p of extra) out.add(p);
  return [...out].filter((p) => existsSync(p));
}

function isFile(p: string): boolean {
  try {
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

/** `readOnlyPaths` / `writablePaths` resolved against the topology's directory; a missing one is a config error naming it. */
export function resolvePaths(paths: readonly string[], baseDir: string, field: string): string[] {
  return paths.map((p) => {
    const abs = isAbsolute(p) ? p : resolve(baseDir, p);
    if (!existsSync(abs)) throw new OozeError("CONFIG_INVALID", `train.agent.sandbox.${field}: '${p}' (${abs}) does not exist; list paths that exist, relative to the topology's directory`);
    return abs;
  });
}

let probed: string | null | undefined;

/**
 * Checks once per process that this machine can make the sandbox (bwrap with every namespace, as the
 * uid episodes get); throws SANDBOX_UNAVAILABLE saying what is missing and how to allow it.
 */
export function assertSandboxWorks(): void {
  if (probed === undefined) probed = probe();
  if (probed !== null) throw new OozeError("SANDBOX_UNAVAILABLE", probed);
}

function probe(): string | null {
  let t: SandboxTools;
  try {
    t = sandboxTools();
  } catch (e) {
    return (e as Error).message;
  }
  const ids = sandboxIds();
  const settings: SandboxSettings = { network: "gateway", memoryMB: 1024, pids: 64, cpuSeconds: 10, fileSizeMB: 1, openFiles: 64, tmpMB: 1, outputMB: 1, readOnlyPaths: [], writablePaths: [] };
  const dir = mkdtempSync(join(tmpdir(), "ooze-sandbox-probe-"));
  let r;
  try {
    chmodSync(dir, 0o755);
    const argv = sandboxArgv({ settings, tools: t, workdir: dir, readOnly: [], writable: [], gateway: null, ids }, "true", []);
    r = spawnSync(argv[0]!, argv.slice(1), { stdio: ["ignore", "pipe", "pipe", "pipe"], timeout: 10_000, encoding: "utf8" });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  if (r.status === 0 && String(r.output[3] ?? "").startsWith("exit 0")) return null;
  const why = `${r.error?.message ?? ""}${r.stderr ?? ""}`.trim().split("\n").slice(-3).join("; ");
  return (
    `this machine cannot make the agent sandbox: '${t.bwrap} ${ids ? "" : "--unshare-user "}--unshare-pid --unshare-net …' failed${ids ? ` (as root, then setpriv to uid ${ids.uid})` : ""}: ${why || `exit ${r.status}`}. ` +
    "As root it needs namespaces (a container's seccomp profile must allow them); as another user, unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 (Debian), user.max_user_namespaces > 0, " +
    "kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 24.04+); in a container, run it with a seccomp profile that allows unshare/clone with namespaces " +
    `(docker run --security-opt seccomp=unconfined) ${NONE}`
  );
}
