// NATS credentials confined to one job (issue 30): a real nats-server with ooze's own user and two
// jobs' node users (src/transport/permissions.ts), real connections. A node user of job `alpha` does
// everything a node does on alpha's subjects, streams, KV buckets and object stores (made first by
// the unrestricted user, as `ooze up` does), and is refused everything of job `beta` — its subjects,
// its samples stream, its consumers — as well as `_INBOX.>`, `>`, `$SYS`, and creating, changing or
// deleting any stream. Then a whole training job under `ooze up` with the embedded server: each node
// connects as its host's user, the job finishes, and no node was refused anything.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readJsonl, type BatchRecord } from "../../actors/protocol/metrics.ts";
import { ensureTrainStreams } from "../../actors/protocol/streams.ts";
import { trainOf } from "../../actors/protocol/context.ts";
import { ensureJobAssets, nodeUsers } from "../../app/cli/node-credentials.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { connectBus, type Bus, type BusStatus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { startNatsServer, type NatsServerHandle, type NatsUser } from "../../src/transport/nats-server.ts";
import { waitUntil, withDeadline } from "../harness/index.ts";

const enc = (s: string) => new TextEncoder().encode(s);
const dec = (b: Uint8Array) => new TextDecoder().decode(b);

let server: NatsServerHandle;
let admin: Bus;
let users: Map<string, NatsUser>;
const buses: Bus[] = [];
const alpha = jobNames("alpha");
const beta = jobNames("beta");

beforeAll(async () => {
  // alpha: h1 hosts the whole loop, `ro` only a rollout; beta: one host with the whole loop
  const loop = ["train.rollout", "fleet", "train.buffer", "train.trainer", "train.weight-sync"].map((kind) => ({ name: kind.replace("train.", ""), kind }));
  const a = nodeUsers("alpha", { hosts: [{ name: "h1" }, { name: "ro" }], actors: [...loop, { name: "rollout-2", kind: "train.rollout", placement: "ro" }] } as unknown as Topology);
  const b = nodeUsers("beta", { hosts: [{ name: "h1" }], actors: loop } as unknown as Topology);
  users = new Map([["alpha", a.get("h1")!], ["alpha-ro", a.get("ro")!], ["beta", b.get("h1")!]]);
  server = await startNatsServer({ users: [...users.values()] });
  admin = await connectBus({ url: server.authUrl });
  const topo = { name: "t", train: { checkpointEvery: 2 } } as unknown as Topology;
  await ensureJobAssets(admin, topo, "alpha");
  await ensureJobAssets(admin, topo, "beta");
  // beta's samples stream holds a sample alpha must not read
  await admin.jsPublish(beta.trainSamples, enc("beta's secret sample"));
});

afterAll(async () => {
  for (const b of buses) await b.close();
  await admin?.close();
  await server?.stop();
});

/** Connects as job `job`'s node user, collecting the connection's status errors. */
async function nodeBus(who: "alpha" | "alpha-ro" | "beta"): Promise<{ bus: Bus; errors: string[] }> {
  const u = users.get(who)!;
  const job = who === "beta" ? "beta" : "alpha";
  const bus = await connectBus({ url: server.url, user: u.user, pass: u.password, inboxPrefix: jobNames(job).inbox, largeBucket: jobNames(job).objLarge, reconnect: false });
  buses.push(bus);
  const errors: string[] = [];
  bus.onStatus((s: BusStatus) => {
    if (s.type === "error") errors.push(s.detail);
  });
  return { bus, errors };
}

