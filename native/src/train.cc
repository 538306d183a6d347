// Training forward and backward of the model over packed sequences (see train.h). Linear layers
// go through the shared matmul kernels; attention keeps one log-sum-exp per row and recomputes its
// probabilities in the backward; lm_head runs over chunks of rows so full logits never exist.
#include "train.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"

namespace ooze {
namespace {

constexpr int kLogitRows = 32;  // rows of logits held at once

/** Shapes and per-token bookkeeping shared by forward and backward. */
struct Dims {
  int T, H, I, V, nh, nkv, hd, Q, KV, grp, window;
  float scale, eps;
  std::vector<int> pos, start, end;  // per token: position, its sequence's [start, end)
  std::vector<float> cos, sin;       // [max_pos, hd/2]
  std::vector<int> pred_rows;        // tokens p whose next token p+1 is in the same sequence

  Dims(const LlamaConfig& c, const PackedBatch& b) {
    T = b.num_tokens(), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim();
    Q = nh * hd, KV = nkv * hd, grp = nh / nkv, window = c.sliding_window;
    scale = 1.0f / std::sqrt(static_cast<float>(hd));
    eps = c.rms_norm_eps;
    pos.resize(T), start.resize(T), end.resize(T);
    int max_len = 1;
    for (int s = 0; s < b.num_seqs(); ++s) {
      int a = b.cu_seqlens[s], e = b.cu_seqlens[s + 1];
      max_len = std::max(max_len, e - a);
      for (int i = a; i < e; ++i) {
        pos[i] = i - a, start[i] = a, end[i] = e;
        if (i + 1 < e) pred_rows.push_back(i);
      }
    }
    const int half = hd / 2;
    cos.resize(static_cast<size_t>(max_len) * half), sin.resize(cos.size());
    const std::vector<float> inv_freq = rope_inv_freq(c);
    const float mscale = rope_attention_scaling(c);  // yarn scales cos and sin
    for (int i = 0; i < half; ++i) {
      const float inv = inv_freq[static_cast<size_t>(i)];
      for (int p = 0; p < max_len; ++p) {
        float ang = static_cast<float>(p) * inv;
        cos[static_cast<size_t>(p) * half + i] = std::cos(ang) * mscale;
        sin[static_cast<size_t>(p) * half + i] = std::sin(ang) * mscale;
      }
    }
  }
  /** The first key a query at token t attends to: its sequence's start, or the sliding window's. */
  int first_key(int t) const { return window > 0 ? std::max(start[t], t - window + 1) : start[t]; }
  /** One past the last query that attends to the key at token j. */
  int last_query(int j) const { return window > 0 ? std::min(end[j], j + window) : end[j]; }
};

/** y[t, :] += b for T rows of width n (a Linear layer's bias). */
void add_bias(float* y, const float* b, int T, int n) {
#pragma omp parallel for schedule(static) if (static_cast<long>(T) * n > 16384)
  for (int t = 0; t < T; ++t) {
    float* yr = y + static_cast<size_t>(t) * n;
    for (int i = 0; i < n; ++i) yr[i] += b[i];
  }
}

/** db[i] += Σ_t dy[t, i] (a bias's gradient). */
void bias_grad(const float* dy, float* db, int T, int n) {
#pragma omp parallel for schedule(static) if (static_cast<long>(T) * n > 16384)
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int t = 0; t < T; ++t) s += dy[static_cast<size_t>(t) * n + i];
    db[i] += static_cast<float>(s);
  }
}

