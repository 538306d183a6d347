// Hosts that are really apart, for tests: Linux network namespaces joined over veth pairs to a bridge
// in the test's own namespace, on a private /24 the test creates (10.203.X.0/24, X chosen free) and
// removes again. Needs root and `ip` (iproute2); `netnsUnavailable()` says why not when it cannot.
// A host's link can be cut (set down) and healed (set up) as a fault injector.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";

/** A private network of namespaced hosts. */
export interface TestNetwork {
  /** The bridge's address, in the test's own namespace (bind servers here). */
  readonly gateway: string;
  /** The hosts: namespace name and address. */
  readonly hosts: readonly { name: string; ns: string; address: string }[];
  /** Arguments that run a command inside host `name`'s namespace: ["ip", "netns", "exec", NS, ...cmd]. */
  exec(name: string, cmd: string[]): string[];
  /** Takes host `name` off the network (its link down) / puts it back. */
  cut(name: string): void;
  heal(name: string): void;
  /** Removes the namespaces, links and bridge. Idempotent. */
  destroy(): void;
}

function ip(...args: string[]): string {
  return execFileSync("ip", args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** Why namespaced test hosts cannot be made here (not root, no `ip`, no permission), or null when they can. */
export function netnsUnavailable(): string | null {
  if (process.platform !== "linux") return `network namespaces need Linux (this is ${process.platform})`;
  if (process.getuid?.() !== 0) return "network namespaces need root (run the tests as root to include them)";
  const probe = `ooze-probe-${randomBytes(3).toString("hex")}`;
  try {
    ip("netns", "add", probe);
    ip("netns", "del", probe);
    return null;
  } catch (e) {
    return `cannot create a network namespace with 'ip netns add' (${(e as Error).message.split("\n")[0]})`;
  }
}

/**
 * Creates namespaces `names` on a fresh bridge; each gets 10.203.X.(i+2), the bridge 10.203.X.1. The
 * subnet is claimed by the bridge's name (oz203sX): creating a link whose name exists fails, so two
 * test files making networks at once (vitest runs files in parallel) never take the same X.
 */
export function createTestNetwork(names: readonly string[]): TestNetwork {
  const tag = randomBytes(2).toString("hex");
  const used = ip("-4", "-o", "addr", "show");
  const created: (() => void)[] = [];
  const destroy = () => {
    for (const undo of created.splice(0).reverse()) {
      try {
        undo();
      } catch {
        // already gone
      }
    }
  };
  let subnet = -1;
  for (let x = 1; x < 255 && subnet < 0; x++) {
    if (used.includes(` 10.203.${x}.`)) continue;
    try {
      ip("link", "add", "name", `oz203s${x}`, "type", "bridge");
      subnet = x;
    } catch (e) {
      if (!/exists/i.test((e as { stderr?: string }).stderr ?? "")) throw e;
    }
  }
  if (subnet < 0) throw new Error("no free 10.203.X.0/24 subnet for the test network");
  const bridge = `oz203s${subnet}`;
  created.push(() => ip("link", "del", bridge));
  const gateway = `10.203.${subnet}.1`;
  const hosts = names.map((name, i) => ({ name, ns: `ooze-${tag}-${name}`, address: `10.203.${subnet}.${i + 2}`, outer: `oz${tag}h${i}`, inner: `oz${tag}n${i}` }));
  try {
    ip("addr", "add", `${gateway}/24`, "dev", bridge);
    ip("link", "set", bridge, "up");
    for (const h of hosts) {
      ip("netns", "add", h.ns);
      created.push(() => ip("netns", "del", h.ns));
      ip("link", "add", h.outer, "type", "veth", "peer", "name", h.inner);
      created.push(() => ip("link", "del", h.outer));
      ip("link", "set", h.inner, "netns", h.ns);
      ip("link", "set", h.outer, "master", bridge);
      ip("link", "set", h.outer, "up");
      ip("-n", h.ns, "addr", "add", `${h.address}/24`, "dev", h.inner);
      ip("-n", h.ns, "link", "set", h.inner, "up");
      ip("-n", h.ns, "link", "set", "lo", "up");
    }
  } catch (e) {
    destroy();
    throw e;
  }
  const find = (name: string) => {
    const h = hosts.find((x) => x.name === name);
    if (!h) throw new Error(`no test host '${name}' (hosts: ${hosts.map((x) => x.name).join(", ")})`);
    return h;
  };
  return {
    gateway,
    hosts: hosts.map(({ name, ns, address }) => ({ name, ns, address })),
    exec: (name, cmd) => ["ip", "netns", "exec", find(name).ns, ...cmd],
    cut: (name) => void ip("link", "set", find(name).outer, "down"),
    heal: (name) => void ip("link", "set", find(name).outer, "up"),
    destroy,
  };
}

/** A process started by a test with its output kept (stdout and stderr together). */
export interface LoggedProcess {
  child: ChildProcess;
  log(): string;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
}

/** Starts `cmd` in `cwd` (OOZE_HOME there too: a host's own directory), keeping its output. */
export function spawnLogged(cmd: string[], cwd: string): LoggedProcess {
  const child = spawn(cmd[0]!, cmd.slice(1), { cwd, env: { ...process.env, OOZE_HOME: cwd }, stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
  return { child, log: () => log, exited };
}

/**
 * A small fully_async training topology across two external hosts: `rollout` (the rollout actor) and
 * `learner` (fleet with one tiny embedded engine bound to `learnerAddress`, buffer, trainer writing
 * to `out`, weight-sync).
 */
export function namespacedTrainTopology(name: string, learnerAddress: string, out: string, steps: number): string {
  return [
    `name: ${name}`,
    "hosts: [{ name: rollout, start: external }, { name: learner, start: external }]",
    "actors:",
    "  - { name: rollout, kind: train.rollout, placement: rollout }",
    `  - { name: fleet, kind: fleet, placement: learner, config: { embedded: { count: 1, preset: tiny, maxRunning: 64, host: "${learnerAddress}" } } }`,
    "  - { name: buffer, kind: train.buffer, placement: learner }",
    `  - { name: trainer, kind: train.trainer, placement: learner, config: { out: ${JSON.stringify(out)} } }`,
    "  - { name: weight-sync, kind: train.weight-sync, placement: learner }",
    `train: { mode: fully_async, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${steps}, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 }`,
  ].join("\n");
}
