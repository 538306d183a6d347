// Matrix multiplication kernels (see kernels.h). One packed driver serves nt, nn and tn through
// strided views of A and B: K/N cache blocking, A and B packed into micro-panels, a register-blocked
// FMA micro-kernel (AVX2 6x16; AVX-512 12x32 chosen at run time when the CPU has it), OpenMP threads
// each owning a slab of C's rows or columns. Skinny M (decode, M <= 8) takes a streaming gemv path
// that reads B once.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "kernels.h"

namespace ooze {
namespace {

/** A read-only strided matrix view: element (r, c) is p[r*rs + c*cs]. */
struct View {
  const float* p;
  long rs;
  long cs;
};

constexpr int KC = 256;   // depth of a packed block
constexpr int NC = 3072;  // columns of a packed B block
// Below this many multiply-adds (about 0.3 ms on one core) one thread: waking a team costs more,
// and far more when the cores are shared with other busy processes.
constexpr long kParallelFlops = 1L << 24;

/** Threads to use for m*n*k multiply-adds. */
int threads_for(long m, long n, long k) {
  return m * n * k < kParallelFlops ? 1 : omp_get_max_threads();
}

/**
 * A small team of helper threads for the kernels, used instead of an OpenMP parallel region so
 * that a helper that is slow to wake (cores shared with other busy processes) never holds up the
 * caller: work is split into chunks claimed from an atomic counter, the caller starts at once and
 * takes whatever no helper has claimed, and it waits only for chunks a helper is running. Helpers
 * spin ~50 µs after a job, then sleep. One job at a time; a concurrent caller runs its chunks alone.
 */
class Team {
 public:
  static Team& get() {
    static Team* team = new Team();  // never destroyed: helpers are detached and outlive statics
    return *team;
  }

  /** Runs fn(c) for every c in [0, n) on the caller plus up to threads-1 helpers. */
  void run(int threads, int n, const std::function<void(int)>& fn) {
    if (threads <= 1 || n <= 1 || !run_mu_.try_lock()) {
      for (int c = 0; c < n; ++c) fn(c);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_, std::adopt_lock);
    {
      std::lock_guard<std::mutex> lk(mu_);
      while ((int)helpers_ < threads - 1) {
        std::thread(&Team::helper, this).detach();
        ++helpers_;
      }
      fn_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      slots_ = threads - 1;
      open_ = true;
      gen_.fetch_add(1, std::memory_order_release);
      if (sleepers_ > 0) cv_.notify_all();
    }
    std::exception_ptr err;
    try {
      for (int c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < n;) fn(c);
    } catch (...) {
      err = std::current_exception();
      next_.store(n, std::memory_order_relaxed);  // no more claims
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = false;  // helpers that have not joined yet will not
    }
    for (int spins = 0; active_.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < 4096) _mm_pause();
      else std::this_thread::yield();  // a helper was descheduled mid-chunk
    }
    if (!err && helper_failed_.exchange(false)) {
      err = std::make_exception_ptr(std::runtime_error("a gemm helper thread failed (out of memory?)"));
    }
    if (err) std::rethrow_exception(err);
  }

 private:
  void helper() {
    uint64_t seen = gen_.load(std::memory_order_acquire);
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      while (gen_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(50)) {
        for (int i = 0; i < 16; ++i) _mm_pause();
      }
      std::unique_lock<std::mutex> lk(mu_);
      if (gen_.load(std::memory_order_relaxed) == seen) {
        ++sleepers_;
        cv_.wait(lk, [&] { return gen_.load(std::memory_order_relaxed) != seen; });
        --sleepers_;
      }
      seen = gen_.load(std::memory_order_relaxed);
      if (!open_ || slots_ == 0) continue;
      --slots_;
      active_.fetch_add(1, std::memory_order_acq_rel);
      const std::function<void(int)>* fn = fn_;
      const int n = n_;
      lk.unlock();
      try {
        for (int c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < n;) (*fn)(c);
      } catch (...) {
        helper_failed_.store(true);
        next_.store(n, std::memory_order_relaxed);
      }
      active_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::mutex run_mu_;  // held by the caller running a job
  std::mutex mu_;      // guards the fields below except the atomics
  std::condition_variable cv_;
  size_t helpers_ = 0;
  const std::function<void(int)>* fn_ = nullptr;
  int n_ = 0;
  int slots_ = 0;  // helpers still allowed to join the current job
  bool open_ = false;
  int sleepers_ = 0;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> next_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> helper_failed_{false};
};

/** Runs fn(c), c in [0, n), with `threads` threads (the caller included). */
void parallel_chunks(int threads, int n, const std::function<void(int)>& fn) {
  Team::get().run(threads, n, fn);
}

/** A growable 64-byte aligned scratch buffer, one per calling thread and role. */
struct Scratch {
  float* p = nullptr;
  size_t cap = 0;
  float* get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = std::max(n, cap * 2);
      p = static_cast<float*>(std::aligned_alloc(64, ((cap * sizeof(float) + 63) / 64) * 64));
      if (!p) throw std::bad_alloc();
    }
    return p;
  }
  ~Scratch() { std::free(p); }
};

