// How much does a random base's first reply token say about which of 8 letters a prompt holds? For
// the referential game's prompts — bare (BOS + the letter, the built-in game) and as the gateway's
// built-in chat template renders a one-message conversation (the SDK game) — this prints the mutual
// information between the letter (A–H, uniform) and the next token at temperature 1, in bits, and
// that token's entropy, for a few initialisation std's and seeds. Used in
// docs/experiments/referential-game-sdk.md.
//
//   node --import tsx scripts/experiments/prompt-information.mts
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import { BOS_ID, encodeBytes } from "../../src/engine/tokenizer.ts";

const addon = loadNative();
const cfg = PRESETS.quickstart;
const V = cfg.vocab_size;
const shapes: Record<string, (x: string) => string> = { bare: (x) => x, chat: (x) => `<|user|>${x}\n<|assistant|>` };
const letters = "ABCDEFGH".split("");

/** The next-token distribution after `text` (BOS first). */
function next(engine: InstanceType<typeof addon.Engine>, text: string): Float64Array {
  const ids = Int32Array.from([BOS_ID, ...encodeBytes(text)]);
  const z = engine.forwardLogits(ids).subarray((ids.length - 1) * V, ids.length * V);
  const m = Math.max(...z);
  const p = Float64Array.from(z, (v) => Math.exp(v - m));
  const s = p.reduce((a, x) => a + x, 0);
  return p.map((x) => x / s);
}

for (const std of [0.1, 0.2, 0.3])
  for (const seed of [0, 1]) {
    const engine = new addon.Engine({ config: cfg, params: addon.initModelParams(cfg, seed, std), cacheTokens: 4096, maxRunning: 8 });
    const row: Record<string, number> = { initStd: std, seed };
    for (const [name, shape] of Object.entries(shapes)) {
      const ps = letters.map((x) => next(engine, shape(x)));
      const avg = new Float64Array(V);
      for (const p of ps) for (let v = 0; v < V; v++) avg[v]! += p[v]! / ps.length;
      let mi = 0, h = 0;
      for (const p of ps) for (let v = 0; v < V; v++) if (p[v]! > 0) mi += (p[v]! / ps.length) * Math.log2(p[v]! / avg[v]!);
      for (let v = 0; v < V; v++) if (avg[v]! > 0) h -= avg[v]! * Math.log2(avg[v]!);
      row[`${name}_bits`] = Number(mi.toFixed(3));
      row[`${name}_entropy_bits`] = Number(h.toFixed(2));
    }
    console.log(JSON.stringify(row));
  }
