// Scaled rotary frequencies (Llama 3.x `llama3`, and `linear`) in checkpoints written by Hugging Face
// transformers (test/fixtures/hf-llama-rope, made by its make_fixture.py): the native engine and the
// TS reference give transformers' logits; the same weights without the scaling do not (so the
// fixture exercises it); transformers 4.x's form of the config (`rope_scaling` beside `rope_theta`)
// reads the same; a saved checkpoint keeps it; the training path's logprobs equal the engine's; an
// unsupported rope_type is refused with the field named. (yarn: test/native/model-families.test.ts.)
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { referenceLogits } from "../../native/reference/model.ts";
import { Trainer } from "../../native/trainer.ts";

const fixture = join(dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "hf-llama-rope");
const expected = JSON.parse(readFileSync(join(fixture, "expected.json"), "utf8")) as { input_ids: number[]; vocab_size: number; llama3: number[]; linear: number[] };
const ids = Int32Array.from(expected.input_ids);
const tmp = mkdtempSync(join(tmpdir(), "ooze-rope-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function firstDiffs(got: ArrayLike<number>, want: ArrayLike<number>, tol: number): string[] {
  const bad: string[] = [];
  for (let i = 0; i < want.length; i++) if (!(Math.abs(got[i]! - want[i]!) <= tol)) bad.push(`[${i}] got ${got[i]} want ${want[i]}`);
  return bad;
}

/** A copy of a fixture model whose config.json is rewritten by `edit`. */
function withConfig(name: "llama3" | "linear", label: string, edit: (c: Record<string, unknown>) => Record<string, unknown>): string {
  const dir = join(tmp, `${name}-${label}`);
  cpSync(join(fixture, name), dir, { recursive: true });
  const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  writeFileSync(join(dir, "config.json"), JSON.stringify(edit(c)));
  return dir;
}

describe.each(["llama3", "linear"] as const)("rope_type %s in a transformers-written checkpoint", (name) => {
  const native = loadNative();
  const want = expected[name];

  it("the native engine and the TS reference give transformers' logits within 1e-4; without the scaling they differ", () => {
    const dir = join(fixture, name);
    const engine = new native.Engine({ modelDir: dir });
    const bad = firstDiffs(engine.forwardLogits(ids), want, 1e-4);
    engine.close();
    if (bad.length) console.error(`native vs transformers (${name}): ${bad.length} differ; first: ${bad.slice(0, 5).join(", ")}`);
    expect(bad).toEqual([]);
    const m = native.loadModelDir(dir);
    expect(firstDiffs(referenceLogits(m.config, m.params, ids), want, 1e-4)).toEqual([]);
    const plain = withConfig(name, "plain", (c) => ({ ...c, rope_parameters: { rope_theta: 5000, rope_type: "default" } }));
    const unscaled = new native.Engine({ modelDir: plain });
    expect(firstDiffs(unscaled.forwardLogits(ids), want, 1e-2).length).toBeGreaterThan(want.length / 10);
    unscaled.close();
  });

  it("reads transformers 4.x's form (rope_scaling with `type` or `rope_type`, rope_theta beside it) the same", () => {
    const scaling = (readJson(join(fixture, name, "config.json")).rope_parameters ?? {}) as Record<string, unknown>;
    const { rope_theta, rope_type, ...rest } = scaling;
    for (const [label, key] of [["v4", "rope_type"], ["v4-old", "type"]] as const) {
      const dir = withConfig(name, label, (c) => {
        const { rope_parameters: _drop, ...others } = c;
        return { ...others, rope_theta, rope_scaling: { [key]: rope_type, ...rest } };
      });
      const engine = new native.Engine({ modelDir: dir });
      expect(firstDiffs(engine.forwardLogits(ids), want, 1e-4)).toEqual([]);
      engine.close();
    }
  });

  it("a checkpoint ooze saves keeps the scaling (rope_parameters and rope_scaling) and loads to the same logits", () => {
    const m = native.loadModelDir(join(fixture, name));
    const out = join(tmp, `${name}-saved`);
    native.saveModelDir(out, m.config, m.params);
    const written = readJson(join(out, "config.json"));
    expect(written.rope_parameters).toMatchObject({ rope_type: name, rope_theta: 5000, factor: name === "llama3" ? 8 : 4 });
    expect(written.rope_scaling).toMatchObject({ rope_type: name });
    const engine = new native.Engine({ modelDir: out });
    expect(firstDiffs(engine.forwardLogits(ids), want, 1e-4)).toEqual([]);
    engine.close();
  });

  it("the training path's logprobs equal the engine's log-softmax (max abs diff <= 1e-5)", async () => {
    const m = native.loadModelDir(join(fixture, name));
    const t = await Trainer.create({ config: m.config, params: m.params, seed: null });
    const got = await t.logprobs({ tokens: ids, cuSeqlens: new Int32Array([0, ids.length]) }, 1);
    const V = expected.vocab_size;
    const engine = new native.Engine({ modelDir: join(fixture, name) });
    const logits = engine.forwardLogits(ids);
    engine.close();
    let worst = 0;
    for (let i = 1; i < ids.length; i++) {
      const row = logits.subarray((i - 1) * V, i * V);
      const mx = Math.max(...row);
      let sum = 0;
      for (const z of row) sum += Math.exp(z - mx);
      worst = Math.max(worst, Math.abs(row[ids[i]!]! - mx - Math.log(sum) - got.logprobs[i]!));
    }
    expect(worst).toBeLessThanOrEqual(1e-5);
  });
});

describe("rope types ooze does not implement", () => {
  it("are refused with the field and the supported types named", () => {
    const native = loadNative();
    const longrope = withConfig("llama3", "longrope", (c) => ({ ...c, rope_parameters: { rope_theta: 5000, rope_type: "longrope", factor: 4 } }));
    expect(() => native.loadModelDir(longrope)).toThrow(/rope_parameters\.rope_type 'longrope' is not supported \(default, linear, llama3, yarn\)/);
    const missing = withConfig("llama3", "missing", (c) => ({ ...c, rope_parameters: { rope_theta: 5000, rope_type: "llama3", factor: 8 } }));
    expect(() => native.loadModelDir(missing)).toThrow(/rope_parameters\.low_freq_factor is required for rope_type 'llama3'/);
  });
});

function readJson(path: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
}
