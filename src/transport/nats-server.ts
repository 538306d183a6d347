// An embedded nats-server child process: JetStream on, loopback, auth token, temp store. Started
// through a tiny shell watchdog in its own process group, so it dies with its parent even when the
// parent is SIGKILLed; stopped on process exit and on SIGINT/SIGTERM when nobody else handles them.
// With `users`, the token gives way to named users: one unrestricted (ooze's own) and each given
// one with its publish/subscribe allow lists (permissions.ts: a job's node processes).
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants as fsConstants, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { OozeError } from "../errors.ts";
import { markOwner, sweepDeadOwners } from "../owned-dirs.ts";
import type { NatsPermissions } from "./permissions.ts";

/** A user of the embedded server, confined to its permissions. */
export interface NatsUser {
  user: string;
  password: string;
  permissions: NatsPermissions;
}

/** Name of the unrestricted user when the server has `users` (its password is the handle's `token`). */
export const ADMIN_USER = "ooze";

/** Options of `startNatsServer`. */
export interface NatsServerOptions {
  /** Client port; default: a free port chosen by the server (`-p -1`). */
  port?: number;
  /** Bind address; default 127.0.0.1. */
  host?: string;
  /** JetStream store directory; default: a fresh temp dir, removed by `stop()`. */
  storeDir?: string;
  /** Auth token clients must present; default: 32 random bytes as hex. With `users`, the password of the unrestricted user `ooze` instead. */
  token?: string;
  /**
   * Named users confined to their permissions. nats-server allows no token beside users, so with
   * them the unrestricted client is the user `ooze` (ADMIN_USER) whose password is `token`.
   */
  users?: readonly NatsUser[];
  /** Largest message the server accepts, in bytes; default 8 MiB; null keeps the server's own default (1 MiB). */
  maxPayload?: number | null;
  /** Enable JetStream (default true). */
  jetstream?: boolean;
  /** Path of the nats-server binary; default: searched in `searchDirs`. */
  binary?: string;
  /** Directories searched for `nats-server`; default: $PATH, /usr/sbin, /usr/local/bin, /usr/bin. */
  searchDirs?: readonly string[];
  /** How long to wait for "Server is ready" (default 20 s). */
  readyTimeoutMs?: number;
  /** Server name, unique within a cluster (JetStream clustering needs one); default: the server's own. */
  serverName?: string;
  /** Makes this server one of a cluster: its route listener and the routes to the others. */
  cluster?: NatsClusterOptions;
  /** Port of the HTTP monitoring endpoint (/varz, /connz, /jsz) on `host`; default: none. */
  monitorPort?: number;
  /** TLS for clients: the server's certificate and key; with `caFile` and `verify`, clients must present a certificate of that CA. */
  tls?: { certFile: string; keyFile: string; caFile?: string; verify?: boolean };
}

/** The cluster part of a server's configuration (all servers of a cluster share `name`, `user` and `pass`). */
export interface NatsClusterOptions {
  /** Cluster name. */
  name: string;
  /** Port this server listens on for routes from the others (on the server's host). */
  port: number;
  /** Route URLs of the other servers (`nats-route://host:port`; the credentials are added). */
  routes: readonly string[];
  /** Credentials routes present to each other. */
  user: string;
  pass: string;
  /**
   * The route address this server tells the others it has (`host:port`; default its listen
   * address). They dial it only for routes they were not configured with (gossip); a test cluster
   * whose configured routes pass through proxies gives an address nothing listens on, so that no
   * route goes around them.
   */
  advertise?: string;
}

/** A running embedded nats-server. */
export interface NatsServerHandle {
  /** `nats://host:port` (no credentials). */
  readonly url: string;
  /** `nats://token@host:port` (`nats://ooze:token@host:port` with users): what `connectBus({url})` accepts as one string. */
  readonly authUrl: string;
  /** The token; with `users`, the password of the unrestricted user `user`. */
  readonly token: string;
  /** The unrestricted user's name (ADMIN_USER) when the server has `users`; null with token auth. */
  readonly user: string | null;
  readonly host: string;
  readonly port: number;
  readonly storeDir: string;
  /** The configured max_payload (1 MiB when the server default is kept). */
  readonly maxPayload: number;
  /** Pid of the nats-server process (changes on restart). */
  readonly pid: number;
  /** Whether the server process is alive. */
  readonly running: boolean;
  /** Path of the binary in use. */
  readonly binary: string;
  /** The last lines the server wrote to stderr. */
  logTail(): string;
  /** Graceful stop (SIGTERM, then SIGKILL after 10 s); removes the temp store it created. Idempotent. */
  stop(): Promise<void>;
  /** Sends a signal to the nats-server process (a fault injector: "SIGKILL" simulates a crash). */
  kill(signal?: NodeJS.Signals): void;
  /** Waits until the server process has exited (after kill or a crash). */
  waitExit(): Promise<void>;
  /** Stops (if running) and starts again on the same port with the same store and token. */
  restart(): Promise<void>;
}

