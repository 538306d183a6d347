// SGLang's LoRA API on ooze's engine server, over real HTTP on loopback: /load_lora_adapter and
// /unload_lora_adapter, `lora_path` per request (single, batched list, one for all), adapters in
// /server_info, a whole model served under a name (ooze's full policies), SGLang's error shapes for unknown, unloaded and malformed adapters, and a simulated
// backend that refuses adapters instead of ignoring them.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { createNativeBackend } from "../../native/engine.ts";
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { SimBackend } from "../../src/engine/sim/sim-backend.ts";
import { randomAdapter, writePeftAdapter } from "../fixtures/peft-adapter.ts";
import { postJson } from "../harness/http.ts";

const native = loadNative();
const root = mkdtempSync(join(tmpdir(), "ooze-lora-http-"));
const tiny: LlamaHfConfig = { ...PRESETS.tiny };
const params = native.initModelParams(tiny, 11, 0.2);
const layout = native.modelLayout(tiny).tensors;
const modelDir = join(root, "model");
const X = randomAdapter(layout, { rank: 4, alpha: 8, seed: 1 });
const Y = randomAdapter(layout, { rank: 2, alpha: 3, targets: ["q_proj", "v_proj"], seed: 2, scale: 0.3 });
const dirX = join(root, "x"), dirY = join(root, "y");
const ids = [5, 36, 67, 98, 129, 160, 191, 222];
const other = [9, 8, 7, 6, 5];
const greedy = { max_new_tokens: 6, temperature: 0, ignore_eos: true };

let backend: InferenceBackend;
let server: EngineServer;
beforeAll(async () => {
  native.saveModelDir(modelDir, tiny, params);
  writePeftAdapter(dirX, X);
  writePeftAdapter(dirY, Y);
  backend = createNativeBackend({ modelDir });
  server = await startEngineServer({ backend });
});
afterAll(async () => {
  await server?.close();
  backend?.close();
  rmSync(root, { recursive: true, force: true });
});

/** Greedy tokens of `prompt` under an adapter directory (null: the base) over `weights`, straight from the addon. */
async function alone(prompt: number[], dir: string | null, weights = params): Promise<number[]> {
  const e = new native.Engine({ config: tiny, params: weights });
  if (dir) await e.loadLoraAdapter("a", dir);
  e.add("r", Int32Array.from(prompt), { maxNewTokens: 6, temperature: 0, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: true, seed: 1 }, dir ? "a" : null);
  const out: number[] = [];
  while (e.running() > 0) for (const ev of await e.step()) out.push(ev.tokenId);
  e.close();
  return out;
}

const serverInfo = async () => (await fetch(`${server.url}/server_info`)).json() as Promise<Record<string, any>>;