void rmsnorm_fwd(const float* x, const float* w, float* y, float* rstd, int T, int H, float eps) {
#pragma omp parallel for schedule(static) if (T * H > 16384)
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * H;
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    float r = 1.0f / std::sqrt(static_cast<float>(ss / H) + eps);
    rstd[t] = r;
    float* yr = y + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

/** dx (+)= RMSNorm backward; dw accumulated serially per column block to avoid races. */
void rmsnorm_bwd(const float* dy, const float* x, const float* rstd, const float* w, float* dw, float* dx,
                 int T, int H, bool accumulate) {
#pragma omp parallel for schedule(static) if (T * H > 16384)
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * H;
    const float* dr = dy + static_cast<size_t>(t) * H;
    float* out = dx + static_cast<size_t>(t) * H;
    const float r = rstd[t];
    double dot = 0;
    for (int i = 0; i < H; ++i) dot += static_cast<double>(dr[i] * w[i]) * (xr[i] * r);
    const float m = static_cast<float>(dot / H);
    for (int i = 0; i < H; ++i) {
      float v = r * (dr[i] * w[i] - xr[i] * r * m);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
#pragma omp parallel for schedule(static) if (T * H > 16384)
  for (int i = 0; i < H; ++i) {
    double s = 0;
    for (int t = 0; t < T; ++t) s += static_cast<double>(dy[static_cast<size_t>(t) * H + i]) * x[static_cast<size_t>(t) * H + i] * rstd[t];
    dw[i] += static_cast<float>(s);
  }
}

/** Rotate-half RoPE in place on x[T, heads*hd]; inverse=true applies the transpose (backward). */
void rope(float* x, const Dims& d, int heads, bool inverse) {
  const int half = d.hd / 2, T = d.T;
#pragma omp parallel for schedule(static) if (T * heads * d.hd > 16384)
  for (int t = 0; t < T; ++t) {
    const float* c = d.cos.data() + static_cast<size_t>(d.pos[t]) * half;
    const float* s = d.sin.data() + static_cast<size_t>(d.pos[t]) * half;
    for (int h = 0; h < heads; ++h) {
      float* r = x + (static_cast<size_t>(t) * heads + h) * d.hd;
      for (int i = 0; i < half; ++i) {
        float x1 = r[i], x2 = r[i + half], sn = inverse ? -s[i] : s[i];
        r[i] = x1 * c[i] - x2 * sn;
        r[i + half] = x2 * c[i] + x1 * sn;
      }
    }
  }
}

/** Causal attention within each sequence; writes att [T,Q] and lse [T,nh]. */
void attention_fwd(const Dims& d, const float* q, const float* k, const float* v, float* att, float* lse) {
#pragma omp parallel
  {
    std::vector<float> sc(d.T > 0 ? d.T : 1);
#pragma omp for collapse(2) schedule(dynamic, 8)
    for (int t = 0; t < d.T; ++t) {
      for (int h = 0; h < d.nh; ++h) {
        const int g = h / d.grp, a = d.first_key(t);
        const float* qr = q + static_cast<size_t>(t) * d.Q + h * d.hd;
        float mx = -INFINITY;
        for (int j = a; j <= t; ++j) {
          const float* kr = k + static_cast<size_t>(j) * d.KV + g * d.hd;
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int e = 0; e < d.hd; ++e) s += qr[e] * kr[e];
          s *= d.scale;
          sc[j - a] = s;
          mx = std::max(mx, s);
        }
        float sum = 0;
        for (int j = a; j <= t; ++j) sum += (sc[j - a] = std::exp(sc[j - a] - mx));
        const float inv = 1.0f / sum;
        float* o = att + static_cast<size_t>(t) * d.Q + h * d.hd;
        std::fill(o, o + d.hd, 0.0f);
        for (int j = a; j <= t; ++j) {
          const float p = sc[j - a] * inv;
          const float* vr = v + static_cast<size_t>(j) * d.KV + g * d.hd;
          for (int e = 0; e < d.hd; ++e) o[e] += p * vr[e];
        }
        lse[static_cast<size_t>(t) * d.nh + h] = mx + std::log(sum);
      }
    }
  }
}

/**
 * Attention backward in two race-free passes: dq per (query, head), then dk/dv per (key, kv head).
 * Probabilities are recomputed from q, k and the saved log-sum-exp.
 */
void attention_bwd(const Dims& d, const float* q, const float* k, const float* v, const float* att,
                   const float* lse, const float* datt, float* dq, float* dk, float* dv) {
  std::vector<float> D(static_cast<size_t>(d.T) * d.nh);  // Σ_j p_j dp_j = datt · att
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int t = 0; t < d.T; ++t) {
    for (int h = 0; h < d.nh; ++h) {
      const int g = h / d.grp, a = d.first_key(t);
      const size_t qo = static_cast<size_t>(t) * d.Q + h * d.hd;
      float dsum = 0;
#pragma omp simd reduction(+ : dsum)
      for (int e = 0; e < d.hd; ++e) dsum += datt[qo + e] * att[qo + e];
      D[static_cast<size_t>(t) * d.nh + h] = dsum;
      const float l = lse[static_cast<size_t>(t) * d.nh + h];
      float* dqr = dq + qo;
      std::fill(dqr, dqr + d.hd, 0.0f);
      for (int j = a; j <= t; ++j) {
        const float* kr = k + static_cast<size_t>(j) * d.KV + g * d.hd;
        const float* vr = v + static_cast<size_t>(j) * d.KV + g * d.hd;
        float s = 0, dp = 0;
#pragma omp simd reduction(+ : s, dp)
        for (int e = 0; e < d.hd; ++e) s += q[qo + e] * kr[e], dp += datt[qo + e] * vr[e];
        const float p = std::exp(s * d.scale - l);
        const float ds = p * (dp - dsum) * d.scale;
        for (int e = 0; e < d.hd; ++e) dqr[e] += ds * kr[e];
      }
    }
  }
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
  for (int j = 0; j < d.T; ++j) {
    for (int g = 0; g < d.nkv; ++g) {
      const size_t ko = static_cast<size_t>(j) * d.KV + g * d.hd;
      float* dkr = dk + ko;
      float* dvr = dv + ko;
      std::fill(dkr, dkr + d.hd, 0.0f);
      std::fill(dvr, dvr + d.hd, 0.0f);
      for (int h = g * d.grp; h < (g + 1) * d.grp; ++h) {
        for (int t = j; t < d.last_query(j); ++t) {
          const size_t qo = static_cast<size_t>(t) * d.Q + h * d.hd;
          float s = 0, dp = 0;
#pragma omp simd reduction(+ : s, dp)
          for (int e = 0; e < d.hd; ++e) s += q[qo + e] * k[ko + e], dp += datt[qo + e] * v[ko + e];
          const float p = std::exp(s * d.scale - lse[static_cast<size_t>(t) * d.nh + h]);
          const float ds = p * (dp - D[static_cast<size_t>(t) * d.nh + h]) * d.scale;
          for (int e = 0; e < d.hd; ++e) dkr[e] += ds * q[qo + e], dvr[e] += p * datt[qo + e];
        }
      }
    }
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/**
 * One chunk of lm_head rows: logits = xnf[rows]·Wᵀ / τ, then per row the log-softmax. Writes the
 * target's logprob, the entropy and the log-sum-exp of each row to lp/ent/lse_out (indexed by row
 * in chunk); `logits` ([n, V]) is left holding logits / τ.
 */
void logits_chunk(const Dims& d, const float* xnf, const float* W, const int* rows, int n, const int32_t* tokens,
                  float temperature, std::vector<float>& xbuf, std::vector<float>& logits, float* lp, float* ent,
                  float* lse_out) {
  for (int r = 0; r < n; ++r)
    std::memcpy(xbuf.data() + static_cast<size_t>(r) * d.H, xnf + static_cast<size_t>(rows[r]) * d.H, sizeof(float) * d.H);
  matmul_nt(xbuf.data(), W, logits.data(), n, d.V, d.H, false);
  const float invt = 1.0f / temperature;
#pragma omp parallel for schedule(static) if (static_cast<long>(n) * d.V > 16384)
  for (int r = 0; r < n; ++r) {
    float* z = logits.data() + static_cast<size_t>(r) * d.V;
    float mx = -INFINITY;
    for (int c = 0; c < d.V; ++c) mx = std::max(mx, z[c] *= invt);
    double sum = 0;
    for (int c = 0; c < d.V; ++c) sum += std::exp(z[c] - mx);
    const double lse = mx + std::log(sum);
    const float lsef = static_cast<float>(lse);
    double pz = 0;
    for (int c = 0; c < d.V; ++c) pz += std::exp(z[c] - lsef) * z[c];
    lp[r] = static_cast<float>(z[tokens[rows[r] + 1]] - lse);
    ent[r] = static_cast<float>(lse - pz);
    lse_out[r] = static_cast<float>(lse);
  }
}

}  // namespace

std::string validate_batch(const PackedBatch& b, int vocab) {
  if (b.cu_seqlens.size() < 2) return "cu_seqlens needs at least 2 entries (one sequence)";
  if (b.cu_seqlens.front() != 0) return "cu_seqlens[0] must be 0";
  if (b.cu_seqlens.back() != b.num_tokens())
    return "cu_seqlens must end at the number of tokens (" + std::to_string(b.num_tokens()) + "), got " +
           std::to_string(b.cu_seqlens.back());
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s)
    if (b.cu_seqlens[s] < b.cu_seqlens[s - 1]) return "cu_seqlens decreases at index " + std::to_string(s);
  for (size_t i = 0; i < b.tokens.size(); ++i)
    if (b.tokens[i] < 0 || b.tokens[i] >= vocab)
      return "token id " + std::to_string(b.tokens[i]) + " at index " + std::to_string(i) + " is outside the vocabulary [0, " +
             std::to_string(vocab) + ")";
  return "";
}

