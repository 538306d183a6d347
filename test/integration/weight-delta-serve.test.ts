// An engine server takes ooze's lossless weight deltas through /update_weights_from_disk
// (load_format "ooze-delta"): the result serves exactly what a full checkpoint of the new weights does.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DELTA_LOAD_FORMAT, engineWeightLoader } from "../../actors/weight-sync/engine-loader.ts";
import { encodeDelta } from "../../actors/weight-sync/delta.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { loadNative } from "../../native/load.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { startEngineServer } from "../../src/engine/server.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-delta-serve-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("engine server with weight deltas", () => {
  it("applies a delta bit-exactly, refuses one made from other weights, and keeps serving", async () => {
    const native = loadNative();
    const dirA = join(root, "a");
    const dirB = join(root, "b");
    await initModelDir("tiny", dirA, 11);
    const a = native.loadModelDir(dirA);
    const layout = a.tensors.map((t) => ({ name: t.name, offset: t.offset, numel: t.shape.reduce((x, y) => x * y, 1) }));
    const b = a.params.map((x, i) => (i % 3 === 0 ? x * 1.01 + 1e-3 : x)); // an "optimizer step"
    native.saveModelDir(dirB, a.config, b, "2");
    const deltaFile = join(root, "1-to-2.delta");
    writeFileSync(deltaFile, encodeDelta(layout, a.params, b, "1", "2"));
    const wrongFile = join(root, "5-to-6.delta");
    writeFileSync(wrongFile, encodeDelta(layout, b, a.params, "5", "6"));

    const backend = createNativeBackend({ modelDir: dirA });
    const server = await startEngineServer({ backend, weightVersion: "1", loadWeights: engineWeightLoader(backend, dirA) });
    const refBackend = createNativeBackend({ modelDir: dirB });
    const ref = await startEngineServer({ backend: refBackend, weightVersion: "2" });
    try {
      const client = new EngineClient(server.url);
      const req = { inputIds: [256, 51, 43, 52, 61], sampling: { max_new_tokens: 6, temperature: 0, ignore_eos: true }, returnLogprob: true };
      const before = await client.generate(req);

      const up = await client.updateWeightsFromDisk({ modelPath: deltaFile, loadFormat: DELTA_LOAD_FORMAT, weightVersion: "2" });
      expect(up.success, up.message).toBe(true);
      expect(await client.weightVersion()).toBe("2");
      const after = await client.generate(req);
      const expected = await new EngineClient(ref.url).generate(req);
      expect(Array.from(after.outputIds)).toEqual(Array.from(expected.outputIds));
      expect(Array.from(after.logprobs)).toEqual(Array.from(expected.logprobs));
      expect(Array.from(after.logprobs)).not.toEqual(Array.from(before.logprobs));

      const bad = await client.updateWeightsFromDisk({ modelPath: wrongFile, loadFormat: DELTA_LOAD_FORMAT, weightVersion: "6" });
      expect(bad.success).toBe(false);
      expect(bad.message).toMatch(/does not apply to version 2/);
      expect(await client.weightVersion()).toBe("2");
      expect(Array.from((await client.generate(req)).logprobs)).toEqual(Array.from(expected.logprobs));

      const unknown = await client.updateWeightsFromDisk({ modelPath: deltaFile, loadFormat: "pickle", weightVersion: "3" });
      expect(unknown.success).toBe(false);
      expect(unknown.message).toMatch(/load_format 'pickle' is not supported/);
    } finally {
      await server.close();
      await ref.close();
      backend.close();
      refBackend.close();
    }
  });
});