const DEFAULT_SEARCH = ["/usr/sbin", "/usr/local/bin", "/usr/bin", "/usr/local/sbin"];
const MISSING_HELP =
  "install the Debian package nats-server (apt-get install nats-server), or pass --nats URL / set OOZE_NATS_URL to use a running NATS server";

/** Finds the nats-server binary; throws OozeError("NATS_SERVER_MISSING") with the fix. */
export function findNatsServer(opts: { binary?: string; searchDirs?: readonly string[] } = {}): string {
  if (opts.binary !== undefined) {
    if (isExecutable(opts.binary)) return opts.binary;
    throw new OozeError("NATS_SERVER_MISSING", `nats-server binary '${opts.binary}' does not exist or is not executable; ${MISSING_HELP}`);
  }
  const dirs = opts.searchDirs ?? [...(process.env.PATH ?? "").split(delimiter).filter((d) => d.length > 0), ...DEFAULT_SEARCH];
  for (const dir of dirs) {
    const p = join(dir, "nats-server");
    if (isExecutable(p)) return p;
  }
  throw new OozeError("NATS_SERVER_MISSING", `nats-server not found (searched ${dirs.length === 0 ? "no directories" : dirs.join(", ")}); ${MISSING_HELP}`);
}

function isExecutable(p: string): boolean {
  try {
    accessSync(p, fsConstants.X_OK);
    return true;
  } catch {
    return false;
  }
}

// The watchdog: runs the server in the background, prints its pid, forwards TERM/INT/HUP, exits as
// soon as the server does, and (in a polling subshell) kills the server when the shell's parent, the
// node process, disappears: reparenting shows in /proc/$$/stat.
const WATCHDOG = `
parent=$1; shift
"$@" &
child=$!
echo "ooze-nats-pid $child"
alive() {
  if [ -r /proc/$$/stat ]; then read -r _ _ _ pp _ < /proc/$$/stat; [ "$pp" = "$parent" ]; else kill -0 "$parent" 2>/dev/null; fi
}
(
  while kill -0 $child 2>/dev/null; do
    if ! alive; then
      kill -TERM $child 2>/dev/null
      i=0
      while kill -0 $child 2>/dev/null && [ $i -lt 20 ]; do sleep 0.25; i=$((i+1)); done
      kill -KILL $child 2>/dev/null
      exit 0
    fi
    sleep 1
  done
) &
watcher=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT HUP
while kill -0 $child 2>/dev/null; do wait $child; done
kill $watcher 2>/dev/null
`;

interface Proc {
  child: ChildProcess;
  pid: number;
  exited: Promise<void>;
  alive: boolean;
}

const live = new Set<{ killNow(): void }>();
let hooksInstalled = false;

function installHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on("exit", () => {
    for (const s of live) s.killNow();
  });
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    const onSignal = () => {
      // Someone else handles this signal (e.g. a CLI draining actors): leave the decision to them;
      // the exit hook and the watchdog still stop the server.
      if (process.listenerCount(sig) > 1) return;
      for (const s of live) s.killNow();
      process.removeListener(sig, onSignal);
      process.kill(process.pid, sig);
    };
    process.on(sig, onSignal);
  }
}