describe("SGLang's LoRA API on the native engine server", () => {
  it("loads adapters, serves lora_path per request (single, batched list, one for a batch), lists them, unloads", async () => {
    const load = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "x", lora_path: dirX });
    expect(load).toMatchObject({ status: 200, json: { success: true, error_message: "", loaded_adapters: { x: dirX } } });
    expect((await postJson(`${server.url}/load_lora_adapter`, { lora_name: "y", lora_path: dirY })).json.loaded_adapters).toEqual({ x: dirX, y: dirY });

    const [wantBase, wantX, wantY, wantXOther] = await Promise.all([alone(ids, null), alone(ids, dirX), alone(ids, dirY), alone(other, dirX)]);
    expect(wantX).not.toEqual(wantBase);
    const single = await postJson(`${server.url}/generate`, { input_ids: ids, sampling_params: greedy, lora_path: "x" });
    expect(single.status).toBe(200);
    expect(single.json.output_ids).toEqual(wantX);
    const batch = await postJson(`${server.url}/generate`, { input_ids: [ids, ids, ids, other], sampling_params: greedy, lora_path: ["x", null, "y", "x"] });
    expect(batch.json.map((o: { output_ids: number[] }) => o.output_ids)).toEqual([wantX, wantBase, wantY, wantXOther]);
    const allX = await postJson(`${server.url}/generate`, { input_ids: [ids, other], sampling_params: greedy, lora_path: "x" });
    expect(allX.json.map((o: { output_ids: number[] }) => o.output_ids)).toEqual([wantX, wantXOther]);

    const info = await serverInfo();
    expect(info.enable_lora).toBe(true);
    expect(info.lora_adapters).toEqual([
      { name: "x", path: dirX, rank: 4, alpha: 8, targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] },
      { name: "y", path: dirY, rank: 2, alpha: 3, targets: ["q_proj", "v_proj"] },
    ]);

    const unload = await postJson(`${server.url}/unload_lora_adapter`, { lora_name: "x" });
    expect(unload).toMatchObject({ status: 200, json: { success: true, error_message: "", loaded_adapters: { y: dirY } } });
    const gone = await postJson(`${server.url}/generate`, { input_ids: [ids, ids], sampling_params: greedy, lora_path: ["y", "x"] });
    expect(gone.status).toBe(400);
    expect(gone.json).toEqual({ error: { message: "lora_path: LoRA adapter 'x' not loaded (loaded: y); load with POST /load_lora_adapter" } });
    expect((await serverInfo()).lora_adapters.map((a: { name: string }) => a.name)).toEqual(["y"]);
    const again = await postJson(`${server.url}/unload_lora_adapter`, { lora_name: "x" });
    expect(again).toMatchObject({ status: 400, json: { success: false, error_message: "LoRA adapter 'x' is not loaded (loaded: y)" } });
  });

  it("serves a whole model directory loaded under a name (ooze: a full policy beside others) on its own weights", async () => {
    const own = native.initModelParams(tiny, 29, 0.2);
    const dirM = join(root, "m");
    native.saveModelDir(dirM, tiny, own);
    const load = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "m", lora_path: dirM });
    expect(load).toMatchObject({ status: 200, json: { success: true } });
    const want = await alone(ids, null, own);
    const base = await alone(ids, null);
    expect(want).not.toEqual(base);
    const batch = await postJson(`${server.url}/generate`, { input_ids: [ids, ids], sampling_params: greedy, lora_path: ["m", null] });
    expect(batch.json.map((o: { output_ids: number[] }) => o.output_ids)).toEqual([want, base]);
    expect((await serverInfo()).lora_adapters.find((a: { name: string }) => a.name === "m")).toEqual({ name: "m", path: dirM, full: true, rank: 0, alpha: 0, targets: [] });
    expect((await postJson(`${server.url}/unload_lora_adapter`, { lora_name: "m" })).status).toBe(200);
  });

  it("refuses a loaded name unless replace is set, malformed adapters naming file and field or tensor, and missing fields", async () => {
    await postJson(`${server.url}/load_lora_adapter`, { lora_name: "y", lora_path: dirY });
    const dup = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "y", lora_path: dirX });
    expect(dup.status).toBe(400);
    expect(dup.json).toMatchObject({ success: false, loaded_adapters: { y: dirY } });
    expect(dup.json.error_message).toMatch(/LoRA adapter 'y' is already loaded .*"replace": true/);
    const swapped = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "y", lora_path: dirX, replace: true });
    expect(swapped).toMatchObject({ status: 200, json: { success: true, loaded_adapters: { y: dirX } } });
    const out = await postJson(`${server.url}/generate`, { input_ids: ids, sampling_params: greedy, lora_path: "y" });
    expect(out.json.output_ids).toEqual(await alone(ids, dirX));

    const wrongRank = writePeftAdapter(join(root, "bad-rank"), Y, { r: 4 });
    const r1 = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "bad", lora_path: wrongRank });
    expect(r1).toMatchObject({ status: 400, json: { success: false } });
    expect(r1.json.error_message).toMatch(/cannot load LoRA adapter 'bad' from .*bad-rank.*adapter_model\.safetensors.*lora_A\.weight/);
    const badTarget = writePeftAdapter(join(root, "bad-target"), Y, { target_modules: ["q_proj", "qkv_proj"] });
    const r2 = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "bad", lora_path: badTarget });
    expect(r2.json.error_message).toMatch(/adapter_config\.json: target_modules: 'qkv_proj' is not a Linear layer/);
    const missing = await postJson(`${server.url}/load_lora_adapter`, { lora_name: "bad" });
    expect(missing.status).toBe(400);
    expect(missing.json).toMatchObject({ object: "error", type: "Bad Request", code: 400 });
    expect(missing.json.message).toMatch(/^lora_path: lora_path is required/);
    const list = await postJson(`${server.url}/generate`, { input_ids: ids, sampling_params: greedy, lora_path: ["y"] });
    expect(list).toMatchObject({ status: 400, json: { message: "lora_path: a list is only allowed for a batch input" } });
    const count = await postJson(`${server.url}/generate`, { input_ids: [ids, ids], sampling_params: greedy, lora_path: ["y"] });
    expect(count.json.message).toBe("lora_path: a list must have one entry per input (2), got 1");
    expect((await serverInfo()).lora_adapters.map((a: { name: string }) => a.name)).toEqual(["y"]);
  });

  it("a backend that cannot serve adapters refuses lora_path and /load_lora_adapter instead of ignoring them", async () => {
    const sim = new SimBackend({ catchUpMs: 0 });
    const s = await startEngineServer({ backend: sim });
    try {
      const gen = await postJson(`${s.url}/generate`, { input_ids: ids, sampling_params: greedy, lora_path: "x" });
      expect(gen.status).toBe(400);
      expect(gen.json.error.message).toMatch(/^lora_path: LoRA is not enabled: this engine serves the base model only .*\(asked for 'x'\)/);
      const load = await postJson(`${s.url}/load_lora_adapter`, { lora_name: "x", lora_path: dirX });
      expect(load).toMatchObject({ status: 400, json: { success: false, loaded_adapters: {} } });
      expect(load.json.error_message).toMatch(/LoRA is not enabled/);
      expect((await fetch(`${s.url}/server_info`).then((r) => r.json())) as object).toMatchObject({ enable_lora: false, lora_adapters: [] });
      expect((await postJson(`${s.url}/generate`, { input_ids: ids, sampling_params: greedy, lora_path: [null] })).status).toBe(400);
      expect((await postJson(`${s.url}/generate`, { input_ids: [ids], sampling_params: greedy, lora_path: [null] })).status).toBe(200);
    } finally {
      await s.close();
      sim.close();
    }
  });
});
