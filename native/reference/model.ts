// TypeScript reference of the decoder forward pass (full sequence, no cache) over the same flat params
// and tensor layout as the native model, written from HF's Llama, Mistral, Qwen2 and Qwen3 model
// definitions in plain loops with fp64 arithmetic (RoPE angles in fp32 as HF computes them). For tests
// of the native kernels.
import type { LlamaHfConfig, TensorLayout } from "../index.d.ts";
import { ropeAttentionScaling, ropeInvFreq } from "./rope.ts";

/** What distinguishes the families, read from a config as the native loader writes it. */
export interface ReferenceArch {
  /** Head size. */
  hd: number;
  /** q/k/v projections have biases (Qwen2; Llama and Qwen3 with attention_bias). */
  qkvBias: boolean;
  /** o_proj has a bias (Llama and Qwen3 with attention_bias). */
  oBias: boolean;
  /** Per-head RMSNorm of q and k before the rotation (Qwen3). */
  qkNorm: boolean;
  /** Sliding window (Mistral); 0: none. */
  window: number;
}

/** The family flags of a config (model_type absent: llama). */
export function referenceArch(c: LlamaHfConfig): ReferenceArch {
  const type = c.model_type ?? "llama";
  const bias = c.attention_bias === true && type !== "mistral";
  return {
    hd: c.head_dim ?? c.hidden_size / c.num_attention_heads,
    qkvBias: type === "qwen2" || bias,
    oBias: type !== "qwen2" && bias,
    qkNorm: type === "qwen3",
    window: type === "mistral" ? c.sliding_window ?? 0 : 0,
  };
}

/** The flat tensor layout for a config, in HF naming and order (lm_head only when untied). */
export function referenceLayout(c: LlamaHfConfig): TensorLayout[] {
  const out: TensorLayout[] = [];
  let offset = 0;
  const add = (name: string, shape: number[]) => {
    out.push({ name, offset, shape });
    offset += shape.reduce((a, b) => a * b, 1);
  };
  const arch = referenceArch(c);
  const h = c.hidden_size, hd = arch.hd;
  const q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd, i = c.intermediate_size;
  add("model.embed_tokens.weight", [c.vocab_size, h]);
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    add(p + "input_layernorm.weight", [h]);
    add(p + "self_attn.q_proj.weight", [q, h]);
    if (arch.qkvBias) add(p + "self_attn.q_proj.bias", [q]);
    add(p + "self_attn.k_proj.weight", [kv, h]);
    if (arch.qkvBias) add(p + "self_attn.k_proj.bias", [kv]);
    add(p + "self_attn.v_proj.weight", [kv, h]);
    if (arch.qkvBias) add(p + "self_attn.v_proj.bias", [kv]);
    add(p + "self_attn.o_proj.weight", [h, q]);
    if (arch.oBias) add(p + "self_attn.o_proj.bias", [h]);
    if (arch.qkNorm) {
      add(p + "self_attn.q_norm.weight", [hd]);
      add(p + "self_attn.k_norm.weight", [hd]);
    }
    add(p + "post_attention_layernorm.weight", [h]);
    add(p + "mlp.gate_proj.weight", [i, h]);
    add(p + "mlp.up_proj.weight", [i, h]);
    add(p + "mlp.down_proj.weight", [h, i]);
  }
  add("model.norm.weight", [h]);
  if (!c.tie_word_embeddings) add("lm_head.weight", [c.vocab_size, h]);
  return out;
}

/** y[rows, out] = x[rows, in] · W[out, in]ᵀ (+ bias at `biasOff` when given): an HF Linear. */
function linear(x: Float64Array, rows: number, w: Float32Array, off: number, nOut: number, nIn: number, biasOff?: number): Float64Array {
  const y = new Float64Array(rows * nOut);
  for (let r = 0; r < rows; r++)
    for (let o = 0; o < nOut; o++) {
      let s = biasOff === undefined ? 0 : w[biasOff + o]!;
      const wo = off + o * nIn, xr = r * nIn;
      for (let k = 0; k < nIn; k++) s += x[xr + k]! * w[wo + k]!;
      y[r * nOut + o] = s;
    }
  return y;
}

/** x * rsqrt(mean(x²) + eps) * w, per row. */
function rmsNorm(x: Float64Array, rows: number, dim: number, w: Float32Array, off: number, eps: number): Float64Array {
  const y = new Float64Array(rows * dim);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let k = 0; k < dim; k++) ss += x[r * dim + k]! ** 2;
    const inv = 1 / Math.sqrt(ss / dim + eps);
    for (let k = 0; k < dim; k++) y[r * dim + k] = x[r * dim + k]! * inv * w[off + k]!;
  }
  return y;
}

/** Rotate-half RoPE in place on `heads` vectors of size d at position pos (cos and sin × mscale). */
function rope(v: Float64Array, base: number, heads: number, d: number, pos: number, inv: Float64Array, mscale: number) {
  const half = d / 2;
  for (let i = 0; i < half; i++) {
    const invFreq = inv[i]!;
    const ang = Math.fround(pos * invFreq);
    const c = Math.cos(ang) * mscale, s = Math.sin(ang) * mscale;
    for (let h = 0; h < heads; h++) {
      const o = base + h * d;
      const a = v[o + i]!, b = v[o + i + half]!;
      v[o + i] = a * c - b * s;
      v[o + i + half] = b * c + a * s;
    }
  }
}

