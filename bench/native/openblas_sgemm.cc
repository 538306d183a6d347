// Baseline for bench/native.ts: times OpenBLAS cblas_sgemm on shapes read from stdin, one request
// per line "KIND M N K SECONDS [COPIES [ROUNDS]]" (KIND nt|nn|tn, same meaning as ooze's matmul),
// answering one line "SECONDS_PER_CALL CPU_SECONDS_PER_CALL": means over a window of at least SECONDS
// after one warm-up call, the best of ROUNDS (default 1) windows each; the second is this process's CPU
// time, which other busy processes do not inflate. With COPIES > 1 the calls cycle through that many
// distinct A, B, C buffers, so that operands come from memory as they do in a model step, where every
// layer has its own weights. Threads: OPENBLAS_NUM_THREADS. Build: g++ -O2 openblas_sgemm.cc -lopenblas.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  char line[256];
  char kind[8];
  int M, N, K, copies, rounds;
  double window;
  while (std::fgets(line, sizeof line, stdin)) {
    copies = 1, rounds = 1;
    if (std::sscanf(line, "%7s %d %d %d %lf %d %d", kind, &M, &N, &K, &window, &copies, &rounds) < 5) break;
    if (copies < 1) copies = 1;
    if (rounds < 1) rounds = 1;
    struct Set {
      std::vector<float> A, B, C;
    };
    std::vector<Set> sets(copies);
    for (int s = 0; s < copies; ++s) {
      Set& o = sets[s];
      o.A.resize((size_t)M * K), o.B.resize((size_t)N * K), o.C.assign((size_t)M * N, 0.0f);
      for (size_t i = 0; i < o.A.size(); ++i) o.A[i] = (float)((i * 7919 + s) % 1000) / 1000.0f - 0.5f;
      for (size_t i = 0; i < o.B.size(); ++i) o.B[i] = (float)((i * 104729 + s) % 1000) / 1000.0f - 0.5f;
    }
    int next = 0;
    auto call = [&] {
      Set& o = sets[next];
      next = (next + 1) % copies;
      if (std::strcmp(kind, "nt") == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, o.A.data(), K, o.B.data(), K,
                    0.0f, o.C.data(), N);
      } else if (std::strcmp(kind, "nn") == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, o.A.data(), K, o.B.data(), N,
                    0.0f, o.C.data(), N);
      } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, o.A.data(), M, o.B.data(), N,
                    0.0f, o.C.data(), N);
      }
    };
    call();
    using clock = std::chrono::steady_clock;
    auto cpu_now = [] {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return ts.tv_sec + ts.tv_nsec * 1e-9;
    };
    double best = 1e300, best_cpu = 1e300;
    for (int r = 0; r < rounds; ++r) {
      const double c0 = cpu_now();
      const auto t0 = clock::now();
      long calls = 0;
      double dt = 0;
      do {
        call();
        ++calls;
        dt = std::chrono::duration<double>(clock::now() - t0).count();
      } while (dt < window);
      best = std::min(best, dt / calls);
      best_cpu = std::min(best_cpu, (cpu_now() - c0) / calls);
    }
    std::printf("%.9g %.9g\n", best, best_cpu);
    std::fflush(stdout);
  }
  return 0;
}
