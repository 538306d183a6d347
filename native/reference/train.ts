// TypeScript reference of the native training forward and backward over packed sequences (float64,
// plain loops): per-token logprobs and entropies of a Llama-architecture model (the families of
// reference/model.ts) and every parameter's gradient.
// Slow on purpose; it exists to check native/src/train.cc on tiny configs.
import type { LlamaHfConfig } from "../index.d.ts";
import { referenceArch, referenceLayout } from "./model.ts";
import { ropeAttentionScaling, ropeInvFreq, type RopeConfig } from "./rope.ts";

/** The config.json fields of a Llama model that training reads (Hugging Face names). */
export interface TrainModelConfig extends RopeConfig {
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  rms_norm_eps: number;
  rope_theta: number;
  tie_word_embeddings: boolean;
  model_type?: string;
  head_dim?: number;
  attention_bias?: boolean;
  sliding_window?: number | null;
}

/** One named tensor in the flat parameter buffer (offset and size in floats). */
export interface TensorSpec {
  name: string;
  offset: number;
  shape: number[];
  numel: number;
}

/** A packed batch: sequences concatenated; sequence s is tokens[cuSeqlens[s] .. cuSeqlens[s+1]). */
export interface PackedTokens {
  tokens: Int32Array;
  cuSeqlens: Int32Array;
}

type Buf = Float64Array | Float32Array;

/** The flat buffer layout in HF tensor order, as native/src/model.cc builds it (the inference reference's). */
export function tensorLayout(cfg: TrainModelConfig): { tensors: TensorSpec[]; numel: number } {
  const tensors = referenceLayout(cfg as unknown as LlamaHfConfig).map((t) => ({ ...t, shape: [...t.shape], numel: t.shape.reduce((a, b) => a * b, 1) }));
  const last = tensors[tensors.length - 1]!;
  return { tensors, numel: last.offset + last.numel };
}

/** Offsets of each tensor by role; lm_head is embed_tokens when tied. */
interface Offsets {
  embed: number;
  layers: {
    ln1: number; q: number; k: number; v: number; o: number; ln2: number; gate: number; up: number; down: number;
    /** Biases and q/k norms, -1 when the family has none. */
    qb: number; kb: number; vb: number; ob: number; qn: number; kn: number;
  }[];
  norm: number;
  lmHead: number;
}

function offsets(cfg: TrainModelConfig): Offsets {
  const { tensors } = tensorLayout(cfg);
  const at = (name: string): number => {
    const t = tensors.find((x) => x.name === name);
    if (!t) throw new Error(`tensor ${name} missing from layout`);
    return t.offset;
  };
  const maybe = (name: string): number => tensors.find((x) => x.name === name)?.offset ?? -1;
  const layers = [];
  for (let l = 0; l < cfg.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    layers.push({
      ln1: at(p + "input_layernorm.weight"), q: at(p + "self_attn.q_proj.weight"),
      k: at(p + "self_attn.k_proj.weight"), v: at(p + "self_attn.v_proj.weight"),
      o: at(p + "self_attn.o_proj.weight"), ln2: at(p + "post_attention_layernorm.weight"),
      gate: at(p + "mlp.gate_proj.weight"), up: at(p + "mlp.up_proj.weight"), down: at(p + "mlp.down_proj.weight"),
      qb: maybe(p + "self_attn.q_proj.bias"), kb: maybe(p + "self_attn.k_proj.bias"), vb: maybe(p + "self_attn.v_proj.bias"),
      ob: maybe(p + "self_attn.o_proj.bias"), qn: maybe(p + "self_attn.q_norm.weight"), kn: maybe(p + "self_attn.k_norm.weight"),
    });
  }
  const embed = at("model.embed_tokens.weight");
  return { embed, layers, norm: at("model.norm.weight"), lmHead: cfg.tie_word_embeddings ? embed : at("lm_head.weight") };
}

/** y[T,out] = x[T,in] · W[out,in]ᵀ (+ the bias at offset b unless b < 0), W read from buffer p at offset w. */
function linear(x: Float64Array, p: Buf, w: number, T: number, nOut: number, nIn: number, b = -1): Float64Array {
  const y = new Float64Array(T * nOut);
  for (let t = 0; t < T; t++)
    for (let o = 0; o < nOut; o++) {
      let s = b < 0 ? 0 : p[b + o]!;
      for (let i = 0; i < nIn; i++) s += x[t * nIn + i]! * p[w + o * nIn + i]!;
      y[t * nOut + o] = s;
    }
  return y;
}

