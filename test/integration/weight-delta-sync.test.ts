// DeltaWeightSync through a Fleet of real `ooze serve` child processes: engines that take the delta
// serve exactly what a full load of the same version serves (greedy ids and logprobs equal); an
// engine whose weights are not the delta's base falls back to the full checkpoint, recorded; a
// corrupt delta file is refused with a clear error and the engine keeps its weights; the bf16 wire
// gives engines the trainer's weights rounded to bf16, byte for byte.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngineProcess, type EngineProcess } from "../../actors/rollout/generator.ts";
import { decodeDelta, encodeDelta, roundToBf16 } from "../../actors/weight-sync/delta.ts";
import { DeltaWeightSync } from "../../actors/weight-sync/delta-sync.ts";
import { DELTA_LOAD_FORMAT } from "../../actors/weight-sync/engine-loader.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { loadNative } from "../../native/load.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { startEngineServer } from "../../src/engine/server.ts";
import { Packr } from "msgpackr";
import { writeWeightVersions } from "../fixtures/weight-versions.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-delta-sync-"));
const procs: EngineProcess[] = [];
const dirs: string[] = []; // dirs[k]: version k
const req = { inputIds: [256, 72, 105, 33, 32], sampling: { max_new_tokens: 6, temperature: 0, ignore_eos: true }, returnLogprob: true };

/** Greedy ids and logprobs of `url` for the fixed request. */
async function output(url: string): Promise<{ ids: number[]; lps: number[] }> {
  const r = await new EngineClient(url).generate(req);
  return { ids: Array.from(r.outputIds), lps: Array.from(r.logprobs) };
}

/** What a fresh engine loaded in full from `dir` serves (in-process reference). */
async function reference(dir: string): Promise<{ ids: number[]; lps: number[] }> {
  const backend = createNativeBackend({ modelDir: dir });
  const server = await startEngineServer({ backend, weightVersion: "ref" });
  try {
    return await output(server.url);
  } finally {
    await server.close();
    backend.close();
  }
}

beforeAll(async () => {
  dirs.push(...(await writeWeightVersions(root, 5, 5)).dirs);
  procs.push(...(await Promise.all([0, 1].map(() => startEngineProcess({ modelDir: dirs[0]!, maxRunning: 8, cacheTokens: 4096, weightVersion: "0" })))));
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => p.stop()));
  rmSync(root, { recursive: true, force: true });
});

