// Matrix multiplication kernels (see kernels.h). Straightforward OpenMP loops; the inner loops are
// contiguous so the compiler vectorises them.
#include <cstring>
#include <vector>

#include "kernels.h"

namespace ooze {

void matmul_nt(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
#pragma omp parallel for collapse(2) schedule(static) if ((long)M * N * K > 32768)
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      const float* a = A + (size_t)i * K;
      const float* b = B + (size_t)j * K;
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += a[k] * b[k];
      float* c = C + (size_t)i * N + j;
      *c = accumulate ? *c + s : s;
    }
  }
}

void matmul_nn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
#pragma omp parallel for schedule(static) if ((long)M * N * K > 32768)
  for (int i = 0; i < M; ++i) {
    float* c = C + (size_t)i * N;
    if (!accumulate) std::memset(c, 0, sizeof(float) * N);
    for (int k = 0; k < K; ++k) {
      const float a = A[(size_t)i * K + k];
      const float* b = B + (size_t)k * N;
      for (int j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

void matmul_tn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate) {
#pragma omp parallel for schedule(static) if ((long)M * N * K > 32768)
  for (int i = 0; i < M; ++i) {
    float* c = C + (size_t)i * N;
    if (!accumulate) std::memset(c, 0, sizeof(float) * N);
    for (int k = 0; k < K; ++k) {
      const float a = A[(size_t)k * M + i];
      const float* b = B + (size_t)k * N;
      for (int j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

}  // namespace ooze
