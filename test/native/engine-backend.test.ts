// createNativeBackend: the InferenceBackend contract of src/engine/backend.ts over a model directory
// written by initModelDir — info, admission errors, stepping to completion, queueing beyond
// maxRunning, cache stats and flush, weight reload and close.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { BackendSampling, InferenceBackend, TokenEvent } from "../../src/engine/backend.ts";
import { OozeError } from "../../src/errors.ts";
import { encodeBytes } from "../../src/engine/tokenizer.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-backend-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const greedy: BackendSampling = {
  maxNewTokens: 6,
  temperature: 0,
  topP: 1,
  topK: -1,
  minNewTokens: 0,
  stopTokenIds: [],
  ignoreEos: true,
  seed: null,
};

async function drain(b: InferenceBackend): Promise<Map<string, TokenEvent[]>> {
  const out = new Map<string, TokenEvent[]>();
  for (let i = 0; b.running() > 0; i++) {
    if (i > 1000) throw new Error("backend did not finish within 1000 steps");
    for (const ev of await b.step()) out.set(ev.rid, [...(out.get(ev.rid) ?? []), ev]);
  }
  return out;
}

describe("native InferenceBackend", () => {
  it("serves requests through the backend contract", async () => {
    const dir = join(root, "m");
    await initModelDir("tiny", dir, 3);
    const b = createNativeBackend({ modelDir: dir, maxRunning: 2, cacheTokens: 4096 });
    expect(b.info).toMatchObject({ modelPath: dir, eosTokenId: 257, maxContext: 512 });
    expect(b.info.config).toMatchObject({ model_type: "llama", hidden_size: 64 });
    let err: unknown = null;
    try {
      b.add("long", new Int32Array(513), greedy);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(OozeError);
    expect((err as OozeError).code).toBe("BAD_REQUEST");
    const ids = encodeBytes("12+34=", true);
    for (const rid of ["a", "b", "c"]) expect(b.add(rid, ids, greedy)).toEqual({ cachedTokens: 0 });
    expect(b.running()).toBe(3);
    const first = await b.step();
    expect(first.map((e) => e.rid)).toEqual(["a", "b"]); // "c" waits for a place
    const rest = await drain(b);
    const all = new Map<string, number[]>();
    for (const ev of first) all.set(ev.rid, [ev.tokenId]);
    for (const [rid, evs] of rest) all.set(rid, [...(all.get(rid) ?? []), ...evs.map((e) => e.tokenId)]);
    expect(all.get("a")).toHaveLength(6);
    expect(all.get("b")).toEqual(all.get("a"));
    expect(all.get("c")).toEqual(all.get("a"));
    expect(rest.get("c")!.at(-1)!.finished).toEqual({ type: "length", length: 6 });
    expect(await b.step()).toEqual([]);
    // "b" and "c" were added before "a" finished, so only a later request hits the cache.
    expect(b.add("d", ids, greedy)).toEqual({ cachedTokens: ids.length - 1 });
    await drain(b);
    expect(b.cacheStats()).toMatchObject({ budgetTokens: 4096, promptTokens: 4 * ids.length, hitTokens: ids.length - 1 });
    expect(b.flushCache()).toBe(true);
    expect(b.cacheStats().cachedTokens).toBe(0);
    await b.loadWeights(dir);
    await expect(b.loadWeights(join(root, "none"))).rejects.toMatchObject({ code: "CHECKPOINT_INVALID" });
    b.abort("nobody");
    b.close();
    expect(b.running()).toBe(0);
  });

  it("names the directory when the model cannot be loaded", () => {
    expect(() => createNativeBackend({ modelDir: join(root, "missing") })).toThrow(/missing\/config.json: not found/);
  });
});
