// ooze on a real three-server NATS cluster (routes, JetStream with a store per server, token auth, all
// on 127.0.0.1): the bus connects to the servers of a comma-separated --nats list and creates every
// stream, KV bucket and object store with 3 replicas; `ooze up --nats URL1,URL2,URL3` runs the echo
// topology and a small training topology in real node processes while one of the three servers is
// SIGKILLed mid-run (the one clients use most / the samples stream's leader) and stays dead: the job
// finishes, every sample index is trained or dropped once (batches.jsonl), versions only increase.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJsonl, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { connectBus, resolveReplicas, type Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { assertInvariants, everySampleOnce, stalenessWithin, startTestNatsCluster, type TestNatsCluster, versionsIncrease, waitUntil } from "../harness/index.ts";

let cluster: TestNatsCluster;
const buses: Bus[] = [];
const children: ChildProcess[] = [];
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "ooze-cluster-"));
  dirs.push(d);
  return d;
};

beforeAll(async () => {
  cluster = await startTestNatsCluster({ size: 3 });
}, 60_000);
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await Promise.all(buses.map((b) => b.close().catch(() => undefined)));
  await cluster?.stop();
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

/** `ooze up FILE --nats <the three servers>` as a child process, its log collected. */
function up(file: string, job: string, home: string, extra: string[] = []) {
  const child = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", job, "--nats", cluster.authUrls, "--quiet", ...extra], {
    env: { ...process.env, OOZE_HOME: home },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  return { child, log: () => log, exited, diagnostics: () => log.slice(-6000) };
}

/** The index of a live server with the most client connections. */
async function busiest(): Promise<number> {
  const conns = await cluster.connections();
  return conns.indexOf(Math.max(...conns));
}