/** Starts nats-server and resolves once it accepts clients; rejects with the server's stderr tail. */
export async function startNatsServer(opts: NatsServerOptions = {}): Promise<NatsServerHandle> {
  const binary = findNatsServer(opts);
  const host = opts.host ?? "127.0.0.1";
  const token = opts.token ?? randomBytes(32).toString("hex");
  const maxPayload = opts.maxPayload === undefined ? 8 * 1024 * 1024 : opts.maxPayload;
  const jetstream = opts.jetstream ?? true;
  const readyTimeoutMs = opts.readyTimeoutMs ?? 20_000;
  // The config (with the token) lives in a directory only this user reads (mkdtemp: 0700), removed at
  // stop; what a SIGKILLed job left is removed here, by the next start (owned-dirs.ts).
  sweepDeadOwners("ooze-nats-");
  const workDir = mkdtempSync(join(tmpdir(), "ooze-nats-"));
  markOwner(workDir);
  const ownStore = opts.storeDir === undefined;
  const storeDir = opts.storeDir ?? join(workDir, "store");
  const confPath = join(workDir, "nats.conf");
  // The token goes in the config file (mode 0600, private dir), not on the command line where any
  // local user could read it with ps.
  const users = opts.users ?? null;
  const conf = [users === null ? `authorization { token: ${JSON.stringify(token)} }` : usersConf(token, users)];
  if (maxPayload !== null) conf.push(`max_payload: ${maxPayload}`);
  if (opts.serverName !== undefined) conf.push(`server_name: ${JSON.stringify(opts.serverName)}`);
  if (opts.cluster !== undefined) conf.push(clusterConf(opts.cluster, host));
  if (opts.monitorPort !== undefined) conf.push(`http: ${JSON.stringify(`${host}:${opts.monitorPort}`)}`);
  if (opts.tls !== undefined) {
    const t = opts.tls;
    const ca = t.caFile !== undefined ? `, ca_file: ${JSON.stringify(t.caFile)}` : "";
    conf.push(`tls { cert_file: ${JSON.stringify(t.certFile)}, key_file: ${JSON.stringify(t.keyFile)}${ca}, verify: ${t.verify === true} }`);
  }
  writeFileSync(confPath, `${conf.join("\n")}\n`, { mode: 0o600 });
  let port = opts.port ?? -1;
  let log = "";
  const appendLog = (s: string) => {
    log = (log + s).slice(-16_384);
  };
  let proc: Proc | null = null;
  let stopped = false;

  const launch = async (): Promise<Proc> => {
    const args = ["-c", confPath, "-a", host, "-p", String(port)];
    if (jetstream) args.push("-js", "-sd", storeDir);
    const child = spawn("/bin/sh", ["-c", WATCHDOG, "ooze-nats-watchdog", String(process.pid), binary, ...args], {
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    const p: Proc = { child, pid: -1, exited, alive: true };
    void exited.then(() => {
      p.alive = false;
    });
    child.on("error", (e) => appendLog(`spawn error: ${e.message}\n`));
    let stdoutBuf = "";
    let stderrBuf = "";
    let listening: number | null = null;
    let ready = false;
    let onProgress = () => {};
    child.stdout!.setEncoding("utf8").on("data", (s: string) => {
      stdoutBuf += s;
      const m = /ooze-nats-pid (\d+)/.exec(stdoutBuf);
      if (m) p.pid = Number(m[1]);
      onProgress();
    });
    child.stderr!.setEncoding("utf8").on("data", (s: string) => {
      appendLog(s);
      if (ready) return;
      stderrBuf += s;
      const m = /Listening for client connections on [^\s]*:(\d+)/.exec(stderrBuf);
      if (m) listening = Number(m[1]);
      if (/Server is ready/.test(stderrBuf)) ready = true;
      onProgress();
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        killGroup(child, "SIGKILL");
        reject(failed(`nats-server did not become ready within ${readyTimeoutMs} ms`));
      }, readyTimeoutMs);
      onProgress = () => {
        if (ready && listening !== null && p.pid > 0) {
          clearTimeout(timer);
          resolve();
        }
      };
      void exited.then(() => {
        clearTimeout(timer);
        reject(failed(`nats-server exited before it was ready (exit code ${child.exitCode}, signal ${child.signalCode})`));
      });
    });
    port = listening!;
    // Never keep the parent alive for the server's sake; the exit hook stops it.
    child.unref();
    (child.stdout as unknown as { unref?: () => void }).unref?.();
    (child.stderr as unknown as { unref?: () => void }).unref?.();
    return p;
  };

  const failed = (what: string) =>
    new OozeError("NATS_SERVER_FAILED", `${what} (${binary} on ${host}:${port}, store ${storeDir}); last output:\n${tail(log)}`);

  const entry = {
    killNow: () => {
      if (proc?.alive) {
        killPid(proc.pid, "SIGTERM");
        killGroup(proc.child, "SIGTERM");
      }
    },
  };

  const stopProc = async (): Promise<void> => {
    const p = proc;
    if (p === null || !p.alive) return;
    killPid(p.pid, "SIGTERM");
    const timer = setTimeout(() => {
      killPid(p.pid, "SIGKILL");
      killGroup(p.child, "SIGKILL");
    }, 10_000);
    await p.exited;
    clearTimeout(timer);
  };

  installHooks();
  live.add(entry);
  try {
    proc = await launch();
  } catch (e) {
    live.delete(entry);
    rmSync(workDir, { recursive: true, force: true });
    throw e;
  }

  const handle: NatsServerHandle = {
    get url() {
      return `nats://${host}:${port}`;
    },
    get authUrl() {
      return users === null ? `nats://${token}@${host}:${port}` : `nats://${ADMIN_USER}:${encodeURIComponent(token)}@${host}:${port}`;
    },
    token,
    user: users === null ? null : ADMIN_USER,
    host,
    get port() {
      return port;
    },
    storeDir,
    maxPayload: maxPayload ?? 1024 * 1024,
    get pid() {
      return proc?.pid ?? -1;
    },
    get running() {
      return proc?.alive ?? false;
    },
    binary,
    logTail: () => tail(log),
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await stopProc();
      live.delete(entry);
      rmSync(workDir, { recursive: true, force: true }); // the config, and the store when it is ours
    },
    kill: (signal: NodeJS.Signals = "SIGKILL") => {
      if (proc?.alive) killPid(proc.pid, signal);
    },
    waitExit: async () => {
      await proc?.exited;
    },
    restart: async () => {
      if (stopped) throw new OozeError("NATS_SERVER_FAILED", `nats-server on port ${port} was stopped; restart() needs a live handle`);
      await stopProc();
      proc = await launch();
    },
  };
  return handle;
}

