// The dashboard server over a real socket and a real nats-server: every route answers 401 and nothing
// else without the token or with a wrong one; with it, the page, its assets and the state come back;
// the server-sent-event stream delivers a step's metrics published on the job's METRICS stream, a
// lifecycle event and the `ps` data of a real actor system, a weight version from the versions KV
// bucket and an engine attach seen in the engines KV bucket; a run directory that is missing or has
// malformed lines gets a readable reason; attach without a fleet actor gets the CLI's error.
import { request } from "node:http";
import { mkdtempSync, rmSync, writeFileSync, appendFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, defineActor, serveControl, startActors, type ActorSystem } from "../../src/actor/index.ts";
import { startDash, type Dash } from "../../app/dash/index.ts";
import type { DashSnapshot } from "../../app/dash/hub.ts";
import { FleetRegistry } from "../../src/engine/fleet/registry.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { stepMetricsMsg } from "../../actors/protocol/messages.ts";
import { ensureTrainStreams, publish, VersionsKv } from "../../actors/protocol/streams.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();
const job = "dash-srv";
const names = jobNames(job);

interface Reply {
  status: number;
  type: string | undefined;
  body: string;
}

/** One HTTP request to the dashboard (headers and body optional). */
function call(port: number, method: string, path: string, opts: { headers?: Record<string, string>; body?: string } = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method, path, headers: opts.headers ?? {} }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, type: res.headers["content-type"], body: Buffer.concat(chunks).toString("utf8") }));
    });
    req.on("error", reject);
    req.end(opts.body);
  });
}

/** An SSE stream read into a list of {event, data}. */
function openEvents(port: number, token: string) {
  const events: { event: string; data: unknown }[] = [];
  let buf = "";
  const req = request({ host: "127.0.0.1", port, path: `/events?token=${token}` }, (res) => {
    res.setEncoding("utf8");
    res.on("data", (c: string) => {
      buf += c;
      let i: number;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const event = /^event: (.*)$/m.exec(block)?.[1];
        const data = /^data: (.*)$/m.exec(block)?.[1];
        if (event && data) events.push({ event, data: JSON.parse(data) });
      }
    });
  });
  req.on("error", () => undefined);
  req.end();
  return { events, close: () => req.destroy() };
}

const ROUTES: [string, string][] = [
  ["GET", "/"],
  ["GET", "/assets/app.js"],
  ["GET", "/assets/charts.js"],
  ["GET", "/assets/explorer.js"],
  ["GET", "/assets/app.css"],
  ["GET", "/assets/uplot.js"],
  ["GET", "/assets/uplot.css"],
  ["GET", "/events"],
  ["GET", "/api/state"],
  ["POST", "/api/engines/attach"],
  ["POST", "/api/engines/detach"],
  ["POST", "/api/run"],
  ["GET", "/api/explorer/episodes"],
  ["GET", "/api/explorer/episode"],
  ["GET", "/no-such-route"],
];