/** Backward of linear: returns dx, adds dyᵀ·x into g at offset w (and Σ_t dy into the bias at b unless b < 0). */
function linearBack(dy: Float64Array, x: Float64Array, p: Buf, g: Float64Array, w: number, T: number, nOut: number, nIn: number, b = -1): Float64Array {
  const dx = new Float64Array(T * nIn);
  for (let t = 0; t < T; t++)
    for (let o = 0; o < nOut; o++) {
      const d = dy[t * nOut + o]!;
      if (b >= 0) g[b + o]! += d;
      if (d === 0) continue;
      for (let i = 0; i < nIn; i++) {
        dx[t * nIn + i]! += d * p[w + o * nIn + i]!;
        g[w + o * nIn + i]! += d * x[t * nIn + i]!;
      }
    }
  return dx;
}

/** RMSNorm forward: returns y and the per-row reciprocal rms. */
function rmsnorm(x: Float64Array, p: Buf, w: number, T: number, H: number, eps: number): { y: Float64Array; rstd: Float64Array } {
  const y = new Float64Array(T * H), rstd = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    let ss = 0;
    for (let i = 0; i < H; i++) ss += x[t * H + i]! ** 2;
    const r = 1 / Math.sqrt(ss / H + eps);
    rstd[t] = r;
    for (let i = 0; i < H; i++) y[t * H + i] = x[t * H + i]! * r * p[w + i]!;
  }
  return { y, rstd };
}

function rmsnormBack(dy: Float64Array, x: Float64Array, rstd: Float64Array, p: Buf, g: Float64Array, w: number, T: number, H: number): Float64Array {
  const dx = new Float64Array(T * H);
  for (let t = 0; t < T; t++) {
    const r = rstd[t]!;
    let dot = 0;
    for (let i = 0; i < H; i++) {
      const xh = x[t * H + i]! * r;
      const dxh = dy[t * H + i]! * p[w + i]!;
      g[w + i]! += dy[t * H + i]! * xh;
      dot += dxh * xh;
    }
    dot /= H;
    for (let i = 0; i < H; i++) {
      const xh = x[t * H + i]! * r;
      dx[t * H + i] = r * (dy[t * H + i]! * p[w + i]! - xh * dot);
    }
  }
  return dx;
}

/** Position of each token within its own sequence. */
export function positionsOf(cuSeqlens: Int32Array, T: number): Int32Array {
  const pos = new Int32Array(T);
  for (let s = 0; s + 1 < cuSeqlens.length; s++)
    for (let i = cuSeqlens[s]!; i < cuSeqlens[s + 1]!; i++) pos[i] = i - cuSeqlens[s]!;
  return pos;
}

/** Applies rotate-half RoPE (cos and sin × mscale) in place to x[T, nHeads*hd] (sign -1: the transpose). */
function rope(x: Float64Array, pos: Int32Array, nHeads: number, hd: number, inv: Float64Array, sign: number, mscale: number): void {
  const half = hd / 2;
  const T = pos.length;
  for (let t = 0; t < T; t++)
    for (let h = 0; h < nHeads; h++)
      for (let i = 0; i < half; i++) {
        const ang = pos[t]! * inv[i]!;
        const c = Math.cos(ang) * mscale, s = sign * Math.sin(ang) * mscale;
        const base = t * nHeads * hd + h * hd;
        const x1 = x[base + i]!, x2 = x[base + i + half]!;
        x[base + i] = x1 * c - x2 * s;
        x[base + i + half] = x2 * c + x1 * s;
      }
}

/** Sequence index of every token. */
function seqStarts(cuSeqlens: Int32Array, T: number): Int32Array {
  const st = new Int32Array(T);
  for (let s = 0; s + 1 < cuSeqlens.length; s++)
    for (let i = cuSeqlens[s]!; i < cuSeqlens[s + 1]!; i++) st[i] = cuSeqlens[s]!;
  return st;
}

/** Checks a packed batch: offsets start at 0, never decrease, end at tokens.length; ids in range. */
export function validatePacked(batch: PackedTokens, vocab: number): void {
  const { tokens, cuSeqlens } = batch;
  if (cuSeqlens.length < 2 || cuSeqlens[0] !== 0 || cuSeqlens[cuSeqlens.length - 1] !== tokens.length)
    throw new Error(`cuSeqlens must start at 0 and end at tokens.length (${tokens.length})`);
  for (let s = 0; s + 1 < cuSeqlens.length; s++)
    if (cuSeqlens[s + 1]! < cuSeqlens[s]!) throw new Error(`cuSeqlens decreases at ${s}`);
  for (let i = 0; i < tokens.length; i++)
    if (tokens[i]! < 0 || tokens[i]! >= vocab) throw new Error(`token ${tokens[i]} at ${i} outside vocab ${vocab}`);
}