/** The `authorization {}` block with users: `ooze` unrestricted, each of `users` with its allow lists. */
function usersConf(adminPassword: string, users: readonly NatsUser[]): string {
  const q = JSON.stringify;
  const list = (xs: readonly string[]) => `[${xs.map((x) => q(x)).join(", ")}]`;
  const names = new Set([ADMIN_USER]);
  const lines = [`    { user: ${q(ADMIN_USER)}, password: ${q(adminPassword)} }`];
  for (const u of users) {
    if (names.has(u.user)) throw new OozeError("CONFIG_INVALID", `nats-server user '${u.user}' is given twice (or is the reserved '${ADMIN_USER}')`);
    names.add(u.user);
    const p = u.permissions;
    const deny = p.publishDeny.length > 0 ? `, deny: ${list(p.publishDeny)}` : "";
    const perms = `publish: { allow: ${list(p.publish)}${deny} }, subscribe: { allow: ${list(p.subscribe)} }${p.allowResponses ? ", allow_responses: true" : ""}`;
    lines.push(`    { user: ${q(u.user)}, password: ${q(u.password)}, permissions: { ${perms} } }`);
  }
  return ["authorization {", "  users: [", ...lines, "  ]", "}"].join("\n");
}

/** The `cluster {}` block: routes listen on host:port, authenticate with user/pass, and reach the others. */
function clusterConf(c: NatsClusterOptions, host: string): string {
  const cred = `${encodeURIComponent(c.user)}:${encodeURIComponent(c.pass)}@`;
  const routes = c.routes.map((r) => JSON.stringify(r.replace(/^(nats-route:\/\/)/, `$1${cred}`)));
  return [
    "cluster {",
    `  name: ${JSON.stringify(c.name)}`,
    `  listen: ${JSON.stringify(`${host}:${c.port}`)}`,
    `  authorization { user: ${JSON.stringify(c.user)}, password: ${JSON.stringify(c.pass)} }`,
    `  routes: [${routes.join(", ")}]`,
    ...(c.advertise !== undefined ? [`  advertise: ${JSON.stringify(c.advertise)}`] : []),
    "}",
  ].join("\n");
}

/**
 * A free TCP port on 127.0.0.1 for a server that must know its port before it starts (a cluster's
 * routes) and bind it again after a restart. It is drawn below the kernel's ephemeral range
 * (/proc/sys/net/ipv4/ip_local_port_range), where no outgoing connection or port-0 listener is given
 * a port: an OS-assigned port, once released, went to a client connection's source port before the
 * server bound it ("bind: address already in use", fresh-clone CI, Nov 28).
 */
export async function freePort(): Promise<number> {
  const low = ephemeralLow();
  if (low > 11_000) {
    for (let attempt = 0; attempt < 64; attempt++) {
      const port = 10_000 + Math.floor(Math.random() * (low - 10_000));
      if (await canBind(port)) return port;
    }
  }
  return bindAny();
}

/** The first port of the kernel's ephemeral range (32768 where it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 0 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

function canBind(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
}

function bindAny(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr !== null ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

function killPid(pid: number, signal: NodeJS.Signals): void {
  if (pid <= 0) return;
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}

function tail(s: string, lines = 20): string {
  return s.trimEnd().split("\n").slice(-lines).join("\n");
}