describe("dashboard server", () => {
  let bus: Bus;
  let system: ActorSystem;
  let dash: Dash;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "ooze-dash-"));
    bus = await nats.connect();
    // A real node: an actor system serving `ps` on host "main" and publishing lifecycle events.
    system = createSystem({ name: job, log: () => {} });
    await attachBus(system, bus, { job });
    await serveControl(system, "main");
    const worker = defineActor<null, string>({ name: "worker", init: () => null, handle: (s) => s });
    await startActors(system, [{ name: "worker", kind: "w" }], () => worker, { host: "main", defaultHost: "main" });
    await ensureTrainStreams(bus, names, { checkpointEvery: 10 });
    dash = await startDash({ job: { bus, id: job, hosts: ["main"] }, refreshMs: 500, engineTimeoutMs: 5_000 });
  });

  afterAll(async () => {
    await dash?.close();
    await system?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("listens on 127.0.0.1 and prints a URL with a generated token", () => {
    expect(dash.url).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:${dash.port}/\\?token=[0-9a-f]{48}$`));
  });

  it("answers 401 and nothing else on every route without the right token", async () => {
    const wrong = `${dash.token.slice(0, -1)}${dash.token.endsWith("0") ? "1" : "0"}`;
    for (const [method, path] of ROUTES) {
      const body = method === "POST" ? JSON.stringify({ url: "http://127.0.0.1:1", dir }) : undefined;
      const tries: [string, Record<string, string>][] = [
        [path, {}],
        [`${path}?token=${wrong}`, {}],
        [`${path}?token=short`, {}],
        [`${path}?token=`, {}],
        [path, { authorization: `Bearer ${wrong}` }],
      ];
      for (const [p, headers] of tries) {
        const r = await call(dash.port, method, p, { headers, ...(body !== undefined ? { body } : {}) });
        expect({ route: `${method} ${p} ${JSON.stringify(headers)}`, status: r.status, body: r.body }).toEqual({ route: `${method} ${p} ${JSON.stringify(headers)}`, status: 401, body: "401 Unauthorized\n" });
      }
    }
    // The detach of a wrong-token request changed nothing: the fleet was never asked.
    expect(dash.hub.snapshot().engineEvents).toEqual([]);
  });

  it("serves the page (token filled in), its assets and uPlot from node_modules with the token", async () => {
    const page = await call(dash.port, "GET", `/?token=${dash.token}`);
    expect(page.status).toBe(200);
    expect(page.type).toMatch(/^text\/html/);
    expect(page.body).toContain(`/assets/app.js?token=${dash.token}`);
    expect(page.body).not.toContain("{{TOKEN}}");
    const uplot = await call(dash.port, "GET", "/assets/uplot.js", { headers: { authorization: `Bearer ${dash.token}` } });
    expect(uplot.status).toBe(200);
    expect(uplot.body).toContain("uPlot");
    const state = JSON.parse((await call(dash.port, "GET", `/api/state?token=${dash.token}`)).body) as DashSnapshot;
    expect(state.job).toEqual({ id: job, nats: bus.url });
  });

  it("streams the metrics a trainer publishes on the bus, lifecycle events, ps data, versions and engine attaches", async () => {
    const sse = openEvents(dash.port, dash.token);
    try {
      await waitUntil(() => sse.events.some((e) => e.event === "snapshot"), { what: "the snapshot event", timeoutMs: 10_000 });
      const m = { step: 1, reward_mean: 0.25, success_rate: 0.5, kl: 0.01, staleness_hist: [3, 1] };
      await publish(bus, names.trainMetrics, stepMetricsMsg, { step: 1, metrics: m }, "metrics-1", "test");
      const got = await waitUntil(() => sse.events.find((e) => e.event === "metrics"), {
        what: "a metrics event on the SSE stream",
        timeoutMs: 15_000,
        diagnostics: () => sse.events.map((e) => e.event).join(", "),
      });
      expect(got.data).toEqual(m);

      // A node's `ps` data (from the actor system above) and its lifecycle events.
      await waitUntil(() => sse.events.some((e) => e.event === "host" && (e.data as { actors: { path: string }[] }).actors.some((a) => a.path === "worker")), {
        what: "the host event listing actor 'worker'",
        timeoutMs: 15_000,
      });
      expect(dash.hub.snapshot().events.some((e) => e.actor === "worker" && e.kind === "started")).toBe(true);

      // A weight version with what its sync sent, and an engine attach recorded by a fleet.
      const versions = await VersionsKv.open(bus, names);
      await versions.advance({ version: 1, modelDir: "/tmp/v1", step: 1, at: Date.now(), sync: { kind: "delta", bytes: 1000, fullBytes: 4000 } });
      const v = await waitUntil(() => sse.events.find((e) => e.event === "version"), { what: "a version event", timeoutMs: 15_000 });
      expect(v.data).toMatchObject({ version: 1, step: 1, sync: { kind: "delta", bytes: 1000, fullBytes: 4000 } });
      const registry = await FleetRegistry.open(bus, job);
      await registry.put({ url: "http://127.0.0.1:30001", source: "runtime", attachedAt: 1 });
      const a = await waitUntil(() => sse.events.find((e) => e.event === "engine-event"), { what: "an engine-event", timeoutMs: 15_000 });
      expect(a.data).toMatchObject({ kind: "attached", url: "http://127.0.0.1:30001", source: "runtime" });
      // No fleet actor in this job: the fleet's error says so.
      await waitUntil(() => dash.hub.snapshot().fleetError, { what: "the fleet error", timeoutMs: 15_000 });
      expect(dash.hub.snapshot().fleetError).toMatch(/fleet actor 'fleet'/);
    } finally {
      sse.close();
    }
  });

  it("attach without a fleet actor answers the CLI's error; a bad body is a 400 naming the field", async () => {
    const auth = { authorization: `Bearer ${dash.token}`, "content-type": "application/json" };
    const r = await call(dash.port, "POST", "/api/engines/attach", { headers: auth, body: JSON.stringify({ url: "http://127.0.0.1:1" }) });
    expect(JSON.parse(r.body)).toMatchObject({ ok: false, error: { code: "ACTOR_NOT_FOUND" } });
    expect(JSON.parse(r.body).error.message).toMatch(/has no fleet actor 'fleet' answering/);
    const bad = await call(dash.port, "POST", "/api/engines/attach", { headers: auth, body: "{" });
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.body).error.message).toMatch(/not JSON/);
    const noUrl = await call(dash.port, "POST", "/api/engines/detach", { headers: auth, body: "{}" });
    expect(JSON.parse(noUrl.body).error.message).toMatch(/field 'url'/);
  });

  it("opens a run directory: missing, malformed and growing metrics.jsonl", async () => {
    const auth = { authorization: `Bearer ${dash.token}`, "content-type": "application/json" };
    const open = async (d: string) => JSON.parse((await call(dash.port, "POST", "/api/run", { headers: auth, body: JSON.stringify({ dir: d }) })).body);
    const missing = await open(join(dir, "nope"));
    expect(missing.result.error).toMatch(/run directory .*nope does not exist/);
    expect(dash.hub.snapshot().run?.error).toMatch(/does not exist/);

    const run = join(dir, "run");
    const { mkdirSync } = await import("node:fs");
    mkdirSync(run);
    expect((await open(run)).result.error).toMatch(/no metrics\.jsonl in/);
    writeFileSync(join(run, "metrics.jsonl"), `${JSON.stringify({ step: 1, reward_mean: 0.1 })}\nnot json\n${JSON.stringify({ reward_mean: 2 })}\n`);
    await waitUntil(() => dash.hub.snapshot().run?.metrics.length === 1, { what: "the run's first good line (watched)", timeoutMs: 10_000 });
    const r = dash.hub.snapshot().run!;
    expect(r.error).toMatch(/metrics\.jsonl line 2: not JSON .*and 1 more malformed line.*showing the 1 good line$/);
    appendFileSync(join(run, "metrics.jsonl"), `${JSON.stringify({ step: 2, reward_mean: 0.2 })}\n`);
    await waitUntil(() => dash.hub.snapshot().run?.metrics.length === 2, { what: "an appended line (watched)", timeoutMs: 10_000 });
    expect(dash.hub.snapshot().run!.metrics.map((m) => m.step)).toEqual([1, 2]);
  });
});
