// `ooze up` end to end, as a user runs it: real processes, a real embedded nats-server, real signals.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { waitUntil } from "../harness/index.ts";

const home = mkdtempSync(join(tmpdir(), "ooze-home-"));
const env = { ...process.env, OOZE_HOME: home };
const children: ChildProcess[] = [];

function ooze(args: string[]) {
  const r = spawnSync(process.execPath, ["bin/ooze.mjs", ...args], { env, encoding: "utf8", timeout: 60_000 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

function startUp(job: string, extra: string[] = []) {
  const child = spawn(process.execPath, ["bin/ooze.mjs", "up", "topologies/echo.yaml", "--job", job, ...extra], { env, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  return { child, log: () => log, exited };
}

function alive(pid: number) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

interface PsJson {
  nodes: { host: string; pid: number; actors: { path: string; status: string; restarts: number }[] }[];
}

afterAll(() => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  rmSync(home, { recursive: true, force: true });
});

describe("ooze up / ps / down", () => {
  it("runs the echo topology in two processes, lists it, restarts a killed node, and drains on down", async () => {
    const up = startUp("cli-echo");
    await waitUntil(() => up.log().includes("all 2 node(s) running"), { timeoutMs: 60_000, what: "both nodes running", diagnostics: up.log });
    await waitUntil(() => up.log().includes("done: 20 round trips"), { timeoutMs: 60_000, what: "pinger finished", diagnostics: up.log });

    const ps = ooze(["ps", "--job", "cli-echo", "--json"]);
    expect(ps.code, ps.err).toBe(0);
    const status = JSON.parse(ps.out) as PsJson;
    const actors = status.nodes.flatMap((n) => n.actors.map((a) => `${n.host}:${a.path}:${a.status}`)).sort();
    expect(actors).toEqual(["a:pinger:running", "b:echo:running"]);

    // A node process killed for real is restarted by `ooze up`.
    const nodeB = status.nodes.find((n) => n.host === "b")!;
    process.kill(nodeB.pid, "SIGKILL");
    await waitUntil(() => up.log().includes("node b killed by SIGKILL; restarting"), { timeoutMs: 20_000, what: "restart notice", diagnostics: up.log });
    const newPid = await waitUntil(
      () => {
        const r = ooze(["ps", "--job", "cli-echo", "--json"]);
        if (r.code !== 0) return null;
        const n = (JSON.parse(r.out) as PsJson).nodes.find((x) => x.host === "b");
        return n && n.pid !== nodeB.pid && n.actors[0]?.status === "running" ? n.pid : null;
      },
      { timeoutMs: 30_000, what: "node b back", diagnostics: up.log },
    );
    expect(newPid).not.toBe(nodeB.pid);

    const pids = (JSON.parse(ooze(["ps", "--job", "cli-echo", "--json"]).out) as PsJson).nodes.map((n) => n.pid);
    const down = ooze(["down", "--job", "cli-echo"]);
    expect(down.code, down.err + up.log()).toBe(0);
    expect(await up.exited).toBe(0);
    expect(up.log()).toContain("job cli-echo stopped");
    for (const pid of pids) await waitUntil(() => !alive(pid), { timeoutMs: 10_000, what: `node pid ${pid} gone` });
    expect(ooze(["ps", "--job", "cli-echo"]).code).not.toBe(0);
  });

  it("explains a bad topology with file, line and field, and exits non-zero", () => {
    const r = ooze(["up", "test/fixtures/topologies/bad-count.yaml"]);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/bad-count\.yaml:\d+:\d+ actors\[0\]\.count/);
  });

  it("explains a missing job", () => {
    const r = ooze(["ps", "--job", "nope"]);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(/no running job 'nope'/);
  });
});