describe("NATS users confined to a job", () => {
  it("the server has no token, and ooze's user and each node user need their own password", async () => {
    expect(server.user).toBe("ooze");
    expect(server.authUrl).toContain("ooze:");
    await expect(connectBus({ url: server.url, token: server.token, reconnect: false })).rejects.toMatchObject({ code: "TRANSPORT" });
    await expect(connectBus({ url: server.url, user: users.get("alpha")!.user, pass: users.get("beta")!.password, reconnect: false })).rejects.toMatchObject({ code: "TRANSPORT" });
  });

  it("a node user of job alpha works on alpha's subjects, streams, KV buckets and object stores", async () => {
    const { bus, errors } = await nodeBus("alpha");
    // core request/reply on the job's subjects (its reply inbox is under ooze.alpha.)
    const sub = bus.subscribe(alpha.actor("echo"), { handler: (m) => m.respond(m.data) });
    await bus.flush();
    expect(dec((await bus.request(alpha.actor("echo"), enc("ping"), { timeoutMs: 2_000 })).data)).toBe("ping");
    sub.unsubscribe();
    // ooze's own user asks, the node answers on ooze's `_INBOX` (allow_responses)
    bus.subscribe(alpha.control("h1"), { handler: (m) => m.respond(enc("pong")) });
    await bus.flush();
    expect(dec((await admin.request(alpha.control("h1"), enc("ps"), { timeoutMs: 2_000 })).data)).toBe("pong");
    // the job's streams, as made by ooze's user: found, not created again
    await ensureTrainStreams(bus, alpha, trainOf({ name: "t", train: { checkpointEvery: 2 } } as unknown as Topology));
    await bus.jsPublish(alpha.trainSamples, enc("alpha sample"));
    const consumer = await bus.ensureConsumer(alpha.streamSamples, alpha.consumer("buffer"));
    const got = await consumer.next({ expires: 2_000 });
    expect(got && dec(got.data)).toBe("alpha sample");
    got!.ack();
    // KV and object store of the job
    const kv = await bus.kv(alpha.kvEngines, { history: 1 });
    await kv.put("engine.e1", enc("up"));
    expect(dec((await kv.get("engine.e1"))!.value)).toBe("up");
    // an entry kept by the heartbeat worker (a rollout's membership): its renewals are requests,
    // whose replies come under the job's inbox prefix, not `_INBOX`
    const renewals: string[] = [];
    bus.heartbeats().keep(`$KV.${alpha.kvEngines}.engine.e2`, enc("kept"), 50, 60_000, (m) => renewals.push(m));
    await waitUntil(async () => (await kv.get("engine.e2"))?.value.length === 4, { timeoutMs: 10_000, what: "the worker's renewal stored", diagnostics: () => renewals.join("\n") });
    await bus.heartbeats().unkeep(`$KV.${alpha.kvEngines}.engine.e2`);
    expect(renewals).toEqual([]);
    const store = await bus.obj(alpha.objWeights);
    await store.putBlob({ name: "full-v1" }, new Uint8Array(300_000).fill(7));
    expect((await store.getBlob("full-v1"))?.length).toBe(300_000);
    await store.delete("full-v1");
    // a payload above max_payload crosses through the job's large-payload bucket
    const big = new Uint8Array(9 * 1024 * 1024).fill(3);
    const bigSub = bus.subscribe(alpha.chunk("big"));
    await bus.flush();
    await bus.publish(alpha.chunk("big"), big);
    for await (const m of bigSub) {
      expect(m.data.length).toBe(big.length);
      break;
    }
    await bus.flush();
    expect(errors).toEqual([]);
  });

  it("a node user of job alpha is refused job beta's subjects and streams, other inboxes, and stream management", async () => {
    const { bus, errors } = await nodeBus("alpha");
    const refused = async (what: string, p: Promise<unknown>) => {
      await expect(p, what).rejects.toThrow(/permissions violation/i);
    };
    // another job's samples stream: not its info, not its messages, no consumer on it
    const jsm = await bus.jsm();
    await refused("beta's stream info", jsm.streams.info(beta.streamSamples));
    await refused("beta's stream messages", jsm.streams.getMessage(beta.streamSamples, { seq: 1 }));
    await refused("a consumer on beta's stream", jsm.consumers.add(beta.streamSamples, { durable_name: "thief", ack_policy: "explicit" as never }));
    await refused("beta's KV bucket", bus.kv(beta.kvVersions));
    // no stream created, changed, purged or deleted, its job's included
    await refused("a new stream capturing beta's subjects", jsm.streams.add({ name: "THIEF", subjects: ["ooze.beta.>"] }));
    await refused("alpha's own stream re-created elsewhere", jsm.streams.add({ name: alpha.streamDead, subjects: ["ooze.beta.actor.>"] }));
    await refused("alpha's stream widened", jsm.streams.update(alpha.streamEvents, { subjects: ["ooze.>"] }));
    await refused("alpha's stream deleted", jsm.streams.delete(alpha.streamSamples));
    await refused("alpha's samples purged", jsm.streams.purge(alpha.streamSamples));
    // publishing into beta's samples stream: refused, and beta's stream still holds only its own
    await bus.publish(beta.trainSamples, enc("poisoned sample"));
    await refused("a JetStream publish to beta's samples", bus.jsPublish(beta.trainSamples, enc("poisoned sample"), { timeoutMs: 2_000 }));
    await bus.flush();
    expect((await (await admin.jsm()).streams.info(beta.streamSamples)).state.messages).toBe(1);
    // subscriptions outside the job: beta's subjects, every inbox, everything, the system account
    for (const subject of [beta.trainSamples, beta.actor("echo"), "_INBOX.>", ">", "$SYS.>", "$KV.ooze_beta_versions.>"]) {
      const sub = bus.subscribe(subject);
      await bus.flush();
      await waitUntil(() => errors.some((e) => e.includes(`Subscription to "${subject}"`)), { timeoutMs: 5_000, what: `refusal of ${subject}`, diagnostics: () => errors.join("\n") });
      sub.unsubscribe();
    }
    expect(errors.some((e) => /Publish to "ooze\.beta\.train\.samples"/.test(e))).toBe(true);
    // and beta's own node still reads its sample, unharmed
    const b = await nodeBus("beta");
    const c = await b.bus.ensureConsumer(beta.streamSamples, beta.consumer("buffer"));
    const m = await c.next({ expires: 2_000 });
    expect(m && dec(m.data)).toBe("beta's secret sample");
  });
});

