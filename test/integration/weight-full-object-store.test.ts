// Full checkpoints through the job's JetStream object store, with real components on both sides of a
// real nats-server: `ooze serve` engine processes, each started in its own empty working directory,
// owned by the fleet actor (its own actor system and NATS connection); on the trainer's side the
// train.weight-sync actor (transport object, keepFull 2) consuming WEIGHTS messages that name the
// trainer's model directories. Each engine sits behind a loopback HTTP relay that records every
// /update_weights_from_disk request and, before passing one on, moves the trainer's directory of
// that version away — so an engine can only load weights that came through the object store.
// Checked: version 0 and later versions are served exactly (greedy ids and logprobs of a fixed
// prompt equal those of the trainer's weights), no update names a trainer path, the fleet keeps only
// its copy of the served version; an engine that joins late gets that copy; only the newest full
// objects stay; a missing or corrupt object is a readable error that changes nothing, and the sync
// stores a corrupt one again. LoRA adapters carry their base once (a host without it fetches it
// once; one with it uses its own).
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fleetActor } from "../../actors/fleet/fleet-actor.ts";
import { askFleet, type FleetMsg } from "../../actors/protocol/fleet-messages.ts";
import { weightsMsg } from "../../actors/protocol/messages.ts";
import { ensureTrainStreams, publish, VersionsKv } from "../../actors/protocol/streams.ts";
import { FullWeightSync } from "../../actors/weight-sync/full.ts";
import { baseObjectName, fetchFullObject, fullObjectName, ObjectFullStore, type FullStore } from "../../actors/weight-sync/full-store.ts";
import { engineWeightLoader } from "../../actors/weight-sync/engine-loader.ts";
import { writePolicyFile } from "../../actors/protocol/policies.ts";
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import { randomAdapter, writePeftAdapter } from "../fixtures/peft-adapter.ts";
import { fleetTarget, weightSyncActor } from "../../actors/weight-sync/weight-sync-actor.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { attachBus, createSystem, remoteRef, type ActorRef, type ActorSystem } from "../../src/actor/index.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { startEngineServer } from "../../src/engine/server.ts";
import { OozeError } from "../../src/errors.ts";
import type { Topology } from "../../src/topology/schema.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { writeWeightVersions } from "../fixtures/weight-versions.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();
const root = mkdtempSync(join(tmpdir(), "ooze-full-obj-"));
const trainerRoot = join(root, "trainer");
const dirs: string[] = []; // dirs[k]: the trainer's model directory of version k
/** Where the relay moves the trainer's directory of version k (the reference weights). */
const moved = (d: string[], k: number) => `${d[k]!}.moved`;
const logs: string[] = [];
const children: ChildProcess[] = [];
const relays: Relay[] = [];
const systems: ActorSystem[] = [];
let bus: Bus;

/** A loopback relay in front of one engine: records the body of every weight update it passes on. */
interface Relay {
  url: string;
  engine: string;
  updates: { model_path: string; weight_version: string; load_format?: string }[];
  server: Server;
}

/** Passes requests on to `engine`; before an update it moves the trainer's directory of that version away. */
async function relay(engine: string, dirs: string[]): Promise<Relay> {
  const r: Relay = { url: "", engine, updates: [], server: createServer() };
  r.server.on("request", (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      void (async () => {
        const body = Buffer.concat(chunks);
        if (req.url === "/update_weights_from_disk") {
          const u = JSON.parse(body.toString("utf8")) as Relay["updates"][number];
          r.updates.push(u);
          const k = Number(u.weight_version);
          if (dirs[k] && existsSync(dirs[k])) renameSync(dirs[k], moved(dirs, k));
        }
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string" && k !== "host" && k !== "content-length") headers[k] = v;
        const init: RequestInit = { method: req.method ?? "GET", headers };
        if (body.length > 0) init.body = body;
        const out = await fetch(`${engine}${req.url ?? "/"}`, init);
        res.writeHead(out.status, { "content-type": out.headers.get("content-type") ?? "application/json" });
        res.end(Buffer.from(await out.arrayBuffer()));
      })().catch((e: Error) => {
        res.writeHead(502);
        res.end(e.message);
      });
    });
  });
  await new Promise<void>((ok) => r.server.listen(0, "127.0.0.1", ok));
  const addr = r.server.address() as { port: number };
  r.url = `http://127.0.0.1:${addr.port}`;
  relays.push(r);
  return r;
}

