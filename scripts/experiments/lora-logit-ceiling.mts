// How likely can a LoRA policy over a frozen random base make one token? The embeddings (tied with
// lm_head) and the final norm stay frozen, so a logit is at most |RMSNorm(h)|·|E_t| / T: this finds,
// by projected gradient ascent over final hidden states h of RMS norm 1 (the norm weights are 1 at
// init), the largest probability of one token (id 65) the quickstart base allows, for a few
// initialisation std's and sampling temperatures. Used in docs/experiments/referential-game.md.
//
//   node --import tsx scripts/experiments/lora-logit-ceiling.mts
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";

const addon = loadNative();
const cfg = PRESETS.quickstart;
const V = cfg.vocab_size, D = cfg.hidden_size, target = 65;
for (const std of [0.02, 0.05, 0.1]) {
  const params = addon.initModelParams(cfg, 0, std);
  const emb = addon.modelLayout(cfg).tensors.find((t) => t.name === "model.embed_tokens.weight")!;
  const E = params.subarray(emb.offset, emb.offset + V * D);
  for (const T of [1, 0.5, 0.25]) {
    const h = Float64Array.from(E.subarray(target * D, (target + 1) * D));
    const project = () => {
      const n = Math.sqrt(h.reduce((a, x) => a + x * x, 0));
      for (let i = 0; i < D; i++) h[i] = (h[i]! * Math.sqrt(D)) / n; // RMS norm 1
    };
    project();
    let logp = 0;
    for (let it = 0; it < 3000; it++) {
      const z = new Float64Array(V);
      for (let v = 0; v < V; v++) {
        let s = 0;
        for (let i = 0; i < D; i++) s += h[i]! * E[v * D + i]!;
        z[v] = s / T;
      }
      const m = Math.max(...z);
      let sum = 0;
      for (let v = 0; v < V; v++) sum += Math.exp(z[v]! - m);
      logp = z[target]! - m - Math.log(sum);
      const g = new Float64Array(D);
      for (let v = 0; v < V; v++) {
        const c = (v === target ? 1 : 0) - Math.exp(z[v]! - m) / sum;
        for (let i = 0; i < D; i++) g[i]! += (c * E[v * D + i]!) / T;
      }
      for (let i = 0; i < D; i++) h[i]! += 0.5 * g[i]!;
      project();
    }
    console.log(JSON.stringify({ initStd: std, temperature: T, maxProbability: Number(Math.exp(logp).toFixed(3)) }));
  }
}
