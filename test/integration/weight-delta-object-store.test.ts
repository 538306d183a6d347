// Weight deltas through the job's JetStream object store, with real components on both sides of a
// real nats-server: the fleet actor (its own actor system and NATS connection) owns two `ooze
// serve`-style engines (the native backend with engineWeightLoader, as `ooze serve` builds them);
// on the trainer's side DeltaWeightSync puts each delta in the job's bucket and asks the fleet over
// NATS, as the train.weight-sync actor does (fleetTarget). Each engine's weight loads are observed
// (the CRC32 of the weights handed to its backend) to check that it serves the trainer's weights bit
// for bit. Checked: deltas apply exactly and the bucket keeps only the newest; an engine on another
// base, a delta garbled before it was stored, and a corrupt or missing object each end in the full
// checkpoint, recorded; re-applying a version changes nothing and versions only increase.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { crc32 } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fleetActor } from "../../actors/fleet/fleet-actor.ts";
import { askFleet, type FleetMsg } from "../../actors/protocol/fleet-messages.ts";
import { DeltaWeightSync } from "../../actors/weight-sync/delta-sync.ts";
import { ObjectDeltaStore, parseObjectLocation, withDeltaObject, type DeltaStore } from "../../actors/weight-sync/delta-store.ts";
import { DELTA_LOAD_FORMAT, engineWeightLoader } from "../../actors/weight-sync/engine-loader.ts";
import { fleetTarget } from "../../actors/weight-sync/weight-sync-actor.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { loadNative } from "../../native/load.ts";
import { attachBus, createSystem, remoteRef, type ActorRef, type ActorSystem } from "../../src/actor/index.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import { writeWeightVersions } from "../fixtures/weight-versions.ts";
import { useNats } from "../harness/index.ts";

const nats = useNats();
const job = "delta-obj";
const names = jobNames(job);
const root = mkdtempSync(join(tmpdir(), "ooze-delta-obj-"));
const dirs: string[] = []; // dirs[k]: the trainer's version k
const crcs: number[] = []; // CRC32 of version k's parameters
const logs: string[] = []; // the syncs' log lines

/** An `ooze serve`-style engine whose backend records the CRC32 of every set of weights it loads. */
interface Engine {
  url: string;
  loads: number[];
  server: EngineServer;
  backend: InferenceBackend;
}
const engines: Engine[] = [];
const systems: ActorSystem[] = [];
let trainerBus: Bus;
let fleet: ActorRef<FleetMsg>;

const crcOf = (params: Float32Array) => crc32(new Uint8Array(params.buffer, params.byteOffset, params.byteLength));