/** `ooze serve --preset tiny` (weights unlike any version's) in its own empty working directory; resolves with its URL. */
function serveEngine(seed: number): Promise<string> {
  const cwd = mkdtempSync(join(root, "engine-cwd-"));
  const bin = resolve("bin/ooze.mjs");
  const c = spawn(process.execPath, [bin, "serve", "--preset", "tiny", "--seed", String(seed), "--port", "0", "--max-running", "8", "--cache-tokens", "4096"], { cwd, stdio: ["ignore", "pipe", "pipe"] });
  children.push(c);
  let out = "";
  c.stdout!.on("data", (d) => (out += d));
  c.stderr!.on("data", (d) => (out += d));
  return waitUntil(() => /at (http:\/\/\S+)/.exec(out)?.[1] ?? (c.exitCode !== null ? Promise.reject(new Error(out)) : null), {
    timeoutMs: 60_000,
    what: "an `ooze serve` engine listening",
    diagnostics: () => out,
    intervalMs: 50,
  });
}

const PROMPT = [5, 17, 42, 99, 7, 3];

/** Greedy ids and logprobs of the fixed prompt on the engine at `url`. */
async function fingerprint(url: string): Promise<{ ids: number[]; logprobs: number[] }> {
  const r = await new EngineClient(url).generate({ inputIds: PROMPT, sampling: { max_new_tokens: 6, temperature: 0 }, returnLogprob: true });
  return { ids: [...r.outputIds], logprobs: [...r.logprobs!] };
}

const references = new Map<string, { ids: number[]; logprobs: number[] }>();
/** The fingerprint of the trainer's weights of version k (its directory, wherever the relay moved it), on the same native engine in this process. */
async function reference(d: string[], k: number): Promise<{ ids: number[]; logprobs: number[] }> {
  const have = references.get(d[k]!);
  if (have) return have;
  const backend = createNativeBackend({ modelDir: existsSync(moved(d, k)) ? moved(d, k) : d[k]!, maxRunning: 8, cacheTokens: 4096 });
  const server = await startEngineServer({ backend, weightVersion: String(k) });
  try {
    const f = await fingerprint(server.url);
    references.set(d[k]!, f);
    return f;
  } finally {
    await server.close();
    backend.close();
  }
}

/** One job: its fleet actor (on the engines' side) and weight-sync actor (on the trainer's side), each on its own system and connection. */
interface Job {
  names: ReturnType<typeof jobNames>;
  fleet: ActorRef<FleetMsg>;
  versions: VersionsKv;
  relays: Relay[];
  dirs: string[];
}

/** Starts `job`'s fleet actor over the engines behind `rs` and its weight-sync actor with `train` and `config`. */
async function startJob(name: string, rs: Relay[], d: string[], train: Record<string, unknown>, config: Record<string, unknown>): Promise<Job> {
  const names = jobNames(name);
  const fleetSide = createSystem({ name, log: (l) => logs.push(l) });
  systems.push(fleetSide);
  await attachBus(fleetSide, await nats.connect());
  fleetSide.spawn(fleetActor(fleetSide), { name: "fleet", config: { healthIntervalMs: 0, engines: rs.map((r) => r.url) } });
  const trainerSide = createSystem({ name, log: (l) => logs.push(l) });
  systems.push(trainerSide);
  await attachBus(trainerSide, bus);
  const fleet = remoteRef<FleetMsg>(trainerSide, "fleet");
  expect((await askFleet(fleet, { op: "list" }, 30_000)).engines.filter((e) => e.healthy)).toHaveLength(rs.length);
  const topology = { file: join(root, "t.yaml"), hosts: [{ name: "learner" }], actors: [], train: { preset: "tiny", ...train } } as unknown as Topology;
  await ensureTrainStreams(bus, names, { checkpointEvery: 0 });
  const versions = await VersionsKv.open(bus, names);
  trainerSide.spawn(weightSyncActor(trainerSide, topology), { name: "weight-sync", config: { updateTimeoutMs: 60_000, ...config } });
  return { names, fleet, versions, relays: rs, dirs: d };
}