void train_forward(const Model& m, const float* params, const PackedBatch& b, float temperature, float* logprobs,
                   float* entropy, Activations* acts, const uint8_t* want, const ValueHead* head) {
  const Dims d(m.cfg, b);
  const auto P = m.ptrs(const_cast<float*>(params));
  const int T = d.T, H = d.H;
  const size_t TH = static_cast<size_t>(T) * H;
  std::vector<float> x(TH), tmp(TH);
  for (int t = 0; t < T; ++t)
    std::memcpy(x.data() + static_cast<size_t>(t) * H, P.embed_tokens + static_cast<size_t>(b.tokens[t]) * H, sizeof(float) * H);
  if (acts) acts->layers.assign(m.cfg.num_hidden_layers, LayerActs{});
  LayerActs scratch;
  std::vector<float> act(static_cast<size_t>(T) * d.I);
  for (int l = 0; l < m.cfg.num_hidden_layers; ++l) {
    const LayerPtrs& L = P.layers[l];
    LayerActs& a = acts ? acts->layers[l] : scratch;
    a.rstd1.resize(T), a.xn1.resize(TH), a.q.resize(static_cast<size_t>(T) * d.Q);
    a.k.resize(static_cast<size_t>(T) * d.KV), a.v.resize(a.k.size()), a.lse.resize(static_cast<size_t>(T) * d.nh);
    a.att.resize(a.q.size()), a.rstd2.resize(T), a.xn2.resize(TH);
    a.gate.resize(static_cast<size_t>(T) * d.I), a.up.resize(a.gate.size());
    if (acts) a.x_in = x;
    rmsnorm_fwd(x.data(), L.input_layernorm, a.xn1.data(), a.rstd1.data(), T, H, d.eps);
    matmul_nt(a.xn1.data(), L.q_proj, a.q.data(), T, d.Q, H, false);
    matmul_nt(a.xn1.data(), L.k_proj, a.k.data(), T, d.KV, H, false);
    matmul_nt(a.xn1.data(), L.v_proj, a.v.data(), T, d.KV, H, false);
    if (L.q_bias) {
      add_bias(a.q.data(), L.q_bias, T, d.Q);
      add_bias(a.k.data(), L.k_bias, T, d.KV);
      add_bias(a.v.data(), L.v_bias, T, d.KV);
    }
    if (L.q_norm) {  // per-head RMSNorm (rows of head_dim) before the rotation; keep the inputs
      a.q_pre = a.q, a.k_pre = a.k;
      a.rstd_q.resize(static_cast<size_t>(T) * d.nh), a.rstd_k.resize(static_cast<size_t>(T) * d.nkv);
      rmsnorm_fwd(a.q_pre.data(), L.q_norm, a.q.data(), a.rstd_q.data(), T * d.nh, d.hd, d.eps);
      rmsnorm_fwd(a.k_pre.data(), L.k_norm, a.k.data(), a.rstd_k.data(), T * d.nkv, d.hd, d.eps);
    }
    rope(a.q.data(), d, d.nh, false);
    rope(a.k.data(), d, d.nkv, false);
    attention_fwd(d, a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.lse.data());
    matmul_nt(a.att.data(), L.o_proj, x.data(), T, H, d.Q, true);  // residual: x += o_proj(att)
    if (L.o_bias) add_bias(x.data(), L.o_bias, T, H);
    if (acts) a.h = x;
    rmsnorm_fwd(x.data(), L.post_attention_layernorm, a.xn2.data(), a.rstd2.data(), T, H, d.eps);
    matmul_nt(a.xn2.data(), L.gate_proj, a.gate.data(), T, d.I, H, false);
    matmul_nt(a.xn2.data(), L.up_proj, a.up.data(), T, d.I, H, false);
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) act[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
    matmul_nt(act.data(), L.down_proj, x.data(), T, H, d.I, true);
  }
  std::vector<float> rstdf(T), xnf(TH);
  rmsnorm_fwd(x.data(), P.norm, xnf.data(), rstdf.data(), T, H, d.eps);

  std::fill(logprobs, logprobs + T, 0.0f);
  std::fill(entropy, entropy + T, 0.0f);
  std::vector<int> rows;
  for (int p : d.pred_rows)
    if (!want || want[p + 1]) rows.push_back(p);
  const int n_rows = static_cast<int>(rows.size());
  const int R = std::min<int>(kLogitRows, std::max<int>(1, n_rows));
  std::vector<float> xbuf(static_cast<size_t>(R) * H), logits(static_cast<size_t>(R) * d.V), lp(R), ent(R), lse(R);
  for (int c0 = 0; c0 < n_rows; c0 += R) {
    const int n = std::min(R, n_rows - c0);
    logits_chunk(d, xnf.data(), P.lm_head, rows.data() + c0, n, b.tokens.data(), temperature, xbuf, logits, lp.data(),
                 ent.data(), lse.data());
    for (int r = 0; r < n; ++r) {
      logprobs[rows[c0 + r] + 1] = lp[r];
      entropy[rows[c0 + r] + 1] = ent[r];
    }
  }
  if (head && head->values) {
    std::fill(head->values, head->values + T, 0.0f);
    const float* w = head->params;
    for (int p : d.pred_rows) {
      const float* xr = xnf.data() + static_cast<size_t>(p) * H;
      double v = w[H];
      for (int i = 0; i < H; ++i) v += static_cast<double>(w[i]) * xr[i];
      head->values[p + 1] = static_cast<float>(v);
    }
  }
  if (acts) {
    acts->x_final = std::move(x);
    acts->rstdf = std::move(rstdf);
    acts->xnf = std::move(xnf);
  }
}