describe("delta weight sync through real engines", () => {
  it("delivers the trainer's exact weights, falls back to full for an engine on another base, refuses corrupt files", async () => {
    const fleet = new Fleet({ healthIntervalMs: 0 });
    const logs: string[] = [];
    try {
      for (const p of procs) await fleet.attach(p.url);
      const sync = new DeltaWeightSync(fleet, 0, { dir: join(root, "sync"), baseModelDir: dirs[0]!, log: (l) => logs.push(l) });

      const r1 = await sync.push(dirs[1]!, 1);
      expect(r1).toMatchObject({ version: 1, kind: "delta", fallbacks: [] });
      expect(r1.deltaBytes!).toBeLessThan(r1.fullBytes);
      const ref1 = await reference(dirs[1]!);
      for (const p of procs) {
        expect(await new EngineClient(p.url).weightVersion()).toBe("1");
        expect(await output(p.url)).toEqual(ref1);
      }
      expect(ref1).not.toEqual(await reference(dirs[0]!));

      // Engine B is back at version 0 behind the fleet's back (as after a restart from the first checkpoint).
      const b = new EngineClient(procs[1]!.url);
      expect((await b.updateWeightsFromDisk({ modelPath: dirs[0]!, weightVersion: "0" })).success).toBe(true);
      const r2 = await sync.push(dirs[2]!, 2);
      expect(r2.kind).toBe("delta");
      expect(r2.fallbacks).toHaveLength(1);
      expect(r2.fallbacks[0]!.engine).toBe(procs[1]!.url);
      expect(r2.fallbacks[0]!.reason).toMatch(/weight delta 1→2 does not apply to version 0/);
      expect(logs.join("\n")).toMatch(/loaded version 2 in full \(delta refused/);
      const ref2 = await reference(dirs[2]!);
      for (const p of procs) {
        expect(await new EngineClient(p.url).weightVersion()).toBe("2");
        expect(await output(p.url)).toEqual(ref2);
      }
      // The next delta applies to both again; the old files are pruned (keep 2).
      const r3 = await sync.push(dirs[3]!, 3);
      expect(r3).toMatchObject({ kind: "delta", fallbacks: [] });
      expect(existsSync(join(root, "sync", "v0-v1.ooze-delta"))).toBe(false);
      expect(existsSync(join(root, "sync", "v2-v3.ooze-delta"))).toBe(true);
      const ref3 = await reference(dirs[3]!);
      for (const p of procs) expect(await output(p.url)).toEqual(ref3);
      expect(sync.stats).toMatchObject({ deltas: 3, fulls: 0, engineFallbacks: 1 });
      await expect(sync.push(dirs[3]!, 3)).rejects.toThrow(/version 3 is not above the engines' 3; versions only increase/);

      // A delta 3→4 whose second tensor's data was corrupted in transit: refused, weights unchanged.
      const packr = new Packr({ useRecords: false });
      const native = loadNative();
      const m3 = native.loadModelDir(dirs[3]!), m4 = native.loadModelDir(dirs[4]!);
      const layout = m3.tensors.map((t) => ({ name: t.name, offset: t.offset, numel: t.shape.reduce((x, y) => x * y, 1) }));
      const d = decodeDelta(encodeDelta(layout, m3.params, m4.params, "3", "4"));
      const victim = d.tensors[1]!;
      const badFile = join(root, "corrupt.ooze-delta");
      writeFileSync(badFile, packr.pack({ ...d, tensors: d.tensors.map((t) => (t === victim ? { ...t, crc: (t.crc + 1) >>> 0 } : t)) }));
      const a = new EngineClient(procs[0]!.url);
      const bad = await a.updateWeightsFromDisk({ modelPath: badFile, loadFormat: DELTA_LOAD_FORMAT, weightVersion: "4" });
      expect(bad.success).toBe(false);
      expect(bad.message).toContain(`weight delta: checksum of ${victim.name} after applying does not match; the delta file is corrupt`);
      expect(await a.weightVersion()).toBe("3");
      expect(await output(procs[0]!.url)).toEqual(ref3);
      // Through the sync, a refused (here: garbled) delta file means a full load, recorded.
      const file = join(root, "sync", "v3-v4.ooze-delta");
      const target = {
        updateWeights: (path: string, version: string, opts?: { loadFormat?: string; fullModelDir?: string }) => {
          if (path === file) writeFileSync(file, readFileSync(file).map((x, i) => (i > 200 ? x ^ 0xff : x)));
          return fleet.updateWeights(path, version, opts);
        },
      };
      const sync4 = new DeltaWeightSync(target, 3, { dir: join(root, "sync"), baseModelDir: dirs[3]! });
      const r4 = await sync4.push(dirs[4]!, 4);
      expect(r4.fallbacks.map((f) => f.engine).sort()).toEqual(procs.map((p) => p.url).sort());
      expect(r4.fallbacks[0]!.reason).toMatch(/weight delta/);
      const ref4 = await reference(dirs[4]!);
      for (const p of procs) expect(await output(p.url)).toEqual(ref4);
      // A target that drops opts (a Generator that does not forward them) loads the delta file as a
      // model directory: every engine refuses it, and the sync loads the full checkpoint everywhere.
      const dropsOpts = { updateWeights: (path: string, version: string) => fleet.updateWeights(path, version) };
      const sync5 = new DeltaWeightSync(dropsOpts, 4, { dir: join(root, "sync"), baseModelDir: dirs[4]! });
      const r5 = await sync5.push(dirs[5]!, 5);
      expect(r5.kind).toBe("full");
      expect(r5.fallbacks).toEqual([{ engine: "*", reason: expect.stringMatching(/no engine took weight version '5'/) }]);
      const ref5 = await reference(dirs[5]!);
      for (const p of procs) expect(await output(p.url)).toEqual(ref5);
    } finally {
      await fleet.close();
    }
  }, 60_000);

  it("bf16 wire: engines hold the trainer's weights rounded to bf16, byte for byte", async () => {
    const engine = await startEngineProcess({ modelDir: dirs[0]!, maxRunning: 8, cacheTokens: 4096, weightVersion: "0" });
    procs.push(engine);
    const fleet = new Fleet({ healthIntervalMs: 0 });
    try {
      await fleet.attach(engine.url);
      const dir = join(root, "sync-bf16");
      const sync = new DeltaWeightSync(fleet, 0, { dir, baseModelDir: dirs[0]!, wire: "bf16" });
      // The engine holds unrounded fp32 weights: the first version goes in full (rounded).
      expect(await sync.push(dirs[1]!, 1)).toMatchObject({ kind: "full", deltaBytes: null, fallbacks: [] });
      const r2 = await sync.push(dirs[2]!, 2);
      expect(r2).toMatchObject({ kind: "delta", fallbacks: [] });
      const fp32 = await new DeltaWeightSync({ updateWeights: async () => undefined }, 1, { dir: join(root, "sizes"), baseModelDir: dirs[1]! }).push(dirs[2]!, 2);
      expect(r2.deltaBytes!).toBeLessThan(fp32.deltaBytes!);
      // What the engine serves equals a full load of the rounded weights, written independently here.
      const native = loadNative();
      const m2 = native.loadModelDir(dirs[2]!);
      const rounded = join(root, "v2-rounded");
      native.saveModelDir(rounded, m2.config, roundToBf16(m2.params), "2");
      expect(await output(engine.url)).toEqual(await reference(rounded));
      expect(await output(engine.url)).not.toEqual(await reference(dirs[2]!));
      expect(Buffer.compare(readFileSync(join(dir, "v2-bf16", "model.safetensors")), readFileSync(join(rounded, "model.safetensors")))).toBe(0);
    } finally {
      await fleet.close();
    }
  }, 60_000);
});
