// Training forward and backward of the model over packed sequences (see train.h). Linear layers
// go through the shared matmul kernels; attention keeps one log-sum-exp per row and recomputes its
// probabilities in the backward; lm_head runs over chunks of rows so full logits never exist.
#include "train.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <omp.h>

#include "kernels.h"
#include "lora.h"
#include "simd.h"

namespace ooze {
namespace {

/**
 * Rows of lm_head logits held at most at once: as many as fit in 64 MiB, 32 to 512. Smaller chunks
 * cost GEMM efficiency: each chunk reads all of lm_head for its nt and nn products and reads and
 * writes all of its gradient for the tn one (at a 152k vocabulary, 32-row chunks ran the nt product
 * at half the speed of 110-row ones).
 */
int logit_rows(int vocab) { return std::clamp((16 << 20) / std::max(vocab, 1), 32, 512); }

/** Rows per chunk for n rows: chunks of at most logit_rows(vocab), as equal as can be (no small tail chunk). */
int chunk_rows(int n, int vocab) {
  const int most = logit_rows(vocab), chunks = std::max(1, (n + most - 1) / most);
  return std::max(1, (n + chunks - 1) / chunks);
}

/** Shapes and per-token bookkeeping shared by forward and backward. */
struct Dims {
  int T, H, I, V, nh, nkv, hd, Q, KV, grp, window;
  float scale, eps;
  std::vector<int> pos, start, end;  // per token: position, its sequence's [start, end)
  std::vector<float> cos, sin;       // [max_pos, hd/2]
  std::vector<int> pred_rows;        // tokens p whose next token p+1 is in the same sequence
  std::vector<int> cu;               // the batch's cu_seqlens: sequence s is tokens [cu[s], cu[s+1])