/** Result of the reference: logprobs/entropy aligned with tokens (0 at each sequence's first token). */
export interface ReferenceResult {
  logprobs: Float64Array;
  entropy: Float64Array;
  /** The uniform distribution's cross-entropy against the model's at each token: −(1/V)·Σ_v log π(v). */
  uniformCe: Float64Array;
  /** Gradient of Σ dLogprobs·logprobs + dEntropy·entropy (+ dUniform·uniformCe, dValues·values) wrt every parameter; null without upstream grads. */
  grads: Float64Array | null;
  /** With a value head: values[i] = w·xnf[i−1] + b (0 at each sequence's first token); else null. */
  values: Float64Array | null;
  /** With a value head and upstream grads: the gradient wrt the head's [w, b]; else null. */
  headGrads: Float64Array | null;
}

/**
 * Forward (and, given upstream gradients, backward) of a Llama model over a packed batch.
 * logprobs[i] = log softmax(logits(tokens[..i-1]) / temperature)[tokens[i]] for every token that is
 * not the first of its sequence; entropy[i] is that distribution's entropy and uniformCe[i] the uniform
 * distribution's cross-entropy against it. With `valueHead`
 * (hidden_size + 1 floats, weight then bias) also the critic's values on the final norm's output,
 * aligned like the logprobs, and with upstream dValues their gradient through the head and the trunk.
 */