// ---- packing ------------------------------------------------------------------------------------

/** Packs rows [i0, i0+mr) x depth [k0, k0+kc) of A into MR-row micro-panel order, zero padded. */
template <int MR>
void pack_a(View A, int i0, int mr, int k0, int kc, float* dst) {
  if (A.rs == 1) {  // tn: a column of A (fixed k) is contiguous over rows
    for (int k = 0; k < kc; ++k) {
      const float* src = A.p + (long)(k0 + k) * A.cs + i0;
      float* d = dst + (long)k * MR;
      int r = 0;
      for (; r < mr; ++r) d[r] = src[r];
      for (; r < MR; ++r) d[r] = 0.0f;
    }
    return;
  }
  const float* rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = A.p + (long)(i0 + std::min(r, mr - 1)) * A.rs + (long)k0 * A.cs;
  if (mr == MR && A.cs == 1) {
    // Rows in groups of 4: 4x4 blocks transposed in registers; leftover rows and k one by one.
    constexpr int R4 = MR / 4 * 4;
    const int k4 = kc / 4 * 4;
    for (int r = 0; r < R4; r += 4) {
      for (int k = 0; k < k4; k += 4) {
        __m128 x0 = _mm_loadu_ps(rows[r] + k), x1 = _mm_loadu_ps(rows[r + 1] + k);
        __m128 x2 = _mm_loadu_ps(rows[r + 2] + k), x3 = _mm_loadu_ps(rows[r + 3] + k);
        _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
        float* d = dst + (long)k * MR + r;
        _mm_storeu_ps(d, x0);
        _mm_storeu_ps(d + MR, x1);
        _mm_storeu_ps(d + 2 * MR, x2);
        _mm_storeu_ps(d + 3 * MR, x3);
      }
      for (int k = k4; k < kc; ++k)
        for (int q = r; q < r + 4; ++q) dst[(long)k * MR + q] = rows[q][k];
    }
    for (int k = 0; k < kc; ++k)
      for (int r = R4; r < MR; ++r) dst[(long)k * MR + r] = rows[r][k];
    return;
  }
  for (int k = 0; k < kc; ++k)
    for (int r = 0; r < MR; ++r) dst[(long)k * MR + r] = r < mr ? rows[r][(long)k * A.cs] : 0.0f;
}

