// Hosts that are really apart: the echo topology's two hosts run as `ooze node` processes in two
// Linux network namespaces, each in its own working directory with its own copy of the topology,
// reaching a real nats-server over veth and a bridge on a private subnet the test creates
// (test/harness/netns.ts); `ooze up` (hosts external) runs in the test's namespace. Host b is cut off
// the network mid-run (its link down: the pinger's asks time out and it crashes) and healed; the
// pinger then finishes its round trips and `ooze up` stops both remote nodes over NATS. Skipped, with
// the reason, where namespaces cannot be made (not root, no iproute2).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import { startTestNats, waitUntil } from "../harness/index.ts";
import { createTestNetwork, netnsUnavailable, type TestNetwork } from "../harness/netns.ts";

const why = netnsUnavailable();
if (why) console.warn(`netns.test.ts skipped: ${why}`);
const OOZE = resolve("bin/ooze.mjs");
const TOPOLOGY = `name: echo-netns
hosts: [{ name: a, start: external }, { name: b, start: external }]
actors:
  - { name: echo, kind: echo.server, placement: b }
  - { name: pinger, kind: echo.pinger, placement: a, config: { target: echo, count: 20, intervalMs: 200 } }
`;

let net: TestNetwork | null = null;
let server: NatsServerHandle | null = null;
const children: ChildProcess[] = [];
const dirs: string[] = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await server?.stop();
  net?.destroy();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

function start(cmd: string[], cwd: string) {
  const child = spawn(cmd[0]!, cmd.slice(1), { cwd, env: { ...process.env, OOZE_HOME: cwd }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
  return { log: () => log, exited, child };
}

describe.skipIf(why !== null)("hosts in separate network namespaces", () => {
  it("runs a topology across two namespaced hosts with separate directories; a host cut off and healed rejoins", async () => {
    net = createTestNetwork(["a", "b"]);
    server = await startTestNats({ host: net.gateway });
    const url = `nats://${server.token}@${net.gateway}:${server.port}`;
    const own = (name: string) => {
      const d = mkdtempSync(join(tmpdir(), `ooze-netns-${name}-`));
      dirs.push(d);
      writeFileSync(join(d, "echo.yaml"), TOPOLOGY);
      return d;
    };
    const upDir = own("up");
    const up = start([process.execPath, OOZE, "up", join(upDir, "echo.yaml"), "--nats", url, "--job", "netns"], upDir);
    const nodes = Object.fromEntries(
      ["a", "b"].map((h) => {
        const d = own(h);
        return [h, start(net!.exec(h, [process.execPath, OOZE, "node", "--nats", url, "--job", "netns", "--topology", join(d, "echo.yaml"), "--host", h]), d)];
      }),
    ) as Record<"a" | "b", ReturnType<typeof start>>;
    const diagnostics = () => `up:\n${up.log().slice(-2000)}\na:\n${nodes.a.log().slice(-2000)}\nb:\n${nodes.b.log().slice(-2000)}`;

    await waitUntil(() => up.log().includes("all 2 node(s) running"), { timeoutMs: 60_000, what: "both namespaced nodes running", diagnostics });
    await waitUntil(() => /ping 3\/20/.test(nodes.a.log()), { timeoutMs: 60_000, what: "3 round trips across namespaces", diagnostics });
    // Host b off the network: asks to its echo actor time out, the pinger crashes and is restarted.
    net.cut("b");
    await waitUntil(() => /pinger: (crashed|restarted|restarting)/.test(up.log()), { timeoutMs: 60_000, what: "the pinger failing while b is cut off", diagnostics });
    net.heal("b");
    await waitUntil(() => nodes.a.log().includes("done: 20 round trips"), { timeoutMs: 120_000, what: "20 round trips after healing", diagnostics });

    up.child.kill("SIGTERM");
    expect(await up.exited, diagnostics()).toBe(0);
    expect(await nodes.a.exited, diagnostics()).toBe(0);
    expect(await nodes.b.exited, diagnostics()).toBe(0);
  }, 240_000);
});