export function referenceForwardBackward(
  cfg: TrainModelConfig,
  params: Buf,
  batch: PackedTokens,
  temperature: number,
  upstream: { dLogprobs: ArrayLike<number>; dEntropy: ArrayLike<number>; dUniform?: ArrayLike<number>; dValues?: ArrayLike<number> } | null,
  valueHead: ArrayLike<number> | null = null,
): ReferenceResult {
  validatePacked(batch, cfg.vocab_size);
  const { tokens, cuSeqlens } = batch;
  const T = tokens.length, H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const arch = referenceArch(cfg as unknown as LlamaHfConfig);
  const nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, hd = arch.hd;
  const Q = nh * hd, KV = nkv * hd, grp = nh / nkv, scale = 1 / Math.sqrt(hd), eps = cfg.rms_norm_eps;
  const off = offsets(cfg);
  const pos = positionsOf(cuSeqlens, T), seqStart = seqStarts(cuSeqlens, T);
  // The first key each query sees: its sequence's start, or the sliding window's (Mistral).
  const starts = arch.window > 0 ? Int32Array.from(seqStart, (s0, t) => Math.max(s0, t - arch.window + 1)) : seqStart;
  const inv = ropeInvFreq(cfg, hd), mscale = ropeAttentionScaling(cfg);

  let x = new Float64Array(T * H);
  for (let t = 0; t < T; t++) for (let i = 0; i < H; i++) x[t * H + i] = params[off.embed + tokens[t]! * H + i]!;

  interface Cache { xIn: Float64Array; n1: { y: Float64Array; rstd: Float64Array }; qPre: Float64Array; kPre: Float64Array; qn: { y: Float64Array; rstd: Float64Array } | null; kn: { y: Float64Array; rstd: Float64Array } | null; q: Float64Array; k: Float64Array; v: Float64Array; probs: Float64Array; att: Float64Array; h: Float64Array; n2: { y: Float64Array; rstd: Float64Array }; gate: Float64Array; up: Float64Array; act: Float64Array }
  const caches: Cache[] = [];
  for (const L of off.layers) {
    const n1 = rmsnorm(x, params, L.ln1, T, H, eps);
    const qPre = linear(n1.y, params, L.q, T, Q, H, L.qb), kPre = linear(n1.y, params, L.k, T, KV, H, L.kb);
    const v = linear(n1.y, params, L.v, T, KV, H, L.vb);
    const qn = L.qn >= 0 ? rmsnorm(qPre, params, L.qn, T * nh, hd, eps) : null;
    const kn = L.kn >= 0 ? rmsnorm(kPre, params, L.kn, T * nkv, hd, eps) : null;
    const q = Float64Array.from(qn ? qn.y : qPre), k = Float64Array.from(kn ? kn.y : kPre);
    rope(q, pos, nh, hd, inv, 1, mscale);
    rope(k, pos, nkv, hd, inv, 1, mscale);
    const probs = new Float64Array(T * nh * T); // probs[(t*nh+h)*T + j]
    const att = new Float64Array(T * Q);
    for (let t = 0; t < T; t++)
      for (let h = 0; h < nh; h++) {
        const g = Math.floor(h / grp);
        let mx = -Infinity;
        const base = (t * nh + h) * T;
        for (let j = starts[t]!; j <= t; j++) {
          let s = 0;
          for (let d = 0; d < hd; d++) s += q[t * Q + h * hd + d]! * k[j * KV + g * hd + d]!;
          probs[base + j] = s * scale;
          mx = Math.max(mx, s * scale);
        }
        let sum = 0;
        for (let j = starts[t]!; j <= t; j++) sum += (probs[base + j] = Math.exp(probs[base + j]! - mx));
        for (let j = starts[t]!; j <= t; j++) {
          const pj = (probs[base + j]! /= sum);
          for (let d = 0; d < hd; d++) att[t * Q + h * hd + d]! += pj * v[j * KV + g * hd + d]!;
        }
      }
    const o = linear(att, params, L.o, T, H, Q, L.ob);
    const h = new Float64Array(T * H);
    for (let i = 0; i < T * H; i++) h[i] = x[i]! + o[i]!;
    const n2 = rmsnorm(h, params, L.ln2, T, H, eps);
    const gate = linear(n2.y, params, L.gate, T, I, H), up = linear(n2.y, params, L.up, T, I, H);
    const act = new Float64Array(T * I);
    for (let i = 0; i < T * I; i++) act[i] = (gate[i]! / (1 + Math.exp(-gate[i]!))) * up[i]!;
    const down = linear(act, params, L.down, T, H, I);
    const xOut = new Float64Array(T * H);
    for (let i = 0; i < T * H; i++) xOut[i] = h[i]! + down[i]!;
    caches.push({ xIn: x, n1, qPre, kPre, qn, kn, q, k, v, probs, att, h, n2, gate, up, act });
    x = xOut;
  }
  const nf = rmsnorm(x, params, off.norm, T, H, eps);
  const logits = linear(nf.y, params, off.lmHead, T, V, H);
  const logprobs = new Float64Array(T), entropy = new Float64Array(T), uniformCe = new Float64Array(T);
  const logpOut = new Float64Array(T * V);
  for (let t = 0; t < T; t++) {
    if (t + 1 >= T || seqStart[t + 1] !== seqStart[t]) continue; // last token of its sequence
    let mx = -Infinity;
    for (let c = 0; c < V; c++) mx = Math.max(mx, logits[t * V + c]! / temperature);
    let sum = 0;
    for (let c = 0; c < V; c++) sum += Math.exp(logits[t * V + c]! / temperature - mx);
    const lse = mx + Math.log(sum);
    let ent = 0, uce = 0;
    for (let c = 0; c < V; c++) {
      const lp = logits[t * V + c]! / temperature - lse;
      logpOut[t * V + c] = lp;
      ent -= Math.exp(lp) * lp;
      uce -= lp / V;
    }
    logprobs[t + 1] = logits[t * V + tokens[t + 1]!]! / temperature - lse;
    entropy[t + 1] = ent;
    uniformCe[t + 1] = uce;
  }
  let values: Float64Array | null = null;
  if (valueHead) {
    values = new Float64Array(T);
    for (let t = 0; t + 1 < T; t++) {
      if (seqStart[t + 1] !== seqStart[t]) continue;
      let v = valueHead[H]!;
      for (let i = 0; i < H; i++) v += valueHead[i]! * nf.y[t * H + i]!;
      values[t + 1] = v;
    }
  }
  if (!upstream) return { logprobs, entropy, uniformCe, grads: null, values, headGrads: null };

  // Backward.
  const grads = new Float64Array(tensorLayout(cfg).numel);
  const dLogits = new Float64Array(T * V);
  for (let t = 0; t + 1 < T; t++) {
    if (seqStart[t + 1] !== seqStart[t]) continue;
    const gl = upstream.dLogprobs[t + 1]!, ge = upstream.dEntropy[t + 1]!, ent = entropy[t + 1]!;
    const gu = upstream.dUniform?.[t + 1] ?? 0;
    for (let c = 0; c < V; c++) {
      const lp = logpOut[t * V + c]!, p = Math.exp(lp);
      const dz = gl * ((c === tokens[t + 1] ? 1 : 0) - p) - ge * p * (lp + ent) + gu * (p - 1 / V);
      dLogits[t * V + c] = dz / temperature;
    }
  }
  const dnf = linearBack(dLogits, nf.y, params, grads, off.lmHead, T, V, H);
  let headGrads: Float64Array | null = null;
  if (valueHead && upstream.dValues) {
    headGrads = new Float64Array(H + 1);
    for (let t = 0; t + 1 < T; t++) {
      if (seqStart[t + 1] !== seqStart[t]) continue;
      const g = upstream.dValues[t + 1]!;
      for (let i = 0; i < H; i++) (dnf[t * H + i]! += g * valueHead[i]!), (headGrads[i]! += g * nf.y[t * H + i]!);
      headGrads[H]! += g;
    }
  }
  let dx = rmsnormBack(dnf, x, nf.rstd, params, grads, off.norm, T, H);
  for (let l = off.layers.length - 1; l >= 0; l--) {
    const L = off.layers[l]!, c = caches[l]!;
    // MLP branch.
    const dAct = linearBack(dx, c.act, params, grads, L.down, T, H, I);
    const dGate = new Float64Array(T * I), dUp = new Float64Array(T * I);
    for (let i = 0; i < T * I; i++) {
      const gv = c.gate[i]!, sg = 1 / (1 + Math.exp(-gv));
      dUp[i] = dAct[i]! * gv * sg;
      dGate[i] = dAct[i]! * c.up[i]! * sg * (1 + gv * (1 - sg));
    }
    const dn2 = linearBack(dGate, c.n2.y, params, grads, L.gate, T, I, H);
    const dn2b = linearBack(dUp, c.n2.y, params, grads, L.up, T, I, H);
    for (let i = 0; i < T * H; i++) dn2[i]! += dn2b[i]!;
    const dhNorm = rmsnormBack(dn2, c.h, c.n2.rstd, params, grads, L.ln2, T, H);
    const dh = new Float64Array(T * H);
    for (let i = 0; i < T * H; i++) dh[i] = dx[i]! + dhNorm[i]!;
    // Attention branch.
    const dAtt = linearBack(dh, c.att, params, grads, L.o, T, H, Q, L.ob);
    const dq = new Float64Array(T * Q), dk = new Float64Array(T * KV), dv = new Float64Array(T * KV);
    for (let t = 0; t < T; t++)
      for (let h = 0; h < nh; h++) {
        const g = Math.floor(h / grp), base = (t * nh + h) * T;
        let dot = 0; // Σ_j p_j dp_j
        const dp = new Float64Array(T);
        for (let j = starts[t]!; j <= t; j++) {
          let s = 0;
          for (let d = 0; d < hd; d++) s += dAtt[t * Q + h * hd + d]! * c.v[j * KV + g * hd + d]!;
          dp[j] = s;
          dot += c.probs[base + j]! * s;
        }
        for (let j = starts[t]!; j <= t; j++) {
          const pj = c.probs[base + j]!, ds = pj * (dp[j]! - dot) * scale;
          for (let d = 0; d < hd; d++) {
            dq[t * Q + h * hd + d]! += ds * c.k[j * KV + g * hd + d]!;
            dk[j * KV + g * hd + d]! += ds * c.q[t * Q + h * hd + d]!;
            dv[j * KV + g * hd + d]! += pj * dAtt[t * Q + h * hd + d]!;
          }
        }
      }
    rope(dq, pos, nh, hd, inv, -1, mscale);
    rope(dk, pos, nkv, hd, inv, -1, mscale);
    const dqPre = c.qn ? rmsnormBack(dq, c.qPre, c.qn.rstd, params, grads, L.qn, T * nh, hd) : dq;
    const dkPre = c.kn ? rmsnormBack(dk, c.kPre, c.kn.rstd, params, grads, L.kn, T * nkv, hd) : dk;
    const dn1 = linearBack(dqPre, c.n1.y, params, grads, L.q, T, Q, H, L.qb);
    const dn1k = linearBack(dkPre, c.n1.y, params, grads, L.k, T, KV, H, L.kb);
    const dn1v = linearBack(dv, c.n1.y, params, grads, L.v, T, KV, H, L.vb);
    for (let i = 0; i < T * H; i++) dn1[i]! += dn1k[i]! + dn1v[i]!;
    const dxNorm = rmsnormBack(dn1, c.xIn, c.n1.rstd, params, grads, L.ln1, T, H);
    dx = new Float64Array(T * H);
    for (let i = 0; i < T * H; i++) dx[i] = dh[i]! + dxNorm[i]!;
  }
  for (let t = 0; t < T; t++) for (let i = 0; i < H; i++) grads[off.embed + tokens[t]! * H + i]! += dx[t * H + i]!;
  return { logprobs, entropy, uniformCe, grads, values, headGrads };
}
