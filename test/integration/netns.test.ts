// Hosts that are really apart: the echo topology's two hosts run as `ooze node` processes in two
// Linux network namespaces, each in its own working directory with its own copy of the topology,
// reaching a real nats-server over veth and a bridge on a private subnet the test creates
// (test/harness/netns.ts); `ooze up` (hosts external) runs in the test's namespace. Host b is cut off
// the network mid-run (its link down: the pinger's asks time out and it crashes) and healed; the
// pinger then finishes its round trips and `ooze up` stops both remote nodes over NATS.
// And a training job across them: the rollout on host `rollout`, the fleet (its embedded engine bound
// to the learner's address), buffer, trainer and weight-sync on host `learner`, each `ooze node` in
// its own working directory; mid-run the rollout host is SIGKILLed and a new node started in its
// place (a host lost and replaced), and the learner host is cut off the network for 3 s and healed.
// The job finishes (the trainer stops both nodes) and the actor invariants hold on the trainer's
// output: every sample trained or dropped exactly once, versions only increase, no batch beyond the
// staleness bound. Skipped, with the reason, where namespaces cannot be made (not root, no iproute2).
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import { assertInvariants, everySampleOnce, readJsonLines, stalenessWithin, startTestNats, versionsIncrease, waitUntil, withDeadline, type MetricsLine } from "../harness/index.ts";
import { createTestNetwork, namespacedTrainTopology, netnsUnavailable, spawnLogged, type LoggedProcess, type TestNetwork } from "../harness/netns.ts";

const why = netnsUnavailable();
if (why) console.warn(`netns.test.ts skipped: ${why}`);
const OOZE = resolve("bin/ooze.mjs");
const TOPOLOGY = `name: echo-netns
hosts: [{ name: a, start: external }, { name: b, start: external }]
actors:
  - { name: echo, kind: echo.server, placement: b }
  - { name: pinger, kind: echo.pinger, placement: a, config: { target: echo, count: 20, intervalMs: 200 } }
`;

const nets: TestNetwork[] = [];
const servers: NatsServerHandle[] = [];
const children: ChildProcess[] = [];
const dirs: string[] = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  for (const s of servers) await s.stop();
  for (const n of nets) n.destroy();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

function start(cmd: string[], cwd: string): LoggedProcess {
  const p = spawnLogged(cmd, cwd);
  children.push(p.child);
  return p;
}

describe.skipIf(why !== null)("hosts in separate network namespaces", () => {
  it("runs a topology across two namespaced hosts with separate directories; a host cut off and healed rejoins", async () => {
    const net = createTestNetwork(["a", "b"]);
    nets.push(net);
    const server = await startTestNats({ host: net.gateway });
    servers.push(server);
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
        return [h, start(net.exec(h, [process.execPath, OOZE, "node", "--nats", url, "--job", "netns", "--topology", join(d, "echo.yaml"), "--host", h]), d)];
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

const STEPS = 10;

describe.skipIf(why !== null)("a training job on hosts in separate network namespaces", () => {
  it("trains across namespaced hosts; a rollout host SIGKILLed and replaced and the learner cut off and healed lose and duplicate no sample", async () => {
    const net = createTestNetwork(["rollout", "learner"]);
    nets.push(net);
    const server = await startTestNats({ host: net.gateway });
    servers.push(server);
    const url = `nats://${server.token}@${net.gateway}:${server.port}`;
    const learner = net.hosts.find((h) => h.name === "learner")!.address;
    const out = mkdtempSync(join(tmpdir(), "ooze-netns-train-out-"));
    dirs.push(out);
    const topology = namespacedTrainTopology("netns-train", learner, out, STEPS);
    const own = (name: string) => {
      const d = mkdtempSync(join(tmpdir(), `ooze-netns-train-${name}-`));
      dirs.push(d);
      writeFileSync(join(d, "train.yaml"), topology);
      return d;
    };
    const upDir = own("up");
    const up = start([process.execPath, OOZE, "up", join(upDir, "train.yaml"), "--nats", url, "--job", "netns-train"], upDir);
    const node = (h: "rollout" | "learner") => {
      const d = own(h);
      return start(net.exec(h, [process.execPath, OOZE, "node", "--nats", url, "--job", "netns-train", "--topology", join(d, "train.yaml"), "--host", h]), d);
    };
    let rollout = node("rollout");
    const learnerNode = node("learner");
    const steps = () => readJsonLines<MetricsLine>(join(out, "metrics.jsonl")).length;
    const diagnostics = () => `up:\n${up.log().slice(-2000)}\nrollout:\n${rollout.log().slice(-2000)}\nlearner:\n${learnerNode.log().slice(-3000)}`;

    await waitUntil(() => steps() >= 2, { timeoutMs: 120_000, what: "two steps trained across the namespaces", diagnostics });
    // The rollout host dies (SIGKILL: no goodbye) and a new node takes its place.
    const killed = rollout;
    const gone = killed.exited;
    killed.child.kill("SIGKILL");
    await gone;
    rollout = node("rollout");
    const at = steps();
    await waitUntil(() => steps() >= at + 2, { timeoutMs: 120_000, what: "two more steps after the rollout host was replaced", diagnostics });
    expect(steps(), "the learner is cut off mid-run").toBeLessThan(STEPS);
    // The learner host off the network for 3 s: its node loses NATS and its engine its clients.
    net.cut("learner");
    await new Promise((r) => setTimeout(r, 3_000));
    net.heal("learner");
    // The trainer's last step stops every node (told over NATS); `ooze up`, with no local host, is stopped as a user would.
    const exited = (n: LoggedProcess) => n.child.exitCode !== null || n.child.signalCode !== null;
    await waitUntil(() => exited(learnerNode) && exited(rollout), { timeoutMs: 180_000, what: "both nodes to stop after the last step", diagnostics });
    expect(await learnerNode.exited, diagnostics()).toBe(0);
    expect(await rollout.exited, diagnostics()).toBe(0);
    up.child.kill("SIGTERM");
    expect(await withDeadline(up.exited, 30_000, "ooze up to stop"), diagnostics()).toBe(0);
    expect(steps()).toBe(STEPS);
    await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, versionsIncrease, stalenessWithin(2)], diagnostics());
  }, 420_000);
});