/** Logits [n × vocab] at every position of `tokens` (causal, positions 0..n-1). */
export function referenceLogits(c: LlamaHfConfig, params: Float32Array, tokens: ArrayLike<number>): Float32Array {
  const layout = new Map(referenceLayout(c).map((t) => [t.name, t.offset]));
  const at = (name: string) => {
    const o = layout.get(name);
    if (o === undefined) throw new Error(`reference: no tensor ${name}`);
    return o;
  };
  const n = tokens.length, H = c.hidden_size, NH = c.num_attention_heads, NKV = c.num_key_value_heads;
  const arch = referenceArch(c);
  const D = arch.hd, Q = NH * D, KV = NKV * D, I = c.intermediate_size, V = c.vocab_size;
  const eps = c.rms_norm_eps;
  const inv = ropeInvFreq(c, D), mscale = ropeAttentionScaling(c);
  const bias = (name: string) => (arch.qkvBias ? at(name) : undefined);
  let x: Float64Array = new Float64Array(n * H);
  const emb = at("model.embed_tokens.weight");
  for (let r = 0; r < n; r++) for (let k = 0; k < H; k++) x[r * H + k] = params[emb + tokens[r]! * H + k]!;
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    const h = rmsNorm(x, n, H, params, at(p + "input_layernorm.weight"), eps);
    let q = linear(h, n, params, at(p + "self_attn.q_proj.weight"), Q, H, bias(p + "self_attn.q_proj.bias"));
    let k = linear(h, n, params, at(p + "self_attn.k_proj.weight"), KV, H, bias(p + "self_attn.k_proj.bias"));
    const v = linear(h, n, params, at(p + "self_attn.v_proj.weight"), KV, H, bias(p + "self_attn.v_proj.bias"));
    if (arch.qkNorm) {
      q = rmsNorm(q, n * NH, D, params, at(p + "self_attn.q_norm.weight"), eps);
      k = rmsNorm(k, n * NKV, D, params, at(p + "self_attn.k_norm.weight"), eps);
    }
    for (let r = 0; r < n; r++) {
      rope(q, r * Q, NH, D, r, inv, mscale);
      rope(k, r * KV, NKV, D, r, inv, mscale);
    }
    const att = new Float64Array(n * Q);
    for (let r = 0; r < n; r++)
      for (let hh = 0; hh < NH; hh++) {
        const g = Math.floor(hh / (NH / NKV)); // GQA: kv head g serves NH/NKV query heads
        const scores = new Float64Array(r + 1);
        const first = arch.window > 0 ? Math.max(0, r - arch.window + 1) : 0; // Mistral's sliding window
        let mx = -Infinity;
        for (let t = first; t <= r; t++) {
          let s = 0;
          for (let d = 0; d < D; d++) s += q[r * Q + hh * D + d]! * k[t * KV + g * D + d]!;
          scores[t] = s / Math.sqrt(D);
          mx = Math.max(mx, scores[t]!);
        }
        let sum = 0;
        for (let t = first; t <= r; t++) sum += scores[t] = Math.exp(scores[t]! - mx);
        for (let t = first; t <= r; t++)
          for (let d = 0; d < D; d++) att[r * Q + hh * D + d] = att[r * Q + hh * D + d]! + (scores[t]! / sum) * v[t * KV + g * D + d]!;
      }
    const o = linear(att, n, params, at(p + "self_attn.o_proj.weight"), H, Q, arch.oBias ? at(p + "self_attn.o_proj.bias") : undefined);
    for (let j = 0; j < x.length; j++) x[j] = x[j]! + o[j]!;
    const h2 = rmsNorm(x, n, H, params, at(p + "post_attention_layernorm.weight"), eps);
    const gate = linear(h2, n, params, at(p + "mlp.gate_proj.weight"), I, H);
    const up = linear(h2, n, params, at(p + "mlp.up_proj.weight"), I, H);
    for (let j = 0; j < gate.length; j++) gate[j] = (gate[j]! / (1 + Math.exp(-gate[j]!))) * up[j]!;
    const down = linear(gate, n, params, at(p + "mlp.down_proj.weight"), H, I);
    for (let j = 0; j < x.length; j++) x[j] = x[j]! + down[j]!;
  }
  x = rmsNorm(x, n, H, params, at("model.norm.weight"), eps);
  const head = c.tie_word_embeddings ? emb : at("lm_head.weight");
  return Float32Array.from(linear(x, n, params, head, V, H));
}

/** log-softmax of logits[row·vocab .. (row+1)·vocab) / temperature, at `token`. */
export function referenceLogprob(logits: Float32Array, vocab: number, row: number, token: number, temperature = 1): number {
  let mx = -Infinity;
  for (let j = 0; j < vocab; j++) mx = Math.max(mx, logits[row * vocab + j]! / temperature);
  let z = 0;
  for (let j = 0; j < vocab; j++) z += Math.exp(logits[row * vocab + j]! / temperature - mx);
  return logits[row * vocab + token]! / temperature - mx - Math.log(z);
}

/** Index of the largest logit of a row (first on ties). */
export function referenceArgmax(logits: Float32Array, vocab: number, row: number): number {
  let best = 0;
  for (let j = 1; j < vocab; j++) if (logits[row * vocab + j]! > logits[row * vocab + best]!) best = j;
  return best;
}
