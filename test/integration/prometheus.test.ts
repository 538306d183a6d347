// A real Prometheus server (Debian's `prometheus`, installed here when missing and root; the test is
// skipped, saying why, only when it cannot be) scrapes every kind of ooze process's /metrics on
// loopback — a training job's node (trainer, buffer, fleet and actor series), an engine server
// (sglang:* names), the gateway and the dashboard (with its token) — and a few series are queried
// back through Prometheus's HTTP API.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { trainSchema, enginesSchema } from "../../actors/protocol/config.ts";
import { startDash } from "../../app/dash/index.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { startSimEngines } from "../../src/engine/sim/sim-engines.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { debianProgram } from "../harness/debian.ts";
import { freePort, waitUntil } from "../harness/index.ts";

const bin = debianProgram("prometheus", ["/usr/bin/prometheus"]);
if ("skip" in bin) console.warn(`prometheus test skipped: ${bin.skip}`);

const dir = mkdtempSync(join(tmpdir(), "ooze-prom-"));
const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  rmSync(dir, { recursive: true, force: true });
});

const hostPort = (url: string) => new URL(url).host;

describe.skipIf("skip" in bin)("Prometheus scrapes ooze", () => {
  it("every process's /metrics: a job's node, an engine, the gateway, the dashboard; series queried back", async () => {
    // a training job (its node serves the trainer's, buffer's, fleet's and actors' series)
    const lines: string[] = [];
    const stop = new AbortController();
    const topology = parseTopology("name: prom-train\nactors: [{ name: trainer, kind: train.trainer }]\n");
    const train = trainSchema.parse({ task: "addition", taskConfig: { digits: 1, answer: "last-digit" }, preset: "tiny", steps: 10_000, maxSeconds: 120, promptsPerStep: 2, samplesPerPrompt: 2 });
    const jobId = `prom-train-${process.pid}`;
    const job = runTrainJob({ topology, train, engines: enginesSchema.parse({ count: 1 }), out: join(dir, "run"), job: jobId, verbose: true, log: (l) => lines.push(l), signal: stop.signal });
    cleanups.push(() => (stop.abort(), job.catch(() => undefined)));
    const nodeMetrics = await waitUntil(() => lines.map((l) => /info metrics: (http:\/\/\S+)/.exec(l)?.[1]).find(Boolean), { what: "the node's metrics address", timeoutMs: 60_000 });

    // an engine server and a gateway in front of it, with one chat request through a session
    const engines = await startSimEngines({ count: 1 });
    cleanups.push(() => engines.close());
    const fleet = new Fleet({ healthIntervalMs: 0 });
    await fleet.attach(engines.urls[0]!);
    cleanups.push(() => fleet.close());
    const gateway = await Gateway.start({ fleet, contextLength: 4096 });
    cleanups.push(() => gateway.close());
    const s = gateway.openSession({ episodeId: "e", groupIndex: 0 });
    const r = await fetch(`${s.openaiBaseUrl}/chat/completions`, {
      method: "POST", headers: { authorization: `Bearer ${s.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4 }),
    });
    expect(r.status).toBe(200);
    // the dashboard of a run directory (its /metrics needs the token, as every route)
    const dash = await startDash({ runDir: join(dir, "run") });
    cleanups.push(() => dash.close());
    expect((await fetch(`${new URL(dash.url).origin}/metrics`)).status).toBe(401);

    const port = await freePort();
    const config = [
      "global: { scrape_interval: 1s, scrape_timeout: 1s }",
      "scrape_configs:",
      `  - { job_name: node, static_configs: [{ targets: ['${hostPort(nodeMetrics)}'] }] }`,
      `  - { job_name: engine, static_configs: [{ targets: ['${hostPort(engines.urls[0]!)}'] }] }`,
      `  - { job_name: gateway, static_configs: [{ targets: ['${hostPort(gateway.url)}'] }] }`,
      `  - job_name: dash`,
      `    authorization: { type: Bearer, credentials: '${dash.token}' }`,
      `    static_configs: [{ targets: ['${hostPort(dash.url)}'] }]`,
      "",
    ].join("\n");
    writeFileSync(join(dir, "prometheus.yml"), config);
    const prom: ChildProcess = spawn((bin as { path: string }).path, [
      `--config.file=${join(dir, "prometheus.yml")}`, `--storage.tsdb.path=${join(dir, "tsdb")}`, `--web.listen-address=127.0.0.1:${port}`,
    ], { stdio: ["ignore", "ignore", "pipe"] });
    let promLog = "";
    prom.stderr!.on("data", (b: Buffer) => (promLog = (promLog + b.toString()).slice(-4000)));
    cleanups.push(() => prom.kill("SIGKILL"));

    const query = async (q: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]> => {
      try {
        const res = await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(q)}`);
        const body = (await res.json()) as { status: string; data?: { result: { metric: Record<string, string>; value: [number, string] }[] } };
        return body.status === "success" ? body.data!.result : [];
      } catch {
        return [];
      }
    };
    // The node serves its process's registry, which the other test files of this vitest worker record
    // into as well (isolate: false; a job of theirs still running, e.g. after a timeout, has a fleet
    // too): only this job's series count, by its `job` label (`exported_job` once Prometheus sets
    // its own `job`, the scrape job's name).
    const ours = `exported_job="${jobId}"`;
    const wants: [string, (v: number) => boolean][] = [
      ["up == 1", () => true],
      [`ooze_trainer_steps_total{${ours}}`, (v) => v >= 1],
      [`ooze_buffer_batches_total{${ours}}`, (v) => v >= 1],
      [`ooze_fleet_engines{state="healthy",${ours}}`, (v) => v === 1],
      [`ooze_actor_processed{actor=~".*trainer",${ours}}`, (v) => v >= 0],
      ["sglang:num_requests_total", (v) => v >= 1],
      ["sglang:time_to_first_token_seconds_count", (v) => v >= 1],
      ["ooze_gateway_requests_total{api=\"chat/completions\",code=\"200\"}", (v) => v === 1],
      ["ooze_dash_clients", (v) => v === 0],
    ];
    for (const [q, ok] of wants) {
      await waitUntil(async () => {
        const res = await query(q);
        if (q === "up == 1") return res.length === 4;
        return res.length > 0 && res.every((x) => ok(Number(x.value[1])));
      }, { what: `Prometheus to answer ${q} (log: ${promLog.slice(-300)})`, timeoutMs: 60_000 });
    }
  }, 240_000);
});
