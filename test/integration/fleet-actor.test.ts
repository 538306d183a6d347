// The fleet actor in a running job and `ooze engines attach|detach|list` against it, as a user runs
// them: `ooze up` with a topology whose fleet actor starts one embedded engine (a child `ooze serve`)
// and lists one external engine; engines attached and detached at run time over NATS; an engine
// serving another model refused with the reason; clear errors for no job and no fleet actor; the
// embedded engine stopped with the job.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient } from "../../src/engine/client.ts";
import type { EngineEntry } from "../../src/engine/fleet/fleet.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { waitUntil } from "../harness/index.ts";

const home = mkdtempSync(join(tmpdir(), "ooze-fleet-home-"));
const env = { ...process.env, OOZE_HOME: home };
const children: ChildProcess[] = [];
const backends: InferenceBackend[] = [];
const servers: EngineServer[] = [];

/** Runs the CLI without blocking this process (its engine servers must keep answering meanwhile). */
function ooze(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const c = spawn(process.execPath, ["bin/ooze.mjs", ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
    children.push(c);
    let out = "";
    let err = "";
    c.stdout!.on("data", (d) => (out += d));
    c.stderr!.on("data", (d) => (err += d));
    const timer = setTimeout(() => c.kill("SIGKILL"), 60_000);
    c.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, out, err });
    });
  });
}

async function serve(dir: string): Promise<string> {
  const backend = createNativeBackend({ modelDir: dir });
  backends.push(backend);
  const s = await startEngineServer({ backend, weightVersion: "default" });
  servers.push(s);
  return s.url;
}

let tinyDir: string;
let otherDir: string;

beforeAll(async () => {
  tinyDir = join(home, "tiny");
  otherDir = join(home, "other");
  await initModelDir("tiny", tinyDir, 1);
  const config = JSON.parse(readFileSync(join(tinyDir, "config.json"), "utf8")) as LlamaHfConfig;
  await initModelDir({ ...config, max_position_embeddings: 256 }, otherDir, 2);
});

afterAll(async () => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  for (const s of servers) await s.close();
  for (const b of backends) b.close();
  rmSync(home, { recursive: true, force: true });
});

describe("fleet actor and `ooze engines`", () => {
  it("hosts embedded and topology engines, attaches and detaches at run time, refuses another model", async () => {
    const external = await serve(tinyDir);
    const topo = join(home, "fleet.yaml");
    writeFileSync(
      topo,
      [
        "name: fleet-test",
        "actors:",
        "  - name: fleet",
        "    kind: fleet",
        "    config:",
        "      healthIntervalMs: 200",
        "      routing: least_load",
        "      embedded: { count: 1, preset: tiny }",
        `      engines: [{ url: "${external}" }]`,
        "",
      ].join("\n"),
    );
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", topo, "--job", "fleet-cli"], { env, stdio: ["ignore", "pipe", "pipe"] });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));

    const list = async (): Promise<EngineEntry[] | null> => {
      const r = await ooze(["engines", "list", "--job", "fleet-cli", "--json"]);
      return r.code === 0 ? (JSON.parse(r.out) as { engines: EngineEntry[] }).engines : null;
    };
    const engines = await waitUntil(async () => {
      const l = await list();
      return l && l.filter((e) => e.healthy).length === 2 ? l : null;
    }, {
      timeoutMs: 60_000,
      what: "the fleet actor with two healthy engines",
      diagnostics: () => log,
    });
    expect(engines.map((e) => e.source)).toEqual(["topology", "topology"]);
    const embedded = engines.find((e) => e.url !== external)!.url;
    expect(await new EngineClient(embedded).health()).toBe(true);

    const late = await serve(tinyDir);
    const att = await ooze(["engines", "attach", late, "--job", "fleet-cli"]);
    expect(att.code, att.err).toBe(0);
    expect(att.out).toMatch(new RegExp(`attached ${late} to job fleet-cli \\(healthy`));
    // Through the job's NATS server directly (as from another host), rather than its job record.
    // the record holds ooze's own NATS user (the embedded server has users, no token: docs/sandbox.md)
    const rec = JSON.parse(readFileSync(join(home, "jobs", "fleet-cli.json"), "utf8")) as { natsUrl: string; user: string; password: string };
    const nats = rec.natsUrl.replace("nats://", `nats://${rec.user}:${rec.password}@`);
    const table = await ooze(["engines", "list", "--job", "fleet-cli", "--nats", nats]);
    expect(table.code, table.err).toBe(0);
    expect(table.out).toContain("3 engines");
    expect(table.out).toMatch(new RegExp(`${late}\\s+yes\\s+0\\s+default\\s+runtime`));

    const other = await serve(otherDir);
    const refused = await ooze(["engines", "attach", other, "--job", "fleet-cli"]);
    expect(refused.code).not.toBe(0);
    expect(refused.err).toMatch(/serves a different model .*context_length: 256 \(this engine\) vs 512 \(expected\)/);

    const det = await ooze(["engines", "detach", late, "--job", "fleet-cli"]);
    expect(det.code, det.err).toBe(0);
    expect((await list())!.map((e) => e.url).sort()).toEqual([embedded, external].sort());

    const noActor = await ooze(["engines", "list", "--job", "fleet-cli", "--actor", "nofleet"]);
    expect(noActor.code).not.toBe(0);
    expect(noActor.err).toMatch(/job 'fleet-cli' has no fleet actor 'nofleet'/);
    const noJob = await ooze(["engines", "list", "--job", "nope"]);
    expect(noJob.code).not.toBe(0);
    expect(noJob.err).toMatch(/no running job 'nope'/);

    // The node process killed for real: `ooze up` restarts it. The embedded engine the dead node
    // started does not outlive it (it watches its parent; failing that, the restarted fleet actor
    // stops it from the pid recorded in KV), and the new fleet actor starts its own.
    const ps = await ooze(["ps", "--job", "fleet-cli", "--json"]);
    expect(ps.code, ps.err).toBe(0);
    const nodePid = (JSON.parse(ps.out) as { nodes: { pid: number }[] }).nodes[0]!.pid;
    process.kill(nodePid, "SIGKILL");
    await waitUntil(async () => !(await new EngineClient(embedded, { retries: 0, timeoutMs: 1_000 }).health()), {
      timeoutMs: 60_000,
      what: "the dead node's embedded engine gone",
      diagnostics: () => log,
    });
    const again = await waitUntil(async () => {
      const l = await list();
      return l && l.filter((e) => e.healthy).length === 2 ? l : null;
    }, { timeoutMs: 60_000, what: "the restarted fleet with two healthy engines", diagnostics: () => log });
    expect(again.map((e) => e.url)).toContain(external);
    expect(again.map((e) => e.url)).not.toContain(embedded);
    const embedded2 = again.find((e) => e.url !== external)!.url;

    const down = await ooze(["down", "--job", "fleet-cli"]);
    expect(down.code, down.err + log).toBe(0);
    expect(await exited).toBe(0);
    // The embedded engine went with the job.
    await waitUntil(async () => !(await new EngineClient(embedded2, { retries: 0, timeoutMs: 1_000 }).health()), { timeoutMs: 20_000, what: "the embedded engine stopped" });
  });
});