describe("a three-server NATS cluster", () => {
  it("the bus takes a comma-separated server list and creates streams, KV buckets and object stores with 3 replicas", async () => {
    expect(resolveReplicas(cluster.urls, false, undefined, undefined)).toBe(3);
    expect(resolveReplicas("nats://127.0.0.1:4222", false, undefined, undefined)).toBe(1);
    expect(resolveReplicas(cluster.urls, false, "1", undefined)).toBe(1);
    expect(() => resolveReplicas("nats://127.0.0.1:4222", true, "3", undefined)).toThrow(/3 stream replicas need a NATS cluster/);
    expect(() => resolveReplicas(cluster.urls, false, "7", undefined)).toThrow(/integer from 1 to 5/);
    const bus = await connectBus({ url: cluster.authUrls, replicas: 3 });
    buses.push(bus);
    expect(bus.url).toBe(cluster.urls);
    const stream = await bus.ensureStream("CLUSTER_T", ["cluster-t.>"]);
    expect(stream.config.num_replicas).toBe(3);
    expect(stream.cluster?.replicas?.length).toBe(2);
    expect((await (await bus.kv("cluster_kv")).status()).replicas).toBe(3);
    expect((await (await bus.obj("cluster_obj")).status()).replicas).toBe(3);
  });

  it("ooze up --nats URL1,URL2,URL3: the echo topology finishes while the busiest server is SIGKILLed", async () => {
    const dir = tmp();
    const file = join(dir, "echo.yaml");
    writeFileSync(
      file,
      `name: echo-cluster
hosts: [{ name: a }, { name: b }]
actors:
  - { name: echo, kind: echo.server, placement: b }
  - { name: pinger, kind: echo.pinger, placement: a, config: { target: echo, count: 30, intervalMs: 100 } }
`,
    );
    const run = up(file, "echo-cluster", dir);
    await waitUntil(() => /ping 5\/30/.test(run.log()), { timeoutMs: 60_000, what: "5 pings", diagnostics: run.diagnostics });
    expect(run.log()).toContain("streams, KV buckets and object stores with 3 replicas");
    const victim = await busiest();
    cluster.servers[victim]!.kill("SIGKILL");
    await cluster.servers[victim]!.waitExit();
    await waitUntil(() => run.log().includes("done: 30 round trips"), { timeoutMs: 90_000, what: "the pinger's 30 round trips after a server died", diagnostics: run.diagnostics });
    run.child.kill("SIGTERM");
    expect(await run.exited, run.diagnostics()).toBe(0);
    await cluster.servers[victim]!.restart();
    await cluster.waitJetStream();
  }, 180_000);

  it("ooze up --nats URL1,URL2,URL3: a training job across three node processes loses no sample when the samples stream's leader is SIGKILLed", async () => {
    const dir = tmp();
    const out = join(dir, "run");
    const job = "train-cluster";
    const names = jobNames(job);
    const STEPS = 4, PROMPTS = 3, N = 4;
    const file = join(dir, "train.yaml");
    writeFileSync(
      file,
      `name: train-cluster
hosts: [{ name: rollout }, { name: learner }, { name: buffer }]
actors:
  - { name: rollout, kind: train.rollout, placement: rollout, config: { ackWaitMs: 1500 } }
  - { name: fleet, kind: fleet, placement: learner, config: { embedded: { count: 1, preset: tiny, maxRunning: 32, cacheTokens: 4096 } } }
  - { name: buffer, kind: train.buffer, placement: buffer, config: { ackWaitMs: 1500 } }
  - { name: trainer, kind: train.trainer, placement: learner, config: { out: ${JSON.stringify(out)}, ackWaitMs: 2000 } }
  - { name: weight-sync, kind: train.weight-sync, placement: learner, config: { ackWaitMs: 2000 } }
train: { mode: sync, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${STEPS}, promptsPerStep: ${PROMPTS}, samplesPerPrompt: ${N}, checkpointEvery: 2 }
`,
    );
    const run = up(file, job, dir);
    await waitUntil(() => run.log().includes("trainer: step 1/4"), { timeoutMs: 90_000, what: "step 1", diagnostics: run.diagnostics });

    // Every stream and bucket of the job has 3 replicas; kill the server leading the samples stream.
    const bus = await connectBus({ url: cluster.authUrls });
    buses.push(bus);
    const jsm = await bus.jsm();
    const samples = await jsm.streams.info(names.streamSamples);
    const replicas: Record<string, number> = {};
    for await (const s of jsm.streams.list()) if (s.config.name.toLowerCase().includes("train_cluster")) replicas[s.config.name] = s.config.num_replicas;
    // the loop's streams, the mailboxes and events, and the KV buckets (streams KV_…) of this job
    expect(Object.keys(replicas)).toEqual(expect.arrayContaining([names.streamSamples, names.streamPrompts, names.streamBatches, `KV_${names.kvVersions}`]));
    expect(Object.entries(replicas).filter(([, r]) => r !== 3)).toEqual([]);
    const leader = samples.cluster?.leader ?? "";
    const victim = Math.max(0, cluster.servers.findIndex((_, i) => leader.endsWith(`-s${i + 1}`)));
    cluster.servers[victim]!.kill("SIGKILL");
    await cluster.servers[victim]!.waitExit();

    expect(await run.exited, run.diagnostics()).toBe(0);
    const batches = readJsonl<{ step: number; trained: number[]; dropped: number[] }>(join(out, "batches.jsonl"));
    expect(batches.map((b) => b.step)).toEqual([1, 2, 3, 4]);
    await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, versionsIncrease, stalenessWithin(0)], run.diagnostics());
    expect(batches.flatMap((b) => [...b.trained, ...b.dropped])).toHaveLength(STEPS * PROMPTS * N);
    const versions = readJsonl<StepMetrics>(join(out, "metrics.jsonl")).map((m) => m.weight_version);
    expect(versions).toEqual([1, 2, 3, 4]);
    expect(JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8"))).toMatchObject({ step: 4, weightVersion: 4 });
    await cluster.servers[victim]!.restart();
  }, 240_000);
});
