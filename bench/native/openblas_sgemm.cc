// Baseline for bench/native.ts: times OpenBLAS cblas_sgemm on shapes read from stdin, one request
// per line "KIND M N K SECONDS" (KIND nt|nn|tn, same meaning as ooze's matmul), answering one line
// "SECONDS_PER_CALL" (the mean over a window of at least SECONDS after one warm-up call). Threads:
// OPENBLAS_NUM_THREADS. Build: g++ -O2 openblas_sgemm.cc -lopenblas.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  char kind[8];
  int M, N, K;
  double window;
  while (std::scanf("%7s %d %d %d %lf", kind, &M, &N, &K, &window) == 5) {
    std::vector<float> A((size_t)M * K), B((size_t)N * K), C((size_t)M * N);
    for (size_t i = 0; i < A.size(); ++i) A[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < B.size(); ++i) B[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
    auto call = [&] {
      if (std::strcmp(kind, "nt") == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A.data(), K, B.data(), K,
                    0.0f, C.data(), N);
      } else if (std::strcmp(kind, "nn") == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A.data(), K, B.data(), N,
                    0.0f, C.data(), N);
      } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, A.data(), M, B.data(), N,
                    0.0f, C.data(), N);
      }
    };
    call();
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    long calls = 0;
    double dt = 0;
    do {
      call();
      ++calls;
      dt = std::chrono::duration<double>(clock::now() - t0).count();
    } while (dt < window);
    std::printf("%.9g\n", dt / calls);
    std::fflush(stdout);
  }
  return 0;
}