/** The real native backend; loadWeights first reads the directory it is given and records its CRC. */
function observed(backend: InferenceBackend, loads: number[]): InferenceBackend {
  return new Proxy(backend, {
    get(target, key) {
      if (key === "loadWeights")
        return async (dir: string) => {
          loads.push(crcOf(loadNative().loadModelDir(dir).params));
          await target.loadWeights(dir);
        };
      const v = Reflect.get(target, key, target) as unknown;
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}

async function startEngine(): Promise<Engine> {
  const native = createNativeBackend({ modelDir: dirs[0]!, maxRunning: 8, cacheTokens: 4096 });
  const loads: number[] = [];
  const backend = observed(native, loads);
  const server = await startEngineServer({ backend, weightVersion: "0", modelPath: dirs[0]!, loadWeights: engineWeightLoader(backend, dirs[0]!) });
  return { url: server.url, loads, server, backend: native };
}

/** Every engine reports `version` and last loaded exactly the trainer's weights of that version. */
async function expectServing(version: number): Promise<void> {
  for (const e of engines) {
    expect(await new EngineClient(e.url).weightVersion()).toBe(String(version));
    expect(e.loads.at(-1), `${e.url}: CRC of the weights it loaded`).toBe(crcs[version]);
  }
}

/** Names of the delta objects in the job's bucket. */
async function objects(): Promise<string[]> {
  return (await (await trainerBus.obj(names.objWeights)).list()).map((o) => o.name).sort();
}

/** A DeltaStore that stores through `store` and then does `after` to the stored object (a fault in transit or at rest). */
function tampered(store: DeltaStore, after: (bucket: string, name: string) => Promise<void>): DeltaStore {
  return {
    async put(base, version, bytes) {
      const location = await store.put(base, version, bytes);
      const ref = parseObjectLocation(location)!;
      await after(ref.bucket, ref.name);
      return location;
    },
    prune: (floor) => store.prune(floor),
  };
}

beforeAll(async () => {
  const versions = await writeWeightVersions(root, 8, 3);
  dirs.push(...versions.dirs);
  crcs.push(...versions.params.map(crcOf));
  engines.push(await startEngine(), await startEngine());
  // The engines' side: the fleet actor of the job, on its own connection.
  const fleetSide = createSystem({ name: job, log: () => {} });
  systems.push(fleetSide);
  await attachBus(fleetSide, await nats.connect());
  fleetSide.spawn(fleetActor(fleetSide), { name: "fleet", config: { healthIntervalMs: 0, engines: engines.map((e) => e.url) } });
  // The trainer's side: another system and connection, reaching the fleet only through NATS.
  const trainerSide = createSystem({ name: job, log: () => {} });
  systems.push(trainerSide);
  trainerBus = await nats.connect();
  await attachBus(trainerSide, trainerBus, { serve: false });
  fleet = remoteRef<FleetMsg>(trainerSide, "fleet");
  const listed = await askFleet(fleet, { op: "list" }, 30_000);
  expect(listed.engines.filter((e) => e.healthy)).toHaveLength(2);
}, 60_000);

afterAll(async () => {
  for (const s of systems.reverse()) await s.stop();
  for (const e of engines) {
    await e.server.close();
    e.backend.close();
  }
  rmSync(root, { recursive: true, force: true });
});

describe("weight deltas through the JetStream object store", () => {
  let sync: DeltaWeightSync;
  let store: ObjectDeltaStore;

  it("engines take each delta from the object store and serve the trainer's weights bit for bit; the bucket keeps the newest deltas", async () => {
    store = await ObjectDeltaStore.open(trainerBus, names.objWeights);
    const dir = join(root, "sync");
    sync = new DeltaWeightSync(fleetTarget((m) => askFleet(fleet, m, 60_000)), 0, { dir, store, baseModelDir: dirs[0]!, keep: 2, log: (l) => logs.push(l) });

    const r1 = await sync.push(dirs[1]!, 1);
    expect(r1).toMatchObject({ version: 1, kind: "delta", fallbacks: [] });
    expect(r1.deltaBytes!).toBeLessThan(r1.fullBytes);
    expect(await objects()).toEqual(["delta-v0-v1"]);
    await expectServing(1);
    expect(crcs[1]).not.toBe(crcs[0]);

    for (const v of [2, 3]) expect(await sync.push(dirs[v]!, v)).toMatchObject({ kind: "delta", fallbacks: [] });
    await expectServing(3);
    // keep 2: the deltas to versions 2 and 3 stay; nothing went through the directory (fp32 wire).
    expect(await objects()).toEqual(["delta-v1-v2", "delta-v2-v3"]);
    expect(existsSync(dir)).toBe(false);
  }, 60_000);

  it("an engine on another base, a garbled delta, and a corrupt or missing object each end in the full checkpoint, recorded", async () => {
    // Engine B is back at version 0 behind the fleet's back (as after a restart): it refuses the
    // delta 3→4 and loads the full checkpoint; engine A takes the delta.
    const b = engines[1]!;
    expect((await new EngineClient(b.url).updateWeightsFromDisk({ modelPath: dirs[0]!, weightVersion: "0" })).success).toBe(true);
    const r4 = await sync.push(dirs[4]!, 4);
    expect(r4.kind).toBe("delta");
    expect(r4.fallbacks).toEqual([{ engine: b.url, reason: expect.stringMatching(/weight delta 3→4 does not apply to version 0/) }]);
    expect(logs.join("\n")).toMatch(/loaded version 4 in full \(delta refused/);
    await expectServing(4);

    // The delta's bytes garbled before they were stored (the object store's digest covers the garbage):
    // both engines refuse it on their checksums and load the full checkpoint.
    const garble = tampered(store, async (bucket, name) => {
      const os = await trainerBus.obj(bucket);
      const bytes = (await os.getBlob(name))!.map((x, i) => (i > 200 ? x ^ 0xff : x));
      await os.putBlob({ name }, bytes);
    });
    sync = syncWith(garble, 4);
    const r5 = await sync.push(dirs[5]!, 5);
    expect(r5.kind).toBe("delta");
    expect(r5.fallbacks.map((f) => f.engine).sort()).toEqual(engines.map((e) => e.url).sort());
    for (const f of r5.fallbacks) expect(f.reason).toMatch(/weight delta/);
    await expectServing(5);

    // An object corrupted at rest (an extra chunk, more than its meta counts): the fleet cannot
    // fetch it, no engine changes, and the sync loads the full checkpoint on every engine.
    const corrupt = tampered(store, async (bucket, name) => {
      const info = (await (await trainerBus.obj(bucket)).info(name))!;
      await trainerBus.js.publish(`$O.${bucket}.C.${info.nuid}`, new Uint8Array([1, 2, 3]));
    });
    sync = syncWith(corrupt, 5);
    const loadsBefore = engines.map((e) => e.loads.length);
    const r6 = await sync.push(dirs[6]!, 6);
    expect(r6.kind).toBe("full");
    expect(r6.fallbacks).toEqual([{ engine: "*", reason: expect.stringMatching(/weight delta object '.*delta-v5-v6' is corrupt: its chunk subject holds more/s) }]);
    expect(engines.map((e) => e.loads.length)).toEqual(loadsBefore.map((n) => n + 1)); // one load each: the full checkpoint
    await expectServing(6);

    // An object gone before the fleet fetches it (pruned by another writer): the same.
    const vanish = tampered(store, async (bucket, name) => void (await (await trainerBus.obj(bucket)).delete(name)));
    sync = syncWith(vanish, 6);
    const r7 = await sync.push(dirs[7]!, 7);
    expect(r7).toMatchObject({ kind: "full", fallbacks: [{ engine: "*", reason: expect.stringMatching(/delta-v6-v7' is not in the object store/) }] });
    await expectServing(7);
    expect(logs.join("\n")).toMatch(/delta update to version 7 failed .*; loading the full checkpoint/);

    // Back to the plain store: the next version goes as a delta again.
    sync = syncWith(store, 7);
    expect(await sync.push(dirs[8]!, 8)).toMatchObject({ kind: "delta", fallbacks: [] });
    await expectServing(8);
    expect(await objects()).toEqual(["delta-v7-v8"]); // keep 2; the version-7 object was deleted by the fault above
  }, 90_000);

  it("re-applying a version changes nothing; versions only increase", async () => {
    const loadsBefore = engines.map((e) => e.loads.length);
    await expect(sync.push(dirs[8]!, 8)).rejects.toThrow(/version 8 is not above the engines' 8; versions only increase/);
    await expect(sync.push(dirs[7]!, 7)).rejects.toThrow(/versions only increase/);
    // The fleet refuses the same delta again (its version is not above the current one).
    const again = askFleet(fleet, { op: "updateWeights", modelDir: dirs[8]!, version: "8", delta: { bucket: names.objWeights, name: "delta-v7-v8" } });
    await expect(again).rejects.toThrow(/weight version '8' is not above the current '8'; versions only increase/);
    // An engine given the delta it serves already: accepted, and nothing is loaded.
    const a = new EngineClient(engines[0]!.url);
    await withDeltaObject(trainerBus, { bucket: names.objWeights, name: "delta-v7-v8" }, async (file) => {
      const r = await a.updateWeightsFromDisk({ modelPath: file, loadFormat: DELTA_LOAD_FORMAT, weightVersion: "8" });
      expect(r.success, r.message).toBe(true);
    });
    expect(engines.map((e) => e.loads.length)).toEqual(loadsBefore);
    await expectServing(8);
  }, 60_000);
});

/** A DeltaWeightSync through the fleet actor with `store`, at `version` (the engines' weights: dirs[version]). */
function syncWith(store: DeltaStore, version: number): DeltaWeightSync {
  return new DeltaWeightSync(fleetTarget((m) => askFleet(fleet, m, 60_000)), version, { dir: join(root, "sync"), store, baseModelDir: dirs[version]!, keep: 2, log: (l) => logs.push(l) });
}