void train_backward(const Model& m, const float* params, const PackedBatch& b, float temperature, const Activations& A,
                    const float* dlogprobs, const float* dentropy, float* grads, const ValueHead* head) {
  const Dims d(m.cfg, b);
  const auto P = m.ptrs(const_cast<float*>(params));
  const auto G = m.ptrs(grads);
  const int T = d.T, H = d.H;
  const size_t TH = static_cast<size_t>(T) * H;

  // lm_head: only rows whose next token carries a gradient.
  std::vector<int> rows;
  for (int p : d.pred_rows)
    if (dlogprobs[p + 1] != 0.0f || dentropy[p + 1] != 0.0f) rows.push_back(p);
  std::vector<float> dxnf(TH, 0.0f);
  const int R = std::min<int>(kLogitRows, std::max<int>(1, static_cast<int>(rows.size())));
  std::vector<float> xbuf(static_cast<size_t>(R) * H), logits(static_cast<size_t>(R) * d.V), lp(R), ent(R), lse(R);
  std::vector<float> dxbuf(static_cast<size_t>(R) * H);
  const float invt = 1.0f / temperature;
  for (int c0 = 0; c0 < static_cast<int>(rows.size()); c0 += R) {
    const int n = std::min(R, static_cast<int>(rows.size()) - c0);
    const int* rr = rows.data() + c0;
    logits_chunk(d, A.xnf.data(), P.lm_head, rr, n, b.tokens.data(), temperature, xbuf, logits, lp.data(), ent.data(),
                 lse.data());
#pragma omp parallel for schedule(static) if (static_cast<long>(n) * d.V > 16384)
    for (int r = 0; r < n; ++r) {
      // dz_c = g_lp (1[c=y] - p_c) - g_ent p_c (log p_c + H); dlogits = dz / τ.
      const float gl = dlogprobs[rr[r] + 1], ge = dentropy[rr[r] + 1];
      float* z = logits.data() + static_cast<size_t>(r) * d.V;
      for (int c = 0; c < d.V; ++c) {
        const float logp = z[c] - lse[r];
        const float p = std::exp(logp);
        z[c] = (-gl * p - ge * p * (logp + ent[r])) * invt;
      }
      z[b.tokens[rr[r] + 1]] += gl * invt;
    }
    matmul_nn(logits.data(), P.lm_head, dxbuf.data(), n, H, d.V, false);
    matmul_tn(logits.data(), xbuf.data(), G.lm_head, d.V, H, n, true);
    for (int r = 0; r < n; ++r)
      std::memcpy(dxnf.data() + static_cast<size_t>(rr[r]) * H, dxbuf.data() + static_cast<size_t>(r) * H, sizeof(float) * H);
  }
  if (head && head->dvalues) {  // V[p+1] = w·xnf[p] + b
    const float* w = head->params;
    for (int p : d.pred_rows) {
      const float g = head->dvalues[p + 1];
      if (g == 0.0f) continue;
      float* dr = dxnf.data() + static_cast<size_t>(p) * H;
      const float* xr = A.xnf.data() + static_cast<size_t>(p) * H;
      for (int i = 0; i < H; ++i) dr[i] += g * w[i], head->grads[i] += g * xr[i];
      head->grads[H] += g;
    }
  }
  std::vector<float> dx(TH), dh(TH), dn(TH);
  rmsnorm_bwd(dxnf.data(), A.x_final.data(), A.rstdf.data(), P.norm, G.norm, dx.data(), T, H, false);

  std::vector<float> act(static_cast<size_t>(T) * d.I), dact(act.size()), dgate(act.size()), dup(act.size());
  std::vector<float> datt(static_cast<size_t>(T) * d.Q), dq(datt.size());
  std::vector<float> dk(static_cast<size_t>(T) * d.KV), dv(dk.size());
  std::vector<float> dq_pre, dk_pre;  // qk_norm only
  for (int l = m.cfg.num_hidden_layers - 1; l >= 0; --l) {
    const LayerPtrs& L = P.layers[l];
    const LayerPtrs& GL = G.layers[l];
    const LayerActs& a = A.layers[l];
    // MLP: x_out = h + down(silu(gate) * up).
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) act[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
    matmul_nn(dx.data(), L.down_proj, dact.data(), T, d.I, H, false);
    matmul_tn(dx.data(), act.data(), GL.down_proj, H, d.I, T, true);
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) {
      const float g = a.gate[i], s = sigmoid(g);
      dup[i] = dact[i] * g * s;
      dgate[i] = dact[i] * a.up[i] * s * (1.0f + g * (1.0f - s));
    }
    matmul_nn(dgate.data(), L.gate_proj, dn.data(), T, H, d.I, false);
    matmul_nn(dup.data(), L.up_proj, dn.data(), T, H, d.I, true);
    matmul_tn(dgate.data(), a.xn2.data(), GL.gate_proj, d.I, H, T, true);
    matmul_tn(dup.data(), a.xn2.data(), GL.up_proj, d.I, H, T, true);
    dh = dx;
    rmsnorm_bwd(dn.data(), a.h.data(), a.rstd2.data(), L.post_attention_layernorm, GL.post_attention_layernorm, dh.data(),
                T, H, true);
    // Attention: h = x_in + o_proj(att).
    matmul_nn(dh.data(), L.o_proj, datt.data(), T, d.Q, H, false);
    matmul_tn(dh.data(), a.att.data(), GL.o_proj, H, d.Q, T, true);
    if (GL.o_bias) bias_grad(dh.data(), GL.o_bias, T, H);
    attention_bwd(d, a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.lse.data(), datt.data(), dq.data(), dk.data(),
                  dv.data());
    rope(dq.data(), d, d.nh, true);
    rope(dk.data(), d, d.nkv, true);
    if (L.q_norm) {  // through the per-head norms: dq, dk become gradients of the projections' outputs
      dq_pre.resize(dq.size()), dk_pre.resize(dk.size());
      rmsnorm_bwd(dq.data(), a.q_pre.data(), a.rstd_q.data(), L.q_norm, GL.q_norm, dq_pre.data(), T * d.nh, d.hd, false);
      rmsnorm_bwd(dk.data(), a.k_pre.data(), a.rstd_k.data(), L.k_norm, GL.k_norm, dk_pre.data(), T * d.nkv, d.hd, false);
      dq.swap(dq_pre), dk.swap(dk_pre);
    }
    if (GL.q_bias) {
      bias_grad(dq.data(), GL.q_bias, T, d.Q);
      bias_grad(dk.data(), GL.k_bias, T, d.KV);
      bias_grad(dv.data(), GL.v_bias, T, d.KV);
    }
    matmul_nn(dq.data(), L.q_proj, dn.data(), T, H, d.Q, false);
    matmul_nn(dk.data(), L.k_proj, dn.data(), T, H, d.KV, true);
    matmul_nn(dv.data(), L.v_proj, dn.data(), T, H, d.KV, true);
    matmul_tn(dq.data(), a.xn1.data(), GL.q_proj, d.Q, H, T, true);
    matmul_tn(dk.data(), a.xn1.data(), GL.k_proj, d.KV, H, T, true);
    matmul_tn(dv.data(), a.xn1.data(), GL.v_proj, d.KV, H, T, true);
    dx = dh;
    rmsnorm_bwd(dn.data(), a.x_in.data(), a.rstd1.data(), L.input_layernorm, GL.input_layernorm, dx.data(), T, H, true);
  }
  for (int t = 0; t < T; ++t) {
    float* g = G.embed_tokens + static_cast<size_t>(b.tokens[t]) * H;
    const float* s = dx.data() + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) g[i] += s[i];
  }
}

}  // namespace ooze
