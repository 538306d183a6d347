// Vector helpers for the attention loops of inference and training (AVX2/FMA, which the build
// targets: -march=x86-64-v3). Results are deterministic; a dot product sums in a fixed order that
// differs from a sequential sum by fp32 rounding only, and weighted_rows adds its terms in row order.
#pragma once
#include <immintrin.h>

namespace ooze {

/** The sum of a vector's eight lanes. */
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/** Σ a[i]·b[i], i < n: four independent 8-lane partial sums, then the tail. */
inline float dot(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/** The largest of x[0..n), n >= 1 (exact, as a sequential max; NaNs are not expected). */
inline float max_of(const float* x, int n) {
  __m256 m0 = _mm256_set1_ps(x[0]), m1 = m0, m2 = m0, m3 = m0;
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float m = lanes[0];
  for (int j = 1; j < 8; ++j) m = lanes[j] > m ? lanes[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

/**
 * out[d] = Σ_t w[t]·rows[t][d] for d < dim, t < n, added in t order (as a loop of out += w·row
 * would), with out held in registers 64 lanes at a time.
 */
inline void weighted_rows(const float* const* rows, const float* w, int n, int dim, float* out) {
  int d = 0;
  for (; d + 64 <= dim; d += 64) {
    __m256 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
    for (int t = 0; t < n; ++t) {
      const __m256 wt = _mm256_set1_ps(w[t]);
      const float* r = rows[t] + d;
      for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(r + 8 * j), a[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + d + 8 * j, a[j]);
  }
  for (; d + 8 <= dim; d += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int t = 0; t < n; ++t) a = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), _mm256_loadu_ps(rows[t] + d), a);
    _mm256_storeu_ps(out + d, a);
  }
  for (; d < dim; ++d) {
    float a = 0;
    for (int t = 0; t < n; ++t) a += w[t] * rows[t][d];
    out[d] = a;
  }
}

}  // namespace ooze
