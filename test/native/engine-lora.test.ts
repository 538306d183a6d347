// LoRA adapters in the native engine: logits under an adapter equal a base with the adapter merged
// in (float64, computed here), a mixed batch of adapters and the base gives each request what it
// gets alone, the prefix cache never shares keys/values across adapters, reload and unload keep
// running requests on the adapter they started with, and malformed adapters are refused by name.
// A whole model of the base's architecture is served under a name the same way (a full policy
// beside others): its own weights, its own prefix cache, in the same mixed batches.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig, NativeEngine, NativeSampling } from "../../native/index.d.ts";
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import { mergeAdapter, randomAdapter, writePeftAdapter } from "../fixtures/peft-adapter.ts";
import { drain, expectClose, generate, prompt, sampling, type Out } from "./engine-helpers.ts";

const native = loadNative();
const root = mkdtempSync(join(tmpdir(), "ooze-engine-lora-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const tiny: LlamaHfConfig = { ...PRESETS.tiny };
/** Qwen3's per-head q/k norms and attention biases: the adapter must land after the bias, before the norm. */
const tinyQwen3: LlamaHfConfig = { ...PRESETS.tiny, model_type: "qwen3", architectures: ["Qwen3ForCausalLM"], head_dim: 16, attention_bias: true };
const params = native.initModelParams(tiny, 11, 0.2);
const layout = native.modelLayout(tiny).tensors;
// X: every target, rank 4; Y: q and v only, rank 2, another alpha.
const X = randomAdapter(layout, { rank: 4, alpha: 8, seed: 1 });
const Y = randomAdapter(layout, { rank: 2, alpha: 3, targets: ["q_proj", "v_proj"], seed: 2, scale: 0.3 });
const X2 = randomAdapter(layout, { rank: 4, alpha: 8, seed: 3 });
const dirX = writePeftAdapter(join(root, "x"), X);
const dirY = writePeftAdapter(join(root, "y"), Y);
const dirX2 = writePeftAdapter(join(root, "x2"), X2);

async function engine(adapters: Record<string, string> = {}, opts: { cacheTokens?: number } = {}): Promise<NativeEngine> {
  const e = new native.Engine({ config: tiny, params, ...opts });
  for (const [name, dir] of Object.entries(adapters)) await e.loadLoraAdapter(name, dir);
  return e;
}

/**
 * Runs `reqs` in one engine — the first `early` of them decoding while the rest prefill — and checks
 * each got the tokens (and logprobs within 1e-5) it got alone.
 */
async function expectMixedAsAlone(e: NativeEngine, reqs: { rid: string; adapter: string | null; ids: Int32Array }[], early: number, s: NativeSampling, alone: Map<string, Out>) {
  reqs.slice(0, early).forEach((r) => e.add(r.rid, r.ids, s, r.adapter));
  const first = [...(await e.step()), ...(await e.step())];
  reqs.slice(early).forEach((r) => e.add(r.rid, r.ids, s, r.adapter));
  const batch = await drain(e);
  for (const r of reqs) {
    const mine = first.filter((ev) => ev.rid === r.rid);
    const got = batch.get(r.rid)!, want = alone.get(r.rid)!;
    expect([...mine.map((ev) => ev.tokenId), ...got.tokens]).toEqual(want.tokens);
    expectClose([...mine.map((ev) => ev.logprob), ...got.logprobs], want.logprobs, 1e-5, `${r.rid} logprobs`);
  }
}

describe("LoRA adapters in the native engine", () => {
  it("logits under an adapter equal the base with W + s·B·A merged in float64, within 2e-4 (Llama; Qwen3 with biases and q/k norms)", async () => {
    for (const cfg of [tiny, tinyQwen3]) {
      const p = native.initModelParams(cfg, 5, 0.2);
      const lay = native.modelLayout(cfg).tensors;
      const a = randomAdapter(lay, { rank: 3, alpha: 6, seed: 9 });
      const dir = writePeftAdapter(join(root, `merge-${cfg.model_type ?? "llama"}`), a);
      const e = new native.Engine({ config: cfg, params: p });
      await e.loadLoraAdapter("a", dir);
      const merged = new native.Engine({ config: cfg, params: mergeAdapter(p, lay, a) });
      const ids = prompt(30, 4);
      const got = e.forwardLogits(ids, "a");
      expectClose(got, merged.forwardLogits(ids), 2e-4, `adapter vs merged (${cfg.model_type ?? "llama"})`);
      // The adapter matters: the base's logits are far from these.
      const base = e.forwardLogits(ids);
      expect(Math.max(...got.map((v, i) => Math.abs(v - base[i]!)))).toBeGreaterThan(0.05);
      e.close();
      merged.close();
    }
  });

  it("a mixed batch (two adapters and the base, prefill and decode together) gives each request its tokens alone", async () => {
    const reqs = [
      { rid: "b0", adapter: null, ids: prompt(12, 0) },
      { rid: "x0", adapter: "x", ids: prompt(12, 0) },
      { rid: "y0", adapter: "y", ids: prompt(9, 1) },
      { rid: "x1", adapter: "x", ids: prompt(20, 2) },
      { rid: "b1", adapter: null, ids: prompt(5, 3) },
      { rid: "y1", adapter: "y", ids: prompt(12, 0) },
    ];
    const s = sampling({ maxNewTokens: 10 });
    const alone = new Map<string, Out>();
    for (const r of reqs) {
      const e = await engine({ x: dirX, y: dirY });
      e.add(r.rid, r.ids, s, r.adapter);
      alone.set(r.rid, (await drain(e)).get(r.rid)!);
      e.close();
    }
    // Same prompt, three models: the adapters change the tokens.
    expect(alone.get("x0")!.tokens).not.toEqual(alone.get("b0")!.tokens);
    expect(alone.get("y1")!.tokens).not.toEqual(alone.get("b0")!.tokens);

    const e = await engine({ x: dirX, y: dirY });
    await expectMixedAsAlone(e, reqs, 3, s, alone);
    e.close();
  });

  it("the prefix cache never shares keys/values across adapters: X then Y misses, X twice hits", async () => {
    const e = await engine({ x: dirX, y: dirY });
    const ids = prompt(40, 5);
    const s = sampling({ maxNewTokens: 2 });
    expect(e.add("a", ids, s, "x")).toBe(0);
    await drain(e);
    expect(e.add("b", ids, s, "y")).toBe(0);
    await drain(e);
    expect(e.add("c", ids, s)).toBe(0); // the base has its own tree too
    await drain(e);
    expect(e.add("d", ids, s, "x")).toBe(ids.length - 1);
    const hit = (await drain(e)).get("d")!;
    expect(hit.tokens).toEqual((await generate(await engine({ x: dirX }), "d", ids, s, "x")).tokens);
    // Unloading X frees its cached prefixes; every slot is free or cached by the base or Y.
    const before = e.cacheStats();
    expect(e.unloadLoraAdapter("x")).toBe(true);
    const after = e.cacheStats();
    expect(after.cachedTokens).toBeLessThan(before.cachedTokens);
    expect(after.freeSlots + after.cachedTokens).toBe(after.budgetTokens);
    expect(e.loraAdapters().map((a) => a.name)).toEqual(["y"]);
    e.close();
  });

  it("a reload keeps running requests on the adapter they started with and never reuses its old prefixes", async () => {
    const s = sampling({ maxNewTokens: 12 });
    const ids = prompt(16, 6);
    const oldAlone = await generate(await engine({ x: dirX }), "r", ids, s, "x");
    const newAlone = await generate(await engine({ x: dirX2 }), "r", ids, s, "x");
    expect(newAlone.tokens).not.toEqual(oldAlone.tokens);
    const e = await engine({ x: dirX });
    e.add("r", ids, s, "x");
    const early = await e.step();
    expect(await e.loadLoraAdapter("x", dirX2)).toEqual({ replaced: true });
    const rest = (await drain(e)).get("r")!;
    expect([early[0]!.tokenId, ...rest.tokens]).toEqual(oldAlone.tokens);
    expect(e.add("r2", ids, s, "x")).toBe(0); // the old X's prefixes are not the new X's
    expect((await drain(e)).get("r2")!.tokens).toEqual(newAlone.tokens);
    // Unload while a request runs: it finishes with the adapter; new requests naming it are refused.
    e.add("r3", ids, s, "x");
    await e.step();
    expect(e.unloadLoraAdapter("x")).toBe(true);
    expect(() => e.add("r4", ids, s, "x")).toThrow(/request 'r4': LoRA adapter 'x' is not loaded \(no adapters are loaded\)/);
    const r3 = (await drain(e)).get("r3")!;
    expect(r3.tokens.length).toBe(11);
    expect(r3.finished).toEqual({ type: "length", length: 12 });
    // A waiting request holding a prefix hit of an adapter that is then replaced keeps both.
    await e.loadLoraAdapter("x", dirX);
    e.add("w0", ids, s, "x");
    await drain(e);
    expect(e.add("w1", ids, s, "x")).toBe(ids.length - 1);
    await e.loadLoraAdapter("x", dirX2);
    expect((await drain(e)).get("w1")!.tokens).toEqual(oldAlone.tokens);
    const st = e.cacheStats();
    expect(st.freeSlots + st.cachedTokens).toBe(st.budgetTokens);
    e.close();
  });

  it("a full pool evicts across the trees (retired first, then least recently used) and every slot comes back", async () => {
    // 512 slots (the context): three 150-token prefixes cached under x, y and the base, then a
    // request needing 500 slots under x; its prefix hit must survive, the rest must go.
    const e = await engine({ x: dirX, y: dirY }, { cacheTokens: 512 });
    const s = sampling({ maxNewTokens: 2 });
    for (const [rid, a] of [["a", "x"], ["b", "y"], ["c", null]] as const) {
      e.add(rid, prompt(150, 8), s, a);
      await drain(e);
    }
    expect(e.cacheStats().cachedTokens).toBe(3 * 151);
    await e.loadLoraAdapter("y", dirX2); // y's old tree is retired: emptied at once
    expect(e.cacheStats().cachedTokens).toBe(2 * 151);
    const long = Int32Array.from([...prompt(150, 8), ...prompt(200, 9)]);
    const big = sampling({ maxNewTokens: 150 });
    expect(e.add("d", long, big, "x")).toBe(150);
    const got = (await drain(e)).get("d")!;
    expect(got.tokens).toEqual((await generate(await engine({ x: dirX }), "d", long, big, "x")).tokens);
    const st = e.cacheStats();
    expect(st.freeSlots + st.cachedTokens).toBe(st.budgetTokens);
    // "d" needed 349 slots beyond its hit with 210 free: the base's tree (older than x's) gave 139 of its 151.
    expect(e.add("e", prompt(150, 8), s)).toBe(12);
    await drain(e);
    e.close();
  });

  it("a weight reload invalidates the adapters' cached prefixes as the base's", async () => {
    const modelDir = join(root, "model");
    native.saveModelDir(modelDir, tiny, native.initModelParams(tiny, 12, 0.2));
    const e = await engine({ x: dirX });
    const ids = prompt(30, 7);
    e.add("a", ids, sampling({ maxNewTokens: 2 }), "x");
    await drain(e);
    expect(e.cacheStats().cachedTokens).toBeGreaterThan(0);
    await e.loadWeights(modelDir);
    expect(e.cacheStats().cachedTokens).toBe(0);
    expect(e.add("b", ids, sampling({ maxNewTokens: 2 }), "x")).toBe(0);
    await drain(e);
    e.close();
  });

  it("lists adapters, refuses unknown names, and refuses malformed adapters naming the file and field or tensor", async () => {
    const e = await engine({ x: dirX, y: dirY });
    expect(e.loraAdapters()).toEqual([
      { name: "x", full: false, rank: 4, alpha: 8, rslora: false, targets: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] },
      { name: "y", full: false, rank: 2, alpha: 3, rslora: false, targets: ["q_proj", "v_proj"] },
    ]);
    expect(() => e.add("u", prompt(3), sampling(), "nope")).toThrow(/LoRA adapter 'nope' is not loaded \(loaded: /);
    expect(() => e.forwardLogits(prompt(3), "nope")).toThrow(/'nope' is not loaded/);
    expect(e.unloadLoraAdapter("nope")).toBe(false);
    // Config says rank 4, tensors are rank 2.
    const wrongRank = writePeftAdapter(join(root, "bad-rank"), Y, { r: 4 });
    await expect(e.loadLoraAdapter("bad", wrongRank)).rejects.toThrow(/adapter_model\.safetensors.*lora_A\.weight/);
    const unknownTarget = writePeftAdapter(join(root, "bad-target"), Y, { target_modules: ["q_proj", "qkv_proj"] });
    await expect(e.loadLoraAdapter("bad", unknownTarget)).rejects.toThrow(/adapter_config\.json: target_modules: 'qkv_proj'/);
    // An adapter of another base (more layers).
    const deeper = { ...tiny, num_hidden_layers: 3 };
    const other = writePeftAdapter(join(root, "bad-base"), randomAdapter(native.modelLayout(deeper).tensors, { rank: 4, alpha: 8, seed: 4 }));
    await expect(e.loadLoraAdapter("bad", other)).rejects.toThrow(/adapter_model\.safetensors.*layers\.2/);
    await expect(e.loadLoraAdapter("bad", join(root, "missing"))).rejects.toThrow(/adapter_config\.json: not found/);
    expect(e.loraAdapters().map((a) => a.name)).toEqual(["x", "y"]);
    e.close();
  });

  it("a named whole model: its own weights (logits = an engine of that model), mixed in one batch with the base and an adapter, its own prefix cache, and a model of another shape refused", async () => {
    const paramsM = native.initModelParams(tiny, 23, 0.2);
    const dirM = join(root, "model-m");
    native.saveModelDir(dirM, tiny, paramsM, null);
    const own = new native.Engine({ config: tiny, params: paramsM });
    const e = await engine({ x: dirX });
    expect(await e.loadNamedModel("m", dirM)).toEqual({ replaced: false });
    const ids = prompt(25, 6);
    expectClose(e.forwardLogits(ids, "m"), own.forwardLogits(ids), 1e-6, "named model vs its own engine");
    expect(Math.max(...e.forwardLogits(ids, "m").map((v, i) => Math.abs(v - e.forwardLogits(ids)[i]!)))).toBeGreaterThan(0.05);
    expect(e.loraAdapters().find((a) => a.name === "m")).toEqual({ name: "m", full: true, rank: 0, alpha: 0, rslora: false, targets: [] });

    // mixed batch: base, adapter and named model, prefill and decode together, = each alone
    const reqs = [
      { rid: "b", adapter: null, ids: prompt(12, 0) },
      { rid: "m0", adapter: "m", ids: prompt(12, 0) },
      { rid: "x", adapter: "x", ids: prompt(9, 1) },
      { rid: "m1", adapter: "m", ids: prompt(20, 2) },
    ];
    const s = sampling({ maxNewTokens: 10 });
    const alone = new Map<string, Out>();
    for (const r of reqs) {
      const one = await engine({ x: dirX });
      await one.loadNamedModel("m", dirM);
      alone.set(r.rid, await generate(one, r.rid, r.ids, s, r.adapter));
      one.close();
    }
    expect(alone.get("m0")!.tokens).toEqual((await generate(own, "m0", prompt(12, 0), s)).tokens);
    expect(alone.get("m0")!.tokens).not.toEqual(alone.get("b")!.tokens);
    await expectMixedAsAlone(e, reqs, 2, s, alone);

    // its own prefix cache: the base's prefix of the same prompt is not reused, its own is
    const p = prompt(30, 7), s2 = sampling({ maxNewTokens: 2 });
    expect(e.add("c1", p, s2)).toBe(0);
    await drain(e);
    expect(e.add("c2", p, s2, "m")).toBe(0);
    await drain(e);
    expect(e.add("c3", p, s2, "m")).toBe(p.length - 1);
    await drain(e);
    // a reload under the name is a new model (replaced), and its old prefixes are not reused
    expect(await e.loadNamedModel("m", dirM)).toEqual({ replaced: true });
    expect(e.add("c4", p, s2, "m")).toBe(0);
    await drain(e);

    const deeper = { ...tiny, num_hidden_layers: 3 };
    const dirDeep = join(root, "model-deep");
    native.saveModelDir(dirDeep, deeper, native.initModelParams(deeper, 1, 0.02), null);
    await expect(e.loadNamedModel("deep", dirDeep)).rejects.toThrow(/model 'deep': its config differs from the base model's \(2 layers/);
    await expect(e.loadNamedModel("gone", join(root, "missing-model"))).rejects.toThrow(/missing-model/);
    expect(e.unloadLoraAdapter("m")).toBe(true);
    expect(() => e.add("u", prompt(3), sampling(), "m")).toThrow(/'m' is not loaded/);
    e.close();
    own.close();
  });
});