/** Packs depth [k0, k0+kc) x columns [j0, j0+nr) of B into NR-column micro-panel order. */
template <int NR>
void pack_b(View B, int k0, int kc, int j0, int nr, float* dst) {
  if (B.cs == 1) {  // nn/tn: a row of B (fixed k) is contiguous over columns
    for (int k = 0; k < kc; ++k) {
      const float* src = B.p + (long)(k0 + k) * B.rs + j0;
      float* d = dst + (long)k * NR;
      if (nr == NR) {
        std::memcpy(d, src, sizeof(float) * NR);
      } else {
        int c = 0;
        for (; c < nr; ++c) d[c] = src[c];
        for (; c < NR; ++c) d[c] = 0.0f;
      }
    }
    return;
  }
  // nt: B(k, j) = Bt[j][k]; read each column's k-run contiguously, 8 columns at a time.
  for (int c0 = 0; c0 < NR; c0 += 8) {
    const float* cols[8];
    for (int c = 0; c < 8; ++c)
      cols[c] = B.p + (long)(j0 + std::min(c0 + c, nr - 1)) * B.cs + (long)k0 * B.rs;
    if (c0 + 8 <= nr && B.rs == 1) {
      int k = 0;
      for (; k + 8 <= kc; k += 8) {  // 8x8 transpose in registers
        __m256 r0 = _mm256_loadu_ps(cols[0] + k), r1 = _mm256_loadu_ps(cols[1] + k);
        __m256 r2 = _mm256_loadu_ps(cols[2] + k), r3 = _mm256_loadu_ps(cols[3] + k);
        __m256 r4 = _mm256_loadu_ps(cols[4] + k), r5 = _mm256_loadu_ps(cols[5] + k);
        __m256 r6 = _mm256_loadu_ps(cols[6] + k), r7 = _mm256_loadu_ps(cols[7] + k);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* d = dst + (long)k * NR + c0;
        _mm256_storeu_ps(d + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(d + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(d + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(d + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(d + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(d + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(d + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(d + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
      for (; k < kc; ++k)
        for (int c = 0; c < 8; ++c) dst[(long)k * NR + c0 + c] = cols[c][k];
    } else {
      for (int k = 0; k < kc; ++k)
        for (int c = 0; c < 8; ++c)
          dst[(long)k * NR + c0 + c] = c0 + c < nr ? cols[c][(long)k * B.rs] : 0.0f;
    }
  }
}

// ---- micro-kernels: C[MR,NR] (+)= Apanel[kc,MR]ᵀ-ish · Bpanel[kc,NR] ------------------------------

/** AVX2/FMA 6x16: 12 accumulators, 2 B vectors, 1 broadcast. */
void kernel_6x16(int kc, const float* a, const float* b, float* c, long ldc, bool add) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    __m256 x;
    x = _mm256_broadcast_ss(a + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    a += 6;
    b += 16;
  }
  const __m256 acc[12] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  for (int r = 0; r < 6; ++r) {
    float* row = c + r * ldc;
    __m256 v0 = acc[2 * r], v1 = acc[2 * r + 1];
    if (add) {
      v0 = _mm256_add_ps(v0, _mm256_loadu_ps(row));
      v1 = _mm256_add_ps(v1, _mm256_loadu_ps(row + 8));
    }
    _mm256_storeu_ps(row, v0);
    _mm256_storeu_ps(row + 8, v1);
  }
}

/** AVX-512 12x32: 24 accumulators, 2 B vectors, 1 broadcast. Used only when the CPU has AVX-512F. */
__attribute__((target("avx512f"))) void kernel_12x32(int kc, const float* a, const float* b,
                                                      float* c, long ldc, bool add) {
  __m512 acc[12][2];
  for (int r = 0; r < 12; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r) {
      const __m512 x = _mm512_set1_ps(a[r]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
    a += 12;
    b += 32;
  }
#pragma GCC unroll 12
  for (int r = 0; r < 12; ++r) {
    float* row = c + r * ldc;
    __m512 v0 = acc[r][0], v1 = acc[r][1];
    if (add) {
      v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row));
      v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row + 16));
    }
    _mm512_storeu_ps(row, v0);
    _mm512_storeu_ps(row + 16, v1);
  }
}

using Kernel = void (*)(int, const float*, const float*, float*, long, bool);

/** Runs the micro-kernel on a possibly partial mr x nr tile through a scratch tile. */
template <int MR, int NR>
inline void tile(Kernel kern, int kc, const float* a, const float* b, float* c, long ldc, bool add,
                 int mr, int nr) {
  if (mr == MR && nr == NR) {
    kern(kc, a, b, c, ldc, add);
    return;
  }
  alignas(64) float t[MR * NR];
  kern(kc, a, b, t, NR, false);
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nr; ++j) c[(long)r * ldc + j] = (add ? c[(long)r * ldc + j] : 0.0f) + t[r * NR + j];
}

// ---- the packed driver --------------------------------------------------------------------------

/**
 * One thread's share: C[M,N] (ldc) (+)= op(A)·op(B) for views already offset to the block. BLIS
 * loop order: N in NC blocks, K in KC blocks (pack B: kc x nc), M in MC blocks (pack A: mc x kc, in
 * L2), then NR column panels (in L1) x MR row panels through the micro-kernel.
 */
template <int MR, int NR>
void gemm_block(Kernel kern, View A, View B, float* C, long ldc, int M, int N, int K, bool accumulate) {
  constexpr int MC = 144;  // rows of A per L2 block (a multiple of MR)
  static_assert(MC % MR == 0, "MC must be a multiple of MR");
  static thread_local Scratch sa, sb;
  float* pa = sa.get((size_t)MC * KC);
  float* pb = sb.get((size_t)((std::min(N, NC) + NR - 1) / NR * NR) * KC);
  for (int jc = 0; jc < N; jc += NC) {
    const int nc = std::min(NC, N - jc);
    for (int pc = 0; pc < K; pc += KC) {
      const int kc = std::min(KC, K - pc);
      const bool add = accumulate || pc > 0;
      for (int jr = 0; jr < nc; jr += NR)
        pack_b<NR>(B, pc, kc, jc + jr, std::min(NR, nc - jr), pb + (long)jr * kc);
      for (int ic = 0; ic < M; ic += MC) {
        const int mc = std::min(MC, M - ic);
        for (int ir = 0; ir < mc; ir += MR)
          pack_a<MR>(A, ic + ir, std::min(MR, mc - ir), pc, kc, pa + (long)ir * kc);
        for (int jr = 0; jr < nc; jr += NR) {
          const int nr = std::min(NR, nc - jr);
          const float* b = pb + (long)jr * kc;
          float* c = C + (long)ic * ldc + jc + jr;
          for (int ir = 0; ir < mc; ir += MR)
            tile<MR, NR>(kern, kc, pa + (long)ir * kc, b, c + (long)ir * ldc, ldc, add,
                         std::min(MR, mc - ir), nr);
        }
      }
    }
  }
}

/**
 * Splits C into slabs of rows (MR panels) or columns (NR panels), whichever divides more evenly,
 * about four per thread; each slab packs its own operands, so threads share nothing but C.
 */
template <int MR, int NR>
void gemm_packed(Kernel kern, View A, View B, float* C, int M, int N, int K, bool accumulate) {
  const int nth = threads_for(M, N, K);
  if (nth <= 1) return gemm_block<MR, NR>(kern, A, B, C, N, M, N, K, accumulate);
  const int mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
  auto waste = [nth](int p) { return (double)((p + nth - 1) / nth * nth) / p; };
  const bool by_cols = np >= nth && waste(np) <= waste(mp);
  const int panels = by_cols ? np : mp;
  const int chunks = std::min(panels, 4 * nth);
  parallel_chunks(nth, chunks, [&](int t) {
    const int p0 = (int)((long)panels * t / chunks), p1 = (int)((long)panels * (t + 1) / chunks);
    if (by_cols) {
      const int j0 = p0 * NR, j1 = std::min(N, p1 * NR);
      if (j1 > j0)
        gemm_block<MR, NR>(kern, A, View{B.p + (long)j0 * B.cs, B.rs, B.cs}, C + j0, N, M, j1 - j0, K,
                           accumulate);
    } else {
      const int i0 = p0 * MR, i1 = std::min(M, p1 * MR);
      if (i1 > i0)
        gemm_block<MR, NR>(kern, View{A.p + (long)i0 * A.rs, A.rs, A.cs}, B, C + (long)i0 * N, N,
                           i1 - i0, N, K, accumulate);
    }
  });
}

// ---- skinny M (decode): stream B once -------------------------------------------------------------

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/** Runs f.template operator()<R>() for R = rows in 1..8 (rows of one pass of a skinny kernel). */
template <typename F>
void by_rows(int rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    case 3: f(std::integral_constant<int, 3>()); break;
    case 4: f(std::integral_constant<int, 4>()); break;
    case 5: f(std::integral_constant<int, 5>()); break;
    case 6: f(std::integral_constant<int, 6>()); break;
    case 7: f(std::integral_constant<int, 7>()); break;
    default: f(std::integral_constant<int, 8>()); break;
  }
}

/** Dot products of R rows of A with B rows [j0, j1): C[r, j] (+)= A_r · B_j. */
template <int R>
void dots(const float* A, const float* B, float* C, int N, int K, int j0, int j1, bool accumulate) {
  for (int j = j0; j < j1; ++j) {
    const float* b = B + (long)j * K;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
      const __m256 bv = _mm256_loadu_ps(b + k);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(A + (long)r * K + k), bv, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[r]);
      for (int kk = k; kk < K; ++kk) s += A[(long)r * K + kk] * b[kk];
      float* c = C + (long)r * N + j;
      *c = accumulate ? *c + s : s;
    }
  }
}

/**
 * nt with few rows: each task takes a block of B rows (kept in L1) through every group of up to
 * 8 rows of A, so B is read from memory once whatever M is.
 */
void skinny_nt(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
  const int jb = std::max(1, std::min(16, (int)(24576 / ((long)K * 4 + 1))));  // B rows per task
  const int tasks = (N + jb - 1) / jb;
  parallel_chunks(threads_for(M, N, K), tasks, [&](int t) {
    const int j0 = t * jb, j1 = std::min(N, j0 + jb);
    for (int i = 0; i < M; i += 8) {
      by_rows(std::min(8, M - i), [&](auto r) {
        dots<decltype(r)::value>(A + (long)i * K, B, C + (long)i * N, N, K, j0, j1, accumulate);
      });
    }
  });
}

/** nn/tn with M == R rows: C[i,:] (+)= Σ_k A(i,k)·B[k,:], 16 columns of C per task in registers. */
template <int R>
void skinny_kn(View A, const float* B, float* C, int N, int K, bool accumulate) {
  const int n16 = N / 16;
  parallel_chunks(threads_for(R, N, K), n16 + 1, [&](int jb) {
    const int j0 = jb * 16;
    const int w = std::min(16, N - j0);
    if (w <= 0) return;
    if (w == 16) {
      __m256 acc[R][2];
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int k = 0; k < K; ++k) {
        const float* b = B + (long)k * N + j0;
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int r = 0; r < R; ++r) {
          const __m256 x = _mm256_set1_ps(A.p[(long)r * A.rs + (long)k * A.cs]);
          acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
      }
      for (int r = 0; r < R; ++r) {
        float* c = C + (long)r * N + j0;
        if (accumulate) {
          acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(c));
          acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(c + 8));
        }
        _mm256_storeu_ps(c, acc[r][0]);
        _mm256_storeu_ps(c + 8, acc[r][1]);
      }
    } else {
      float acc[R][16] = {};
      for (int k = 0; k < K; ++k) {
        const float* b = B + (long)k * N + j0;
        for (int r = 0; r < R; ++r) {
          const float x = A.p[(long)r * A.rs + (long)k * A.cs];
          for (int j = 0; j < w; ++j) acc[r][j] += x * b[j];
        }
      }
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < w; ++j) {
          float* c = C + (long)r * N + j0 + j;
          *c = accumulate ? *c + acc[r][j] : acc[r][j];
        }
    }
  });
}