  Dims(const LlamaConfig& c, const PackedBatch& b) {
    T = b.num_tokens(), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
    nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim();
    Q = nh * hd, KV = nkv * hd, grp = nh / nkv, window = c.sliding_window;
    scale = 1.0f / std::sqrt(static_cast<float>(hd));
    eps = c.rms_norm_eps;
    pos.resize(T), start.resize(T), end.resize(T);
    cu.assign(b.cu_seqlens.begin(), b.cu_seqlens.end());
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
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < H; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    float r = 1.0f / std::sqrt(static_cast<float>(ss / H) + eps);
    rstd[t] = r;
    float* yr = y + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

/** dx (+)= RMSNorm backward; dw (when not null) accumulated per block of columns (one thread each) to avoid races. */
void rmsnorm_bwd(const float* dy, const float* x, const float* rstd, const float* w, float* dw, float* dx,
                 int T, int H, bool accumulate) {
#pragma omp parallel for schedule(static) if (T * H > 16384)
  for (int t = 0; t < T; ++t) {
    const float* xr = x + static_cast<size_t>(t) * H;
    const float* dr = dy + static_cast<size_t>(t) * H;
    float* out = dx + static_cast<size_t>(t) * H;
    const float r = rstd[t];
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < H; ++i) dot += static_cast<double>(dr[i] * w[i]) * (xr[i] * r);
    const float m = static_cast<float>(dot / H);
    for (int i = 0; i < H; ++i) {
      float v = r * (dr[i] * w[i] - xr[i] * r * m);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
  // dw[i] += Σ_t dy[t,i]·x[t,i]·rstd[t], each column summed in t order, over blocks of columns so
  // that rows are read contiguously. No dw: the weight is frozen.
  if (!dw) return;
  constexpr int CB = 256;
#pragma omp parallel for schedule(static) if (T * H > 16384)
  for (int i0 = 0; i0 < H; i0 += CB) {
    const int nb = std::min(CB, H - i0);
    double acc[CB] = {};
    for (int t = 0; t < T; ++t) {
      const float* dr = dy + static_cast<size_t>(t) * H + i0;
      const float* xr = x + static_cast<size_t>(t) * H + i0;
      const double r = rstd[t];
      for (int i = 0; i < nb; ++i) acc[i] += static_cast<double>(dr[i]) * xr[i] * r;
    }
    for (int i = 0; i < nb; ++i) dw[i0 + i] += static_cast<float>(acc[i]);
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

/**
 * Attention runs per (sequence, kv head) on that head's keys and values gathered into contiguous
 * [n, hd] matrices, over blocks of kAttnRows queries: the scores, the weighted values and, backward,
 * every gradient product are matmuls through the shared kernels (masked to each query's keys).
 */
constexpr int kAttnRows = 72;  // queries per block (a multiple of both micro-kernels' rows, 12 and 6)

/** dst[r, :] = src[(a + r) * ld + c0 ...] for r < n, w floats a row. */
void gather_rows(const float* src, int ld, int a, int n, int c0, int w, float* dst) {
  for (int r = 0; r < n; ++r) std::memcpy(dst + static_cast<size_t>(r) * w, src + static_cast<size_t>(a + r) * ld + c0, sizeof(float) * w);
}

/** dst[(a + r) * ld + c0 ...] = src[r, :] for r < n. */
void scatter_rows(const float* src, int n, int w, float* dst, int ld, int a, int c0) {
  for (int r = 0; r < n; ++r) std::memcpy(dst + static_cast<size_t>(a + r) * ld + c0, src + static_cast<size_t>(r) * w, sizeof(float) * w);
}

/** Causal attention within each sequence; writes att [T,Q] and lse [T,nh]. */
void attention_fwd(const Dims& d, const float* q, const float* k, const float* v, float* att, float* lse) {
  const int ns = static_cast<int>(d.cu.size()) - 1, hd = d.hd;
#pragma omp parallel
  {
    if (omp_get_num_threads() > 1) omp_set_num_threads(1);  // tasks in parallel, their matmuls on one thread each
    std::vector<float> Kg, Vg, Qh, S, O;
#pragma omp for schedule(dynamic)
    for (int task = 0; task < ns * d.nkv; ++task) {
      const int s = task / d.nkv, g = task % d.nkv, a = d.cu[s], n = d.cu[s + 1] - a;
      if (n <= 0) continue;
      const size_t nh_ = static_cast<size_t>(n) * hd;
      Kg.resize(nh_), Vg.resize(nh_), Qh.resize(nh_);
      S.resize(static_cast<size_t>(std::min(n, kAttnRows)) * n), O.resize(static_cast<size_t>(kAttnRows) * hd);
      gather_rows(k, d.KV, a, n, g * hd, hd, Kg.data());
      gather_rows(v, d.KV, a, n, g * hd, hd, Vg.data());
      for (int h = g * d.grp; h < (g + 1) * d.grp; ++h) {
        gather_rows(q, d.Q, a, n, h * hd, hd, Qh.data());
        for (int i0 = 0; i0 < n; i0 += kAttnRows) {
          const int bq = std::min(kAttnRows, n - i0), k0 = d.first_key(a + i0) - a, nk = i0 + bq - k0;
          matmul_nt(Qh.data() + static_cast<size_t>(i0) * hd, Kg.data() + static_cast<size_t>(k0) * hd, S.data(), bq, nk, hd, false);
          for (int r = 0; r < bq; ++r) {
            const int t = a + i0 + r, lo = d.first_key(t) - a - k0, hi = i0 + r - k0;  // keys [lo, hi]
            float* sr = S.data() + static_cast<size_t>(r) * nk;
            float mx = -INFINITY;
            for (int j = lo; j <= hi; ++j) mx = std::max(mx, sr[j] *= d.scale);
            float sum = 0;
            for (int j = lo; j <= hi; ++j) sum += (sr[j] = std::exp(sr[j] - mx));
            const float inv = 1.0f / sum;
            for (int j = lo; j <= hi; ++j) sr[j] *= inv;
            std::fill(sr, sr + lo, 0.0f);
            std::fill(sr + hi + 1, sr + nk, 0.0f);
            lse[static_cast<size_t>(t) * d.nh + h] = mx + std::log(sum);
          }
          matmul_nn(S.data(), Vg.data() + static_cast<size_t>(k0) * hd, O.data(), bq, hd, nk, false);
          scatter_rows(O.data(), bq, hd, att, d.Q, a + i0, h * hd);
        }
      }
    }
  }
}

/**
 * Attention backward per (sequence, kv head), so that dk and dv of a head are summed by one task:
 * probabilities recomputed from q, k and the saved log-sum-exp, then dq = dS·K, dK += dSᵀ·Q and
 * dV += Pᵀ·dO per block of queries, with dS = P∘(dP − D)·scale, dP = dO·Vᵀ and D = dO·O per row.
 */
void attention_bwd(const Dims& d, const float* q, const float* k, const float* v, const float* att,
                   const float* lse, const float* datt, float* dq, float* dk, float* dv) {
  std::vector<float> D(static_cast<size_t>(d.T) * d.nh);  // Σ_j p_j dp_j = datt · att
#pragma omp parallel for schedule(static) if (static_cast<long>(d.T) * d.Q > 16384)
  for (int t = 0; t < d.T; ++t)
    for (int h = 0; h < d.nh; ++h) {
      const size_t qo = static_cast<size_t>(t) * d.Q + h * d.hd;
      D[static_cast<size_t>(t) * d.nh + h] = dot(datt + qo, att + qo, d.hd);
    }
  const int ns = static_cast<int>(d.cu.size()) - 1, hd = d.hd;
#pragma omp parallel
  {
    if (omp_get_num_threads() > 1) omp_set_num_threads(1);
    std::vector<float> Kg, Vg, dKg, dVg, Qh, dOh, S, dS, dQb;
#pragma omp for schedule(dynamic)
    for (int task = 0; task < ns * d.nkv; ++task) {
      const int s = task / d.nkv, g = task % d.nkv, a = d.cu[s], n = d.cu[s + 1] - a;
      if (n <= 0) continue;
      const size_t nh_ = static_cast<size_t>(n) * hd;
      Kg.resize(nh_), Vg.resize(nh_), Qh.resize(nh_), dOh.resize(nh_);
      dKg.assign(nh_, 0.0f), dVg.assign(nh_, 0.0f);
      const size_t sb = static_cast<size_t>(std::min(n, kAttnRows)) * n;
      S.resize(sb), dS.resize(sb), dQb.resize(static_cast<size_t>(kAttnRows) * hd);
      gather_rows(k, d.KV, a, n, g * hd, hd, Kg.data());
      gather_rows(v, d.KV, a, n, g * hd, hd, Vg.data());
      for (int h = g * d.grp; h < (g + 1) * d.grp; ++h) {
        gather_rows(q, d.Q, a, n, h * hd, hd, Qh.data());
        gather_rows(datt, d.Q, a, n, h * hd, hd, dOh.data());
        for (int i0 = 0; i0 < n; i0 += kAttnRows) {
          const int bq = std::min(kAttnRows, n - i0), k0 = d.first_key(a + i0) - a, nk = i0 + bq - k0;
          const float* Qb = Qh.data() + static_cast<size_t>(i0) * hd;
          const float* dOb = dOh.data() + static_cast<size_t>(i0) * hd;
          matmul_nt(Qb, Kg.data() + static_cast<size_t>(k0) * hd, S.data(), bq, nk, hd, false);    // scores
          matmul_nt(dOb, Vg.data() + static_cast<size_t>(k0) * hd, dS.data(), bq, nk, hd, false);  // dP
          for (int r = 0; r < bq; ++r) {
            const int t = a + i0 + r, lo = d.first_key(t) - a - k0, hi = i0 + r - k0;
            const float l = lse[static_cast<size_t>(t) * d.nh + h], Dt = D[static_cast<size_t>(t) * d.nh + h];
            float* pr = S.data() + static_cast<size_t>(r) * nk;
            float* dr = dS.data() + static_cast<size_t>(r) * nk;
            for (int j = lo; j <= hi; ++j) {
              const float p = std::exp(pr[j] * d.scale - l);
              pr[j] = p;
              dr[j] = p * (dr[j] - Dt) * d.scale;
            }
            std::fill(pr, pr + lo, 0.0f), std::fill(pr + hi + 1, pr + nk, 0.0f);
            std::fill(dr, dr + lo, 0.0f), std::fill(dr + hi + 1, dr + nk, 0.0f);
          }
          matmul_nn(dS.data(), Kg.data() + static_cast<size_t>(k0) * hd, dQb.data(), bq, hd, nk, false);
          scatter_rows(dQb.data(), bq, hd, dq, d.Q, a + i0, h * hd);
          matmul_tn(dS.data(), Qb, dKg.data() + static_cast<size_t>(k0) * hd, nk, hd, bq, true);
          matmul_tn(S.data(), dOb, dVg.data() + static_cast<size_t>(k0) * hd, nk, hd, bq, true);
        }
      }
      scatter_rows(dKg.data(), n, hd, dk, d.KV, a, g * hd);
      scatter_rows(dVg.data(), n, hd, dv, d.KV, a, g * hd);
    }
  }
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

/** One chunk of lm_head rows: logits[n, V] = xnf[rows]·Wᵀ / τ (the rows gathered into xbuf). */
void lm_logits(const Dims& d, const float* xnf, const float* W, const int* rows, int n, float temperature,
               std::vector<float>& xbuf, std::vector<float>& logits) {
  for (int r = 0; r < n; ++r)
    std::memcpy(xbuf.data() + static_cast<size_t>(r) * d.H, xnf + static_cast<size_t>(rows[r]) * d.H, sizeof(float) * d.H);
  matmul_nt(xbuf.data(), W, logits.data(), n, d.V, d.H, false);
  const float invt = 1.0f / temperature;
  if (invt == 1.0f) return;
  const size_t nv = static_cast<size_t>(n) * d.V;
#pragma omp parallel for schedule(static) if (nv > 65536)
  for (size_t i = 0; i < nv; ++i) logits[i] *= invt;
}

/**
 * The log-softmax of each row of `logits` ([n, V], already / τ): the target's logprob, the entropy,
 * the log-sum-exp and the uniform distribution's cross-entropy against it (lse − mean z), to
 * lp/ent/lse_out/uce (indexed by row in chunk). Sums in fp64, four partial sums.
 */
void row_stats(const Dims& d, const std::vector<float>& logits, const int* rows, int n, const int32_t* tokens, float* lp,
               float* ent, float* lse_out, float* uce) {
#pragma omp parallel for schedule(static) if (static_cast<long>(n) * d.V > 16384)
  for (int r = 0; r < n; ++r) {
    const float* z = logits.data() + static_cast<size_t>(r) * d.V;
    const float mx = max_of(z, d.V);
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, sz = 0;
    int c = 0;
    for (; c + 4 <= d.V; c += 4) {
      s0 += std::exp(z[c] - mx), s1 += std::exp(z[c + 1] - mx);
      s2 += std::exp(z[c + 2] - mx), s3 += std::exp(z[c + 3] - mx);
      sz += (static_cast<double>(z[c]) + z[c + 1]) + (static_cast<double>(z[c + 2]) + z[c + 3]);
    }
    for (; c < d.V; ++c) s0 += std::exp(z[c] - mx), sz += z[c];
    const double lse = mx + std::log((s0 + s1) + (s2 + s3));
    const float lsef = static_cast<float>(lse);
    s0 = s1 = s2 = s3 = 0;
    for (c = 0; c + 4 <= d.V; c += 4) {
      s0 += std::exp(z[c] - lsef) * z[c], s1 += std::exp(z[c + 1] - lsef) * z[c + 1];
      s2 += std::exp(z[c + 2] - lsef) * z[c + 2], s3 += std::exp(z[c + 3] - lsef) * z[c + 3];
    }
    for (; c < d.V; ++c) s0 += std::exp(z[c] - lsef) * z[c];
    const double pz = (s0 + s1) + (s2 + s3);
    lp[r] = static_cast<float>(z[tokens[rows[r] + 1]] - lse);
    ent[r] = static_cast<float>(lse - pz);
    lse_out[r] = static_cast<float>(lse);
    uce[r] = static_cast<float>(lse - sz / d.V);
  }
}

/** The adapter's pair for target t of layer l, or null when there is no adapter or it skips t. */
const LoraPair* lora_pair(const LoraView* lv, int l, int t) {
  if (!lv || !lv->cfg->has(t)) return nullptr;
  return &lv->layers[static_cast<size_t>(l)].t[t];
}

/** y[T, out] += the adapter's term of target t on input x[T, in] (nothing without one). */
void lora_add(const LoraView* lv, int l, int t, const float* x, int T, int in, int out, float* y, std::vector<float>& tmp) {
  if (const LoraPair* p = lora_pair(lv, l, t)) lora_apply(x, T, in, out, *p, lv->cfg->rank, lv->scaling, y, tmp);
}

/** The adapter's backward for target t: dx += its input gradient, its A and B grads accumulated. */
void lora_back(const LoraView* lv, const LoraView* lg, int l, int t, const float* x, const float* dy, int T, int in, int out,
               float* dx, std::vector<float>& tmp) {
  const LoraPair* p = lora_pair(lv, l, t);
  if (!p) return;
  const LoraPair g = lg ? lg->layers[static_cast<size_t>(l)].t[t] : LoraPair{};
  lora_backward(x, dy, T, in, out, *p, g, lv->cfg->rank, lv->scaling, dx, tmp);
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
                   float* entropy, Activations* acts, const uint8_t* want, const ValueHead* head, const LoraView* lora,
                   float* uniform_ce) {
  const Dims d(m.cfg, b);
  const auto P = m.ptrs(const_cast<float*>(params));
  const int T = d.T, H = d.H;
  const size_t TH = static_cast<size_t>(T) * H;
  std::vector<float> x(TH), tmp(TH);
  for (int t = 0; t < T; ++t)
    std::memcpy(x.data() + static_cast<size_t>(t) * H, P.embed_tokens + static_cast<size_t>(b.tokens[t]) * H, sizeof(float) * H);
  if (acts) acts->layers.resize(m.cfg.num_hidden_layers);  // every field is resized below: buffers reused
  LayerActs scratch;
  std::vector<float> act(static_cast<size_t>(T) * d.I), ltmp;
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
    lora_add(lora, l, kLoraQ, a.xn1.data(), T, H, d.Q, a.q.data(), ltmp);
    lora_add(lora, l, kLoraK, a.xn1.data(), T, H, d.KV, a.k.data(), ltmp);
    lora_add(lora, l, kLoraV, a.xn1.data(), T, H, d.KV, a.v.data(), ltmp);
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
    lora_add(lora, l, kLoraO, a.att.data(), T, d.Q, H, x.data(), ltmp);
    if (L.o_bias) add_bias(x.data(), L.o_bias, T, H);
    if (acts) a.h = x;
    rmsnorm_fwd(x.data(), L.post_attention_layernorm, a.xn2.data(), a.rstd2.data(), T, H, d.eps);
    matmul_nt(a.xn2.data(), L.gate_proj, a.gate.data(), T, d.I, H, false);
    matmul_nt(a.xn2.data(), L.up_proj, a.up.data(), T, d.I, H, false);
    lora_add(lora, l, kLoraGate, a.xn2.data(), T, H, d.I, a.gate.data(), ltmp);
    lora_add(lora, l, kLoraUp, a.xn2.data(), T, H, d.I, a.up.data(), ltmp);
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) act[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
    matmul_nt(act.data(), L.down_proj, x.data(), T, H, d.I, true);
    lora_add(lora, l, kLoraDown, act.data(), T, d.I, H, x.data(), ltmp);
  }
  std::vector<float> rstdf(T), xnf(TH);
  rmsnorm_fwd(x.data(), P.norm, xnf.data(), rstdf.data(), T, H, d.eps);

  std::fill(logprobs, logprobs + T, 0.0f);
  std::fill(entropy, entropy + T, 0.0f);
  if (uniform_ce) std::fill(uniform_ce, uniform_ce + T, 0.0f);
  std::vector<int> rows;
  for (int p : d.pred_rows)
    if (!want || want[p + 1]) rows.push_back(p);
  const int n_rows = static_cast<int>(rows.size());
  const int R = chunk_rows(n_rows, d.V);
  std::vector<float> xbuf(static_cast<size_t>(R) * H), logits(static_cast<size_t>(R) * d.V), lp(R), ent(R), lse(R), uce(R);
  if (acts) acts->row_lse.assign(T, NAN), acts->row_ent.assign(T, NAN);
  for (int c0 = 0; c0 < n_rows; c0 += R) {
    const int n = std::min(R, n_rows - c0);
    lm_logits(d, xnf.data(), P.lm_head, rows.data() + c0, n, temperature, xbuf, logits);
    row_stats(d, logits, rows.data() + c0, n, b.tokens.data(), lp.data(), ent.data(), lse.data(), uce.data());
    for (int r = 0; r < n; ++r) {
      logprobs[rows[c0 + r] + 1] = lp[r];
      entropy[rows[c0 + r] + 1] = ent[r];
      if (uniform_ce) uniform_ce[rows[c0 + r] + 1] = uce[r];
      if (acts) acts->row_lse[rows[c0 + r]] = lse[r], acts->row_ent[rows[c0 + r]] = ent[r];
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
                    const float* dlogprobs, const float* dentropy, float* grads, const ValueHead* head,
                    const LoraView* lora, const LoraView* lora_grads, const float* duniform) {
  const Dims d(m.cfg, b);
  const auto P = m.ptrs(const_cast<float*>(params));
  // No grads: the base is frozen (an adapter trains); every base weight's gradient product is skipped.
  const bool base = grads != nullptr;
  Model::Ptrs G{};
  if (base) G = m.ptrs(grads);
  else G.layers.resize(P.layers.size(), LayerPtrs{});
  const int T = d.T, H = d.H;
  const size_t TH = static_cast<size_t>(T) * H;

  // lm_head: only rows whose next token carries a gradient.
  std::vector<int> rows;
  for (int p : d.pred_rows)
    if (dlogprobs[p + 1] != 0.0f || dentropy[p + 1] != 0.0f || (duniform && duniform[p + 1] != 0.0f)) rows.push_back(p);
  std::vector<float> dxnf(TH, 0.0f);
  const int R = chunk_rows(static_cast<int>(rows.size()), d.V);
  std::vector<float> xbuf(static_cast<size_t>(R) * H), logits(static_cast<size_t>(R) * d.V), lp(R), ent(R), lse(R), uce(R);
  std::vector<float> dxbuf(static_cast<size_t>(R) * H);
  const float invt = 1.0f / temperature;
  for (int c0 = 0; c0 < static_cast<int>(rows.size()); c0 += R) {
    const int n = std::min(R, static_cast<int>(rows.size()) - c0);
    const int* rr = rows.data() + c0;
    lm_logits(d, A.xnf.data(), P.lm_head, rr, n, temperature, xbuf, logits);
    // The forward's log-sum-exp and entropy of these rows when it computed them (same logits), else anew.
    bool saved = A.row_lse.size() == static_cast<size_t>(T);
    for (int r = 0; saved && r < n; ++r) saved = !std::isnan(A.row_lse[rr[r]]);
    if (saved)
      for (int r = 0; r < n; ++r) lse[r] = A.row_lse[rr[r]], ent[r] = A.row_ent[rr[r]];
    else
      row_stats(d, logits, rr, n, b.tokens.data(), lp.data(), ent.data(), lse.data(), uce.data());
    const float inv_v = 1.0f / static_cast<float>(d.V);
#pragma omp parallel for schedule(static) if (static_cast<long>(n) * d.V > 16384)
    for (int r = 0; r < n; ++r) {
      // dz_c = g_lp (1[c=y] - p_c) - g_ent p_c (log p_c + H) + g_u (p_c - 1/V); dlogits = dz / τ.
      const float gl = dlogprobs[rr[r] + 1], ge = dentropy[rr[r] + 1], gu = duniform ? duniform[rr[r] + 1] : 0.0f;
      float* z = logits.data() + static_cast<size_t>(r) * d.V;
      for (int c = 0; c < d.V; ++c) {
        const float logp = z[c] - lse[r];
        const float p = std::exp(logp);
        z[c] = (-gl * p - ge * p * (logp + ent[r]) + gu * (p - inv_v)) * invt;
      }
      z[b.tokens[rr[r] + 1]] += gl * invt;
    }
    matmul_nn(logits.data(), P.lm_head, dxbuf.data(), n, H, d.V, false);
    if (base) matmul_tn(logits.data(), xbuf.data(), G.lm_head, d.V, H, n, true);
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
  std::vector<float> ltmp;            // the adapter's scratch
  for (int l = m.cfg.num_hidden_layers - 1; l >= 0; --l) {
    const LayerPtrs& L = P.layers[l];
    const LayerPtrs& GL = G.layers[l];
    const LayerActs& a = A.layers[l];
    // MLP: x_out = h + down(silu(gate) * up).
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) act[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
    matmul_nn(dx.data(), L.down_proj, dact.data(), T, d.I, H, false);
    if (base) matmul_tn(dx.data(), act.data(), GL.down_proj, H, d.I, T, true);
    lora_back(lora, lora_grads, l, kLoraDown, act.data(), dx.data(), T, d.I, H, dact.data(), ltmp);
#pragma omp parallel for schedule(static) if (act.size() > 16384)
    for (size_t i = 0; i < act.size(); ++i) {
      const float g = a.gate[i], s = sigmoid(g);
      dup[i] = dact[i] * g * s;
      dgate[i] = dact[i] * a.up[i] * s * (1.0f + g * (1.0f - s));
    }
    matmul_nn(dgate.data(), L.gate_proj, dn.data(), T, H, d.I, false);
    matmul_nn(dup.data(), L.up_proj, dn.data(), T, H, d.I, true);
    if (base) {
      matmul_tn(dgate.data(), a.xn2.data(), GL.gate_proj, d.I, H, T, true);
      matmul_tn(dup.data(), a.xn2.data(), GL.up_proj, d.I, H, T, true);
    }
    lora_back(lora, lora_grads, l, kLoraGate, a.xn2.data(), dgate.data(), T, H, d.I, dn.data(), ltmp);
    lora_back(lora, lora_grads, l, kLoraUp, a.xn2.data(), dup.data(), T, H, d.I, dn.data(), ltmp);
    dh = dx;
    rmsnorm_bwd(dn.data(), a.h.data(), a.rstd2.data(), L.post_attention_layernorm, GL.post_attention_layernorm, dh.data(),
                T, H, true);
    // Attention: h = x_in + o_proj(att).
    matmul_nn(dh.data(), L.o_proj, datt.data(), T, d.Q, H, false);
    if (base) matmul_tn(dh.data(), a.att.data(), GL.o_proj, H, d.Q, T, true);
    if (GL.o_bias) bias_grad(dh.data(), GL.o_bias, T, H);
    lora_back(lora, lora_grads, l, kLoraO, a.att.data(), dh.data(), T, d.Q, H, datt.data(), ltmp);
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
    if (base) {
      matmul_tn(dq.data(), a.xn1.data(), GL.q_proj, d.Q, H, T, true);
      matmul_tn(dk.data(), a.xn1.data(), GL.k_proj, d.KV, H, T, true);
      matmul_tn(dv.data(), a.xn1.data(), GL.v_proj, d.KV, H, T, true);
    }
    lora_back(lora, lora_grads, l, kLoraQ, a.xn1.data(), dq.data(), T, H, d.Q, dn.data(), ltmp);
    lora_back(lora, lora_grads, l, kLoraK, a.xn1.data(), dk.data(), T, H, d.KV, dn.data(), ltmp);
    lora_back(lora, lora_grads, l, kLoraV, a.xn1.data(), dv.data(), T, H, d.KV, dn.data(), ltmp);
    dx = dh;
    rmsnorm_bwd(dn.data(), a.x_in.data(), a.rstd1.data(), L.input_layernorm, GL.input_layernorm, dx.data(), T, H, true);
  }
  for (int t = 0; base && t < T; ++t) {
    float* g = G.embed_tokens + static_cast<size_t>(b.tokens[t]) * H;
    const float* s = dx.data() + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; ++i) g[i] += s[i];
  }
}

}  // namespace ooze