describe("NATS users confined to their roles", () => {
  it("a host running only a rollout publishes samples and reads the loop's state, and writes none of the other roles' data", async () => {
    const { bus, errors } = await nodeBus("alpha-ro");
    const refused = async (what: string, p: Promise<unknown>) => {
      await expect(p, what).rejects.toThrow(/permissions violation/i);
    };
    const count = async (stream: string) => (await (await admin.jsm()).streams.info(stream)).state.messages;
    const before = { batches: await count(alpha.streamBatches), weights: await count(alpha.streamWeights), prompts: await count(alpha.streamPrompts) };
    // what a rollout does: publish samples, read the versions record and the weight objects
    await bus.jsPublish(alpha.trainSamples, enc("a rollout's sample"), { timeoutMs: 2_000 });
    const adminVersions = await admin.kv(alpha.kvVersions);
    await adminVersions.put("latest", enc("v1"));
    const versions = await bus.kv(alpha.kvVersions);
    expect(dec((await versions.get("latest"))!.value)).toBe("v1");
    await (await admin.obj(alpha.objWeights)).putBlob({ name: "full-v9" }, new Uint8Array(1000).fill(9));
    expect((await (await bus.obj(alpha.objWeights)).getBlob("full-v9"))?.length).toBe(1000);
    // what it may not: batches, weights messages, step metrics, prompts, the versions record, weight objects
    await refused("a batch", bus.jsPublish(alpha.trainBatches, enc("poisoned batch"), { timeoutMs: 2_000 }));
    await refused("a weights message", bus.jsPublish(alpha.trainWeights, enc("poisoned weights"), { timeoutMs: 2_000 }));
    await refused("step metrics", bus.jsPublish(alpha.trainMetrics, enc("fake metrics"), { timeoutMs: 2_000 }));
    await refused("a prompt group", bus.jsPublish(alpha.trainPrompts, enc("fake prompt"), { timeoutMs: 2_000 }));
    await refused("the versions record", versions.put("latest", enc("v999")));
    await refused("a weight object", (await bus.obj(alpha.objWeights)).putBlob({ name: "full-v10" }, new Uint8Array(1000).fill(6)));
    await refused("a purge of the weight objects", (await bus.jsm()).streams.purge(`OBJ_${alpha.objWeights}`));
    await bus.flush();
    expect(dec((await adminVersions.get("latest"))!.value)).toBe("v1");
    expect({ batches: await count(alpha.streamBatches), weights: await count(alpha.streamWeights), prompts: await count(alpha.streamPrompts) }).toEqual(before);
    expect(await (await admin.obj(alpha.objWeights)).info("full-v10")).toBeNull();
    expect(errors.some((e) => /Publish to "ooze\.alpha\.train\.batches"/.test(e))).toBe(true);
  });
});

