// Checkpoint I/O: save→load round trip bit-exact, a valid HF safetensors layout, BF16/F16 loads
// from a hand-written file, weight_version metadata, and clear errors for malformed files.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { loadNative } from "../../native/load.ts";
import { initModelDir, readModelConfig } from "../../native/model-dir.ts";
import { paramCount, PRESETS } from "../../native/presets.ts";
import { referenceLayout } from "../../native/reference/model.ts";
import { writeSafetensors, type SafetensorsEntry as Entry } from "../fixtures/peft-adapter.ts";

const native = loadNative();
const root = mkdtempSync(join(tmpdir(), "ooze-ckpt-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const tiny: LlamaHfConfig = { ...PRESETS.tiny };


function toBf16(x: Float32Array): { bits: Uint16Array; values: Float32Array } {
  const u = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const bits = new Uint16Array(x.length);
  const values = new Float32Array(x.length);
  const vu = new Uint32Array(values.buffer);
  for (let i = 0; i < x.length; i++) {
    const v = u[i]!;
    const rounded = (v + 0x7fff + ((v >>> 16) & 1)) >>> 16; // round to nearest even
    bits[i] = rounded & 0xffff;
    vu[i] = (rounded & 0xffff) << 16;
  }
  return { bits, values };
}

function parseHeader(path: string): { len: number; header: Record<string, any>; size: number } {
  const buf = readFileSync(path);
  const len = Number(buf.readBigUInt64LE(0));
  return { len, header: JSON.parse(buf.subarray(8, 8 + len).toString("utf8")), size: buf.length };
}

describe("checkpoint I/O", () => {
  it("saves a valid HF checkpoint and loads it back bit-exact", async () => {
    const dir = join(root, "rt");
    const params = native.initModelParams(tiny, 7, 0.02);
    expect(params.length).toBe(paramCount(tiny));
    native.saveModelDir(dir, tiny, params, "v3");
    const loaded = native.loadModelDir(dir);
    expect(Buffer.from(loaded.params.buffer).equals(Buffer.from(params.buffer))).toBe(true);
    expect(loaded.weightVersion).toBe("v3");
    expect(loaded.tensors).toEqual(referenceLayout(tiny));
    for (const k of ["vocab_size", "hidden_size", "num_key_value_heads", "tie_word_embeddings", "eos_token_id"] as const)
      expect(loaded.config[k]).toBe(tiny[k]);
    const cfg = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    expect(cfg).toMatchObject({ architectures: ["LlamaForCausalLM"], model_type: "llama", torch_dtype: "float32", hidden_act: "silu" });
    const { len, header, size } = parseHeader(join(dir, "model.safetensors"));
    expect(len % 8).toBe(0);
    expect(header.__metadata__).toEqual({ format: "pt", weight_version: "v3" });
    let expectOff = 0;
    for (const t of referenceLayout(tiny)) {
      const bytes = t.shape.reduce((a, b) => a * b, 1) * 4;
      expect(header[t.name]).toEqual({ dtype: "F32", shape: t.shape, data_offsets: [expectOff, expectOff + bytes] });
      expectOff += bytes;
    }
    expect(size).toBe(8 + len + expectOff);
    // No temporary files are left behind.
    expect(readFileSync(join(dir, "config.json"), "utf8").length).toBeGreaterThan(0);
  });

  it("initModelDir writes a preset and readModelConfig reads it", async () => {
    const dir = join(root, "init");
    await initModelDir("quickstart", dir, 1);
    const cfg = await readModelConfig(dir);
    expect(cfg.hidden_size).toBe(128);
    expect(cfg.tie_word_embeddings).toBe(true);
    const loaded = native.loadModelDir(dir);
    expect(loaded.params.length).toBe(paramCount(PRESETS.quickstart));
    expect(loaded.tensors.some((t) => t.name === "lm_head.weight")).toBe(false);
    await expect(initModelDir("nope", join(root, "x"), 0)).rejects.toThrow(/unknown model preset 'nope'/);
  });

  it("loads BF16 and F16 tensors, an extra tied lm_head and a list eos_token_id", () => {
    const cfg: LlamaHfConfig = { ...tiny, tie_word_embeddings: true };
    const layout = referenceLayout(cfg);
    const params = native.initModelParams(cfg, 3, 0.5);
    const dir = join(root, "bf16");
    native.saveModelDir(dir, cfg, params, null); // config.json
    writeFileSync(
      join(dir, "config.json"),
      JSON.stringify({ ...JSON.parse(readFileSync(join(dir, "config.json"), "utf8")), eos_token_id: [cfg.eos_token_id, 5], torch_dtype: "bfloat16", extra_field: { a: [1, 2] } }),
    );
    const expected = new Float32Array(params.length);
    const entries: Entry[] = layout.map((t, i) => {
      const n = t.shape.reduce((a, b) => a * b, 1);
      const slice = params.subarray(t.offset, t.offset + n);
      if (i % 2 === 0) {
        const { bits, values } = toBf16(slice);
        expected.set(values, t.offset);
        return { name: t.name, dtype: "BF16", shape: t.shape, bytes: new Uint8Array(bits.buffer) };
      }
      // F16: use values exactly representable in half precision (multiples of 1/1024 in ±2).
      const f16 = new Uint16Array(n);
      for (let k = 0; k < n; k++) {
        const q = Math.max(-2047, Math.min(2047, Math.round(slice[k]! * 1024)));
        expected[t.offset + k] = q / 1024;
        f16[k] = halfBits(q / 1024);
      }
      return { name: t.name, dtype: "F16", shape: t.shape, bytes: new Uint8Array(f16.buffer) };
    });
    entries.push({ name: "lm_head.weight", dtype: "BF16", shape: [cfg.vocab_size, cfg.hidden_size], bytes: new Uint8Array(cfg.vocab_size * cfg.hidden_size * 2) });
    entries.reverse(); // order in the file must not matter
    writeSafetensors(join(dir, "model.safetensors"), entries);
    const loaded = native.loadModelDir(dir);
    expect(loaded.config.eos_token_id).toBe(cfg.eos_token_id);
    expect(loaded.weightVersion).toBeNull();
    let bad = -1;
    for (let i = 0; i < expected.length && bad < 0; i++) if (loaded.params[i] !== expected[i]) bad = i;
    if (bad >= 0) console.error(`first difference at ${bad}: got ${loaded.params[bad]} expected ${expected[bad]}`);
    expect(bad).toBe(-1);
  });

  it("loads a sharded checkpoint (model.safetensors.index.json)", () => {
    const dir = join(root, "sharded");
    const params = native.initModelParams(tiny, 9, 0.02);
    native.saveModelDir(dir, tiny, params, null);
    rmSync(join(dir, "model.safetensors"));
    const layout = referenceLayout(tiny);
    const weightMap: Record<string, string> = {};
    const shards: Entry[][] = [[], []];
    layout.forEach((t, i) => {
      const n = t.shape.reduce((a, b) => a * b, 1);
      const bytes = new Uint8Array(params.buffer.slice(t.offset * 4, (t.offset + n) * 4));
      shards[i % 2]!.push({ name: t.name, dtype: "F32", shape: t.shape, bytes });
      weightMap[t.name] = `model-0000${(i % 2) + 1}-of-00002.safetensors`;
    });
    shards.forEach((entries, k) => writeSafetensors(join(dir, `model-0000${k + 1}-of-00002.safetensors`), entries));
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: { total_size: params.length * 4 }, weight_map: weightMap }));
    const loaded = native.loadModelDir(dir);
    expect(Buffer.from(loaded.params.buffer).equals(Buffer.from(params.buffer))).toBe(true);
  });

  it("rejects malformed files with errors naming the file and tensor", () => {
    const dir = join(root, "bad");
    const params = native.initModelParams(tiny, 1, 0.02);
    native.saveModelDir(dir, tiny, params, null);
    const st = join(dir, "model.safetensors");
    const good = readFileSync(st);
    const expectError = (bytes: Buffer, re: RegExp) => {
      writeFileSync(st, bytes);
      expect(() => native.loadModelDir(dir)).toThrow(re);
    };
    const file = st.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    expectError(good.subarray(0, good.length - 100), new RegExp(`${file}: tensor 'lm_head.weight'.*truncated`));
    expectError(good.subarray(0, 5), new RegExp(`${file}: truncated`));
    const badLen = Buffer.from(good);
    badLen.writeBigUInt64LE(1n << 40n);
    expectError(badLen, new RegExp(`${file}: bad safetensors header length`));
    const badJson = Buffer.from(good);
    badJson[8] = "[".charCodeAt(0) + 100;
    expectError(badJson, new RegExp(`${file}.*malformed JSON`));
    // Missing tensor, wrong shape, unsupported dtype.
    const layout = referenceLayout(tiny);
    const entries = layout.map((t) => ({ name: t.name, dtype: "F32", shape: t.shape, bytes: new Uint8Array(t.shape.reduce((a, b) => a * b, 1) * 4) }));
    writeSafetensors(st, entries.slice(1));
    expect(() => native.loadModelDir(dir)).toThrow(/tensor 'model.embed_tokens.weight' is missing/);
    writeSafetensors(st, entries.map((e, i) => (i === 1 ? { ...e, shape: [e.shape[0]! * 2], bytes: new Uint8Array(e.bytes.length * 2) } : e)));
    expect(() => native.loadModelDir(dir)).toThrow(/tensor 'model.layers.0.input_layernorm.weight': shape \[128\] but the config needs \[64\]/);
    writeSafetensors(st, entries.map((e, i) => (i === 0 ? { ...e, dtype: "I8" } : e)));
    expect(() => native.loadModelDir(dir)).toThrow(/dtype I8 is not supported/);
    writeFileSync(join(dir, "config.json"), "{\"vocab_size\": 259,");
    expect(() => native.loadModelDir(dir)).toThrow(/config.json: malformed JSON/);
    expect(() => native.loadModelDir(join(root, "missing"))).toThrow(/config.json: not found/);
  });
});

/** IEEE half bits of a value exactly representable in fp16. */
function halfBits(v: number): number {
  if (v === 0) return Object.is(v, -0) ? 0x8000 : 0;
  const sign = v < 0 ? 0x8000 : 0;
  let a = Math.abs(v);
  let e = Math.floor(Math.log2(a));
  if (e < -14) return sign | Math.round(a / 2 ** -24); // subnormal
  const man = Math.round((a / 2 ** e - 1) * 1024);
  return sign | ((e + 15) << 10) | man;
}