/** Publishes the trainer's version k (as the trainer actor does) and waits until weight-sync recorded it. */
async function train(j: Job, k: number): Promise<void> {
  const body = { version: k, modelDir: j.dirs[k]!, step: k, position: { nextPrompt: 0, nextSample: 0, pending: [] } };
  await publish(bus, j.names.trainWeights, weightsMsg, body, `weights-${k}`, "test");
  await waitUntil(async () => ((await j.versions.get())?.version ?? -1) >= k, { timeoutMs: 60_000, what: `weight version ${k} recorded`, diagnostics: () => logs.slice(-20).join("\n") });
}

/** Names of the objects in the job's bucket whose names start with `prefix`. */
async function objects(j: Job, prefix: string): Promise<string[]> {
  return (await (await bus.obj(j.names.objWeights)).list()).map((o) => o.name).filter((n) => n.startsWith(prefix)).sort();
}

/** Every engine behind `rs` reports version k and serves exactly the trainer's weights of version k. */
async function expectServing(j: Job, rs: Relay[], k: number): Promise<void> {
  for (const r of rs) {
    expect(await new EngineClient(r.engine).weightVersion()).toBe(String(k));
    expect(await fingerprint(r.engine), `${r.engine} at version ${k}`).toEqual(await reference(j.dirs, k));
  }
}

let job: Job;

beforeAll(async () => {
  dirs.push(...(await writeWeightVersions(trainerRoot, 6, 5)).dirs);
  bus = await nats.connect();
  const a = await relay(await serveEngine(11), dirs);
  job = await startJob("full-obj", [a], dirs, {}, { transport: "object", keepFull: 2 });
}, 90_000);

afterAll(async () => {
  for (const s of systems.reverse()) await s.stop();
  for (const r of relays) await new Promise((ok) => r.server.close(ok));
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  rmSync(root, { recursive: true, force: true });
});

