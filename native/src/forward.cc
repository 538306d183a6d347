// The inference forward pass (see forward.h), computed as Hugging Face's Llama, Mistral, Qwen2 and
// Qwen3 models do in fp32: RMSNorm, q/k/v projections (with biases where the family has them),
// per-head q/k RMSNorm (Qwen3), rotate-half RoPE, grouped-query causal attention (within the sliding
// window, Mistral) over slot-indexed keys/values, SiLU-gated MLP, final norm and lm_head.
#include "forward.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels.h"
#include "simd.h"

namespace ooze {

void KvPool::init(int n_layers, int n_slots, int dim) {
  layers = n_layers, slots = n_slots, kv_dim = dim;
  k.assign(static_cast<size_t>(n_layers) * n_slots * dim, 0.0f);
  v.assign(k.size(), 0.0f);
}

void RopeTable::init(const LlamaConfig& cfg) {
  const int d = cfg.head_dim();
  half = d / 2;
  positions = cfg.max_position_embeddings;
  cos.resize(static_cast<size_t>(positions) * half);
  sin.resize(cos.size());
  const std::vector<float> inv = rope_inv_freq(cfg);
  const float mscale = rope_attention_scaling(cfg);  // yarn multiplies cos and sin (fp32, as HF)
  for (int i = 0; i < half; ++i) {
    // angle = fp32(pos * inv_freq), like HF.
    const float inv_freq = inv[static_cast<size_t>(i)];
    for (int p = 0; p < positions; ++p) {
      const float ang = static_cast<float>(p) * inv_freq;
      cos[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * mscale;
      sin[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * mscale;
    }
  }
}

namespace {

void rmsnorm(const float* x, const float* w, float* out, int rows, int dim, float eps) {
#pragma omp parallel for schedule(static) if (static_cast<long>(rows) * dim > 65536)
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* o = out + static_cast<size_t>(r) * dim;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    for (int i = 0; i < dim; ++i) o[i] = w[i] * (xr[i] * inv);
  }
}

/** y[r, :] += b for each of `rows` rows of width n (a Linear layer's bias). */
void add_bias(float* y, const float* b, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<size_t>(r) * n;
    for (int i = 0; i < n; ++i) yr[i] += b[i];
  }
}

/** Consecutive chunks' rows [row0, row0 + rows) under one adapter. */
struct LoraRun {
  const LoraView* lora;
  int row0, rows;
};

/** The runs of rows that carry an adapter (empty when no chunk has one: the base costs nothing extra). */
std::vector<LoraRun> lora_runs(const std::vector<SeqChunk>& chunks) {
  std::vector<LoraRun> runs;
  int r = 0;
  for (auto& ch : chunks) {
    if (ch.lora && ch.n > 0) {
      if (!runs.empty() && runs.back().lora == ch.lora && runs.back().row0 + runs.back().rows == r) runs.back().rows += ch.n;
      else runs.push_back({ch.lora, r, ch.n});
    }
    r += ch.n;
  }
  return runs;
}

/** y[R, out] += s·(x·Aᵀ)·Bᵀ of `target` in `layer`, on each run's rows of x [R, in] (runs whose adapter targets it). */
void add_lora(const std::vector<LoraRun>& runs, int layer, int target, const float* x, int in, float* y, int out,
              std::vector<float>& tmp) {
  for (const LoraRun& run : runs) {
    const LoraPair& p = run.lora->layers[static_cast<size_t>(layer)].t[target];
    if (!p.A) continue;
    lora_apply(x + static_cast<size_t>(run.row0) * in, run.rows, in, out, p, run.lora->cfg->rank, run.lora->scaling,
               y + static_cast<size_t>(run.row0) * out, tmp);
  }
}

void rope_rotate(float* vec, const float* c, const float* s, int half) {
  for (int i = 0; i < half; ++i) {
    const float a = vec[i], b = vec[i + half];
    vec[i] = a * c[i] - b * s[i];
    vec[i + half] = b * c[i] + a * s[i];
  }
}

}  // namespace

void forward_step(const Model& m, const RopeTable& rope, KvPool& kv, const std::vector<SeqChunk>& chunks,
                  bool all_rows, Workspace& ws, std::vector<float>& logits) {
  const LlamaConfig& c = m.cfg;
  const int H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim();
  const int NH = c.num_attention_heads, NKV = c.num_key_value_heads, Q = NH * D, KV = NKV * D;
  const int W = c.sliding_window;
  const int group = NH / NKV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Row bookkeeping: row r belongs to chunk row_seq[r] at position row_pos[r].
  std::vector<int> row_seq, row_pos;
  for (size_t s = 0; s < chunks.size(); ++s)
    for (int j = 0; j < chunks[s].n; ++j) {
      const int pos = chunks[s].start + j;
      if (pos >= rope.positions) throw std::out_of_range("position beyond max_position_embeddings");
      row_seq.push_back(static_cast<int>(s));
      row_pos.push_back(pos);
    }
  const int R = static_cast<int>(row_seq.size());
  long attn_work = 0;  // multiply-adds of attention per layer: parallelise only when worth it
  for (int p : row_pos) attn_work += static_cast<long>(W > 0 ? std::min(p + 1, W) : p + 1) * NH * D * 2;
  logits.clear();
  if (R == 0) return;
  auto sz = [](int a, int b) { return static_cast<size_t>(a) * b; };
  ws.x.resize(sz(R, H)), ws.h.resize(sz(R, H)), ws.q.resize(sz(R, Q)), ws.k.resize(sz(R, KV)),
      ws.v.resize(sz(R, KV)), ws.att.resize(sz(R, Q)), ws.g.resize(sz(R, I)), ws.u.resize(sz(R, I));
  Model::Ptrs P = m.ptrs(const_cast<float*>(m.params.data()));
  const std::vector<LoraRun> runs = lora_runs(chunks);
  for (const LoraRun& run : runs)
    if (run.lora->layers.size() != static_cast<size_t>(c.num_hidden_layers))
      throw std::invalid_argument("a LoRA adapter has " + std::to_string(run.lora->layers.size()) + " layers; the model has " +
                                  std::to_string(c.num_hidden_layers));
  // Embedding lookup.
  {
    int r = 0;
    for (auto& ch : chunks)
      for (int j = 0; j < ch.n; ++j, ++r) {
        const int t = ch.tokens[j];
        if (t < 0 || t >= V) throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary");
        std::copy_n(P.embed_tokens + sz(t, H), H, ws.x.data() + sz(r, H));
      }
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerPtrs& L = P.layers[l];
    rmsnorm(ws.x.data(), L.input_layernorm, ws.h.data(), R, H, c.rms_norm_eps);
    matmul_nt(ws.h.data(), L.q_proj, ws.q.data(), R, Q, H, false);
    matmul_nt(ws.h.data(), L.k_proj, ws.k.data(), R, KV, H, false);
    matmul_nt(ws.h.data(), L.v_proj, ws.v.data(), R, KV, H, false);
    if (L.q_bias) {
      add_bias(ws.q.data(), L.q_bias, R, Q);
      add_bias(ws.k.data(), L.k_bias, R, KV);
      add_bias(ws.v.data(), L.v_bias, R, KV);
    }
    add_lora(runs, l, kLoraQ, ws.h.data(), H, ws.q.data(), Q, ws.lora_tmp);
    add_lora(runs, l, kLoraK, ws.h.data(), H, ws.k.data(), KV, ws.lora_tmp);
    add_lora(runs, l, kLoraV, ws.h.data(), H, ws.v.data(), KV, ws.lora_tmp);
    if (L.q_norm) {  // RMSNorm of each head's q and k (rows of head_dim), before the rotation
      rmsnorm(ws.q.data(), L.q_norm, ws.q.data(), R * NH, D, c.rms_norm_eps);
      rmsnorm(ws.k.data(), L.k_norm, ws.k.data(), R * NKV, D, c.rms_norm_eps);
    }
    // RoPE on q and k, then store k/v in each row's slot.
#pragma omp parallel for schedule(static) if (static_cast<long>(R) * (Q + KV) > 65536)
    for (int r = 0; r < R; ++r) {
      const float* cs = rope.cos.data() + sz(row_pos[r], rope.half);
      const float* sn = rope.sin.data() + sz(row_pos[r], rope.half);
      for (int h = 0; h < NH; ++h) rope_rotate(ws.q.data() + sz(r, Q) + sz(h, D), cs, sn, rope.half);
      for (int h = 0; h < NKV; ++h) rope_rotate(ws.k.data() + sz(r, KV) + sz(h, D), cs, sn, rope.half);
      const int slot = chunks[row_seq[r]].slots[row_pos[r]];
      std::copy_n(ws.k.data() + sz(r, KV), KV, kv.key(l, slot));
      std::copy_n(ws.v.data() + sz(r, KV), KV, kv.value(l, slot));
    }
    // Causal attention: row at position p attends to positions first..p of its own sequence (first
    // is 0, or the start of the sliding window). One task per (kv head, row): each key and value is
    // read once for the query heads that share it, and rows sharing a prefix (a group of samples of
    // one prompt) follow one another over the same keys while they are in cache.
#pragma omp parallel for schedule(dynamic) if (attn_work > 65536)
    for (int gr = 0; gr < NKV * R; ++gr) {
      const int g = gr / R, r = gr % R;
      const SeqChunk& ch = chunks[row_seq[r]];
      const int npos = row_pos[r] + 1, first = attention_start(c, row_pos[r]), n = npos - first;
      thread_local std::vector<float> sc;
      thread_local std::vector<const float*> vrow;
      sc.resize(sz(group, n)), vrow.resize(n);
      const float* q = ws.q.data() + sz(r, Q) + sz(g * group, D);
      for (int t = 0; t < n; ++t) {
        const int slot = ch.slots[first + t];
        const float* k = kv.key(l, slot) + sz(g, D);
        vrow[t] = kv.value(l, slot) + sz(g, D);
        for (int j = 0; j < group; ++j) sc[sz(j, n) + t] = dot(q + sz(j, D), k, D) * scale;
      }
      for (int j = 0; j < group; ++j) {
        float* s = sc.data() + sz(j, n);
        float mx = -INFINITY;
        for (int t = 0; t < n; ++t) mx = std::max(mx, s[t]);
        float sum = 0;
        for (int t = 0; t < n; ++t) sum += (s[t] = std::exp(s[t] - mx));
        const float inv = 1.0f / sum;
        for (int t = 0; t < n; ++t) s[t] *= inv;
        weighted_rows(vrow.data(), s, n, D, ws.att.data() + sz(r, Q) + sz(g * group + j, D));
      }
    }
    matmul_nt(ws.att.data(), L.o_proj, ws.x.data(), R, H, Q, true);  // residual
    if (L.o_bias) add_bias(ws.x.data(), L.o_bias, R, H);
    add_lora(runs, l, kLoraO, ws.att.data(), Q, ws.x.data(), H, ws.lora_tmp);
    rmsnorm(ws.x.data(), L.post_attention_layernorm, ws.h.data(), R, H, c.rms_norm_eps);
    matmul_nt(ws.h.data(), L.gate_proj, ws.g.data(), R, I, H, false);
    matmul_nt(ws.h.data(), L.up_proj, ws.u.data(), R, I, H, false);
    add_lora(runs, l, kLoraGate, ws.h.data(), H, ws.g.data(), I, ws.lora_tmp);
    add_lora(runs, l, kLoraUp, ws.h.data(), H, ws.u.data(), I, ws.lora_tmp);
    const size_t n_gu = sz(R, I);
#pragma omp parallel for schedule(static) if (n_gu > 65536)
    for (size_t i = 0; i < n_gu; ++i) {
      const float gv = ws.g[i];
      ws.g[i] = gv / (1.0f + std::exp(-gv)) * ws.u[i];
    }
    matmul_nt(ws.g.data(), L.down_proj, ws.x.data(), R, H, I, true);  // residual
    add_lora(runs, l, kLoraDown, ws.g.data(), I, ws.x.data(), H, ws.lora_tmp);
  }
  // Final norm and lm_head over the rows that need logits.
  std::vector<int> out_rows;
  {
    int r = 0;
    for (auto& ch : chunks) {
      if (all_rows)
        for (int j = 0; j < ch.n; ++j) out_rows.push_back(r + j);
      else if (ch.n > 0)
        out_rows.push_back(r + ch.n - 1);
      r += ch.n;
    }
  }
  const int NO = static_cast<int>(out_rows.size());
  ws.out_h.resize(sz(NO, H));
  for (int o = 0; o < NO; ++o) std::copy_n(ws.x.data() + sz(out_rows[o], H), H, ws.out_h.data() + sz(o, H));
  rmsnorm(ws.out_h.data(), P.norm, ws.out_h.data(), NO, H, c.rms_norm_eps);
  logits.resize(sz(NO, V));
  matmul_nt(ws.out_h.data(), P.lm_head, logits.data(), NO, V, H, false);
}

std::vector<float> forward_full(const Model& m, const int32_t* tokens, int n, const LoraView* lora) {
  KvPool kv;
  kv.init(m.cfg.num_hidden_layers, n, m.cfg.kv_dim());
  RopeTable rope;
  rope.init(m.cfg);
  std::vector<int32_t> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = i;
  SeqChunk ch{tokens, n, 0, slots.data(), lora};
  Workspace ws;
  std::vector<float> logits;
  forward_step(m, rope, kv, {ch}, true, ws, logits);
  return logits;
}

}  // namespace ooze