describe("ooze up with the embedded nats-server", () => {
  const dir = mkdtempSync(join(tmpdir(), "ooze-perm-up-"));
  const children: ChildProcess[] = [];
  afterAll(() => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  });

  it("runs a training job whose nodes connect as their hosts' users, each refused nothing it needs", async () => {
    const out = join(dir, "run");
    const file = join(dir, "t.yaml");
    writeFileSync(
      file,
      `name: perm-train
hosts: [{ name: rollout }, { name: learner }]
actors:
  - { name: rollout, kind: train.rollout, placement: rollout }
  - { name: fleet, kind: fleet, placement: learner, config: { embedded: { count: 1, preset: tiny, maxRunning: 32, cacheTokens: 4096 } } }
  - { name: buffer, kind: train.buffer, placement: learner }
  - { name: trainer, kind: train.trainer, placement: learner, config: { out: ${JSON.stringify(out)} } }
  - { name: weight-sync, kind: train.weight-sync, placement: learner }
train: { mode: sync, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: 3, promptsPerStep: 2, samplesPerPrompt: 4, checkpointEvery: 2, weightSync: delta }
`,
    );
    const { OOZE_NATS_URL: _u, OOZE_NATS_TOKEN: _t, ...env } = process.env;
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", "perm-train"], { env: { ...env, OOZE_HOME: dir }, stdio: ["ignore", "pipe", "pipe"] });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));
    const diagnostics = () => log.slice(-6000);
    await waitUntil(() => log.includes("all 2 node(s) running"), { timeoutMs: 90_000, what: "both nodes running", diagnostics });
    // the job record holds ooze's own user; each node's environment its host's user, no token
    const rec = JSON.parse(readFileSync(join(dir, "jobs", "perm-train.json"), "utf8")) as { user: string; token: string | null };
    expect(rec.user).toBe("ooze");
    expect(rec.token).toBeNull();
    const pid = await waitUntil(() => Number(/\[rollout\] running [^\n]* \(pid (\d+)/.exec(log)?.[1]) || null, { timeoutMs: 30_000, what: "the rollout node's pid", diagnostics });
    const environ = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
    expect(environ).toContain("OOZE_NATS_USER=node-perm-train-rollout");
    expect(environ.some((e) => e.startsWith("OOZE_NATS_TOKEN="))).toBe(false);
    expect(await withDeadline(exited, 240_000, "the job to finish").catch((e: Error) => Promise.reject(new Error(`${e.message}\n${diagnostics()}`)))).toBe(0);
    expect(readJsonl<BatchRecord>(join(out, "batches.jsonl")).map((b) => b.step)).toEqual([1, 2, 3]);
    expect(log).not.toMatch(/NATS refused|permissions violation/i);
  });
  it("hands a host started elsewhere its own user in an owner-only env file, removed when the job stops", async () => {
    const file = join(dir, "echo.yaml");
    writeFileSync(
      file,
      `name: perm-echo
hosts: [{ name: a }, { name: b, start: external }]
actors:
  - { name: echo, kind: echo.server, placement: b }
  - { name: pinger, kind: echo.pinger, placement: a, config: { target: echo, count: 5, intervalMs: 50 } }
`,
    );
    const { OOZE_NATS_URL: _u, OOZE_NATS_TOKEN: _t, ...env } = process.env;
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", "perm-echo"], { env: { ...env, OOZE_HOME: dir }, stdio: ["ignore", "pipe", "pipe"] });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));
    const envFile = await waitUntil(() => /host b is started elsewhere: copy (\S+) /.exec(log)?.[1] ?? null, { timeoutMs: 30_000, what: "the env file of host b", diagnostics: () => log });
    expect(statSync(envFile).mode & 0o777).toBe(0o600);
    const vars = Object.fromEntries(readFileSync(envFile, "utf8").trim().split("\n").map((l) => l.split(/=(.*)/s).slice(0, 2) as [string, string]));
    expect(vars.OOZE_NATS_USER).toBe("node-perm-echo-b");
    const node = spawn(process.execPath, ["bin/ooze.mjs", "node", "--job", "perm-echo", "--topology", file, "--host", "b"], { env: { ...env, ...vars }, stdio: ["ignore", "pipe", "pipe"] });
    children.push(node);
    let nodeLog = "";
    node.stderr!.on("data", (d) => (nodeLog += d));
    const diagnostics = () => `${log.slice(-3000)}\nnode b:\n${nodeLog.slice(-2000)}`;
    await waitUntil(() => log.includes("done: 5 round trips"), { timeoutMs: 60_000, what: "the pinger's round trips to the external host", diagnostics });
    up.kill("SIGTERM");
    expect(await withDeadline(exited, 30_000, "ooze up to stop")).toBe(0);
    expect(existsSync(envFile)).toBe(false);
    expect(`${log}${nodeLog}`).not.toMatch(/NATS refused|permissions violation/i);
  });
});