constexpr int kSkinnyM = 8;    // nn/tn: rows of C kept in registers
constexpr int kSkinnyNtM = 8;   // nt: up to here streaming B once beats packing it

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && std::getenv("OOZE_NO_AVX512") == nullptr;
  return yes;
}

void zero_or_keep(float* C, int M, int N, bool accumulate) {
  if (!accumulate && M > 0 && N > 0) std::memset(C, 0, sizeof(float) * (size_t)M * N);
}

void gemm(View A, View B, float* C, int M, int N, int K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return zero_or_keep(C, M, N, accumulate);
  if (has_avx512()) {
    gemm_packed<12, 32>(kernel_12x32, A, B, C, M, N, K, accumulate);
  } else {
    gemm_packed<6, 16>(kernel_6x16, A, B, C, M, N, K, accumulate);
  }
}

}  // namespace

/** Which micro-kernel this CPU runs (for benchmarks and logs). */
const char* gemm_kernel_name() { return has_avx512() ? "avx512 12x32" : "avx2 6x16"; }

void matmul_nt(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
  if (M > 0 && M <= kSkinnyNtM && N > 0 && K > 0) return skinny_nt(A, B, C, M, N, K, accumulate);
  gemm(View{A, K, 1}, View{B, 1, K}, C, M, N, K, accumulate);
}

void matmul_nn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
  if (M > 0 && M <= kSkinnyM && N > 0 && K > 0) {
    by_rows(M, [&](auto r) { skinny_kn<decltype(r)::value>(View{A, K, 1}, B, C, N, K, accumulate); });
    return;
  }
  gemm(View{A, K, 1}, View{B, N, 1}, C, M, N, K, accumulate);
}

void matmul_tn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
  if (M > 0 && M <= kSkinnyM && N > 0 && K > 0) {
    by_rows(M, [&](auto r) { skinny_kn<decltype(r)::value>(View{A, 1, M}, B, C, N, K, accumulate); });
    return;
  }
  gemm(View{A, 1, M}, View{B, N, 1}, C, M, N, K, accumulate);
}

}  // namespace ooze