describe("full checkpoints through the job's object store", () => {
  it("engines in their own empty directories load version 0 and later versions only from the object store", async () => {
    const a = job.relays[0]!;
    for (const k of [0, 1, 2]) {
      await train(job, k);
      await expectServing(job, [a], k);
      // The trainer's directory was moved away before the engine loaded the version.
      expect(existsSync(dirs[k]!)).toBe(false);
    }
    expect(await reference(dirs, 1)).not.toEqual(await reference(dirs, 2)); // the check above tells versions apart
    expect(a.updates.map((u) => u.weight_version)).toEqual(["0", "1", "2"]);
    for (const u of a.updates) {
      expect(resolve(u.model_path).startsWith(root), u.model_path).toBe(false);
      expect(u.model_path).toMatch(/ooze-fleet-full-obj-weights-/);
    }
    // The fleet keeps its copy of the version it serves, and only that one.
    const served = a.updates.at(-1)!.model_path;
    expect(readdirSync(dirname(served))).toEqual([served.slice(dirname(served).length + 1)]);
    expect(await objects(job, "full-")).toEqual(["full-v1", "full-v2"]);
    expect(logs.join("\n")).toMatch(/weight-sync: engines serve version 2/);
  }, 120_000);

  it("an engine that joins after version 2 gets version 2 from the fleet's local copy", async () => {
    const a = job.relays[0]!;
    const b = await relay(await serveEngine(12), dirs);
    const r = await askFleet(job.fleet, { op: "attach", url: b.url }, 60_000);
    job.relays.push(b);
    expect(r.engine).toMatchObject({ healthy: true, weightVersion: "2" });
    expect(b.updates).toEqual([expect.objectContaining({ model_path: a.updates.at(-1)!.model_path, weight_version: "2" })]);
    expect(existsSync(dirs[2]!)).toBe(false);
    await expectServing(job, [a, b], 2);
  }, 90_000);

  it("keeps only the newest keepFull full objects, and never the served one", async () => {
    for (const k of [3, 4]) await train(job, k);
    await expectServing(job, job.relays, 4);
    expect(await objects(job, "full-")).toEqual(["full-v3", "full-v4"]);
    // A version stored but never served (its update failed) does not push out the served one.
    const store = await ObjectFullStore.open(bus, job.names.objWeights, 1);
    await store.put(moved(dirs, 3), 6);
    await store.prune(4);
    expect(await objects(job, "full-")).toEqual(["full-v4", "full-v6"]);
    await (await bus.obj(job.names.objWeights)).delete("full-v6");
  }, 120_000);

  it("a missing or corrupt full object is a readable error that changes nothing; the sync stores a corrupt one again", async () => {
    const os = await bus.obj(job.names.objWeights);
    const store = await ObjectFullStore.open(bus, job.names.objWeights, 2);
    const served = job.relays[0]!.updates.at(-1)!.model_path;
    const before = { updates: job.relays.map((r) => r.updates.length), local: readdirSync(dirname(served)) };
    const unchanged = async () => {
      expect(job.relays.map((r) => r.updates.length)).toEqual(before.updates);
      expect(readdirSync(dirname(served))).toEqual(before.local);
      expect((await askFleet(job.fleet, { op: "list" })).weightVersion).toBe("4");
      await expectServing(job, job.relays, 4);
    };
    const refused = async (name: string): Promise<OozeError> => {
      const e = await askFleet(job.fleet, { op: "updateWeights", version: "5", full: { bucket: job.names.objWeights, name } }).then(() => null, (x: unknown) => x);
      expect(e).toBeInstanceOf(OozeError);
      expect((e as OozeError).code).toBe("CHECKPOINT_INVALID");
      return e as OozeError;
    };

    expect((await refused("full-v99")).message).toMatch(/full checkpoint object 'ooze_full_obj_weights\/full-v99' is not in the object store/);
    await unchanged();

    // Corrupt at rest: an extra chunk (more than the object's meta counts).
    await store.put(dirs[5]!, 5);
    const info = (await os.info(fullObjectName(5)))!;
    await bus.js.publish(`$O.${job.names.objWeights}.C.${info.nuid}`, new Uint8Array([1, 2, 3]));
    expect((await refused("full-v5")).message).toMatch(/'ooze_full_obj_weights\/full-v5' is corrupt: its chunk subject holds more than the \d+ chunks its meta counts; store the checkpoint again/);
    await unchanged();

    // Garbled before it was stored (the digest covers the garbage): a file's CRC32 does not match.
    await store.put(dirs[5]!, 5);
    const bytes = (await os.getBlob(fullObjectName(5)))!;
    bytes[bytes.length - 100]! ^= 0xff;
    await os.putBlob({ name: fullObjectName(5) }, bytes);
    expect((await refused("full-v5")).message).toMatch(/'ooze_full_obj_weights\/full-v5' is corrupt: the CRC32 of model.safetensors does not match its manifest/);
    await unchanged();

    // A sync whose first stored copy is garbled on the way: the fleet refuses it, the sync stores it again.
    let garble = true;
    const flaky: FullStore = {
      async put(dir, version) {
        const location = await store.put(dir, version);
        if (garble) {
          garble = false;
          const b = (await os.getBlob(fullObjectName(version)))!;
          b[b.length - 100]! ^= 0xff;
          await os.putBlob({ name: fullObjectName(version) }, b);
        }
        return location;
      },
      prune: (served) => store.prune(served),
    };
    const sync = new FullWeightSync(fleetTarget((m) => askFleet(job.fleet, m, 60_000)), 4, (l) => logs.push(l), flaky);
    await sync.push(dirs[5]!, 5);
    expect(logs.join("\n")).toMatch(/weight sync to version 5 failed \(.*CRC32 of model.safetensors does not match.*\); storing the checkpoint again and retrying/);
    await expectServing(job, job.relays, 5);
  }, 120_000);
});

describe("weightSync delta with full checkpoints in the object store", () => {
  it("the fleet makes each version from its copy and the delta; an engine on another base falls back to that copy", async () => {
    const d = (await writeWeightVersions(join(root, "trainer-delta"), 2, 6)).dirs;
    const c = await relay(await serveEngine(13), d);
    const j = await startJob("full-obj-delta", [c], d, { weightSync: "delta", weightSyncWire: "fp32" }, { transport: "object", keepFull: 2, keepDeltas: 2 });

    await train(j, 0); // the first version goes in full: there is no base yet
    await expectServing(j, [c], 0);
    const local = dirname(c.updates[0]!.model_path);
    await train(j, 1);
    await expectServing(j, [c], 1);
    expect(c.updates.map((u) => u.load_format ?? null)).toEqual([null, "ooze-delta"]);
    // Version 1 was made from the fleet's copy of version 0 and the delta: one copy, not version 0's.
    expect(readdirSync(local)).toHaveLength(1);
    expect(join(local, readdirSync(local)[0]!)).not.toBe(c.updates[0]!.model_path);

    // The engine goes back to version 0 behind the fleet's back (as after a restart): it refuses the
    // delta 1→2 and loads the fleet's copy of version 2, made from its copy of 1 and the delta.
    expect((await new EngineClient(c.engine).updateWeightsFromDisk({ modelPath: moved(d, 0), weightVersion: "0" })).success).toBe(true);
    await train(j, 2);
    await expectServing(j, [c], 2);
    const last = c.updates.slice(-2);
    expect(last.map((u) => [u.weight_version, u.load_format ?? null])).toEqual([["2", "ooze-delta"], ["2", null]]);
    expect(dirname(last[1]!.model_path)).toBe(local);
    expect(readdirSync(local)).toEqual([last[1]!.model_path.slice(local.length + 1)]);
    for (const u of c.updates) expect(resolve(u.model_path).startsWith(root), u.model_path).toBe(false);
    expect(logs.join("\n")).toMatch(/weight-sync: engines serve version 2 \(step 2; delta, delta \d+ of \d+ bytes, full fallbacks: /);
    expect(logs.join("\n")).not.toMatch(/cannot make weight version/); // the fleet never fetched a full object after version 0
    expect(await objects(j, "")).toEqual(["delta-v0-v1", "delta-v1-v2", "full-v1", "full-v2"]);
  }, 120_000);
});

describe("LoRA adapters' base through the object store", () => {
  it("a version of adapters carries its base once: a host without it fetches it once, a host with it uses its own", async () => {
    const bucket = "ooze_full_obj_base";
    const native = loadNative();
    const base = join(root, "lora-base");
    native.saveModelDir(base, PRESETS.tiny, native.initModelParams(PRESETS.tiny, 3, 0.1), null);
    const version = (k: number) => {
      const v = join(root, `lora-v${k}`);
      writePeftAdapter(join(v, "a"), randomAdapter(native.modelLayout(PRESETS.tiny).tensors, { rank: 2, alpha: 4, seed: k }), { base_model_name_or_path: base });
      writePolicyFile(join(v, "a"), "a");
      native.saveModelDir(join(v, "b"), PRESETS.tiny, native.initModelParams(PRESETS.tiny, 10 + k, 0.1), null);
      writePolicyFile(join(v, "b"), "b");
      return v;
    };
    const store = await ObjectFullStore.open(bus, bucket, 1);
    const ref = (loc: string) => ({ bucket, name: loc.split("/").at(-1)! });
    const baseOf = (d: string) => (JSON.parse(readFileSync(join(d, "a", "adapter_config.json"), "utf8")) as { base_model_name_or_path: string }).base_model_name_or_path;
    const stored = async () => (await (await bus.obj(bucket)).list()).map((o) => o.name).sort();
    const v1 = await store.put(version(1), 1);
    expect(await stored()).toEqual([baseObjectName(base), "full-v1"]);

    // this host has the base where the adapters name it: used in place, nothing else fetched
    const here = join(root, "fetch-here");
    expect(await fetchFullObject(bus, ref(v1), join(here, "v1"), join(here, "bases"))).toBe("1");
    expect(baseOf(join(here, "v1"))).toBe(base);
    expect(existsSync(join(here, "bases"))).toBe(false);

    // another host (the base is not there): fetched once into its bases directory, which the adapters then name
    renameSync(base, `${base}.away`);
    const there = join(root, "fetch-there");
    expect(await fetchFullObject(bus, ref(v1), join(there, "v1"), join(there, "bases"))).toBe("1");
    const local = join(there, "bases", baseObjectName(base));
    expect(baseOf(join(there, "v1"))).toBe(local);
    expect(readFileSync(join(local, "model.safetensors")).equals(readFileSync(join(`${base}.away`, "model.safetensors")))).toBe(true);
    expect(existsSync(join(there, "v1", "b", "model.safetensors"))).toBe(true);
    const fetchedAt = statSync(join(local, "model.safetensors")).mtimeMs;
    renameSync(`${base}.away`, base);

    // the next version does not store the base again, pruning never removes it, and the other host reuses its copy
    const v2 = await store.put(version(2), 2);
    await store.prune(2);
    expect(await stored()).toEqual([baseObjectName(base), "full-v2"]);
    renameSync(base, `${base}.away`);
    expect(await fetchFullObject(bus, ref(v2), join(there, "v2"), join(there, "bases"))).toBe("2");
    expect(baseOf(join(there, "v2"))).toBe(local);
    expect(statSync(join(local, "model.safetensors")).mtimeMs).toBe(fetchedAt);
    // the engine loads the fetched version: the adapter over the fetched base, the full policy as a model
    const backend = createNativeBackend({ modelDir: local });
    await engineWeightLoader(backend, local)({ modelPath: join(there, "v2"), loadFormat: null, weightVersion: "2", currentVersion: "0" });
    expect(backend.lora!.list().map((x) => [x.name, x.full ?? false])).toEqual([["a", false], ["b", true]]);
    backend.close();
    renameSync(`${base}.away`, base);
  });
});

describe("a weight-sync actor that stops while its push retries", () => {
  it("makes no further try once stopped, and an ask on a closed bus fails at once", async () => {
    // A job whose fleet actor never answers: the push of version 1 fails and retries.
    const name = "full-obj-stop";
    const names = jobNames(name);
    const own: string[] = [];
    const side = createSystem({ name, log: (l) => own.push(l) });
    const sideBus = await nats.connect();
    await attachBus(side, sideBus);
    const topology = { file: join(root, "t.yaml"), hosts: [{ name: "learner" }], actors: [], train: { preset: "tiny" } } as unknown as Topology;
    await ensureTrainStreams(bus, names, { checkpointEvery: 0 });
    side.spawn(weightSyncActor(side, topology), { name: "weight-sync", config: { fleet: "nobody", updateTimeoutMs: 1_000 } });
    const body = { version: 1, modelDir: dirs[1]!, step: 1, position: { nextPrompt: 0, nextSample: 0, pending: [] } };
    await publish(bus, names.trainWeights, weightsMsg, body, "weights-1", "test");
    const tries = () => own.filter((l) => l.includes("weight sync to version 1 failed")).length;
    await waitUntil(() => tries() >= 2, { timeoutMs: 60_000, what: "the push of version 1 retried", diagnostics: () => own.slice(-10).join("\n") });

    const fleetRef = remoteRef<FleetMsg>(side, "fleet");
    await side.stop();
    await sideBus.close();
    const after = tries();
    // Before Dec 1 the push went on: each try asked the closed bus until its deadline (here 1 s) and
    // tried again within 2 s, 20 times. Five seconds would see two more tries.
    await new Promise((r) => setTimeout(r, 5_000));
    expect(tries(), own.slice(-5).join("\n")).toBe(after);

    // An ask on the closed bus: a TRANSPORT error that is not retryable, at once rather than at its deadline.
    const e = (await askFleet(fleetRef, { op: "list" }, 600_000).catch((x: unknown) => x)) as OozeError;
    expect(e).toBeInstanceOf(OozeError);
    expect(e.code).toBe("TRANSPORT");
    expect(e.retryable).toBe(false);
    expect(e.message).toMatch(/the connection to NATS is closed/);
  }, 90_000);
});
