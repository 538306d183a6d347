// Dense kernels shared by inference and training. One interface so a CUDA backend can provide the
// same functions later. All matrices are row-major fp32. Implementations use every core (OpenMP).
#pragma once
#include <cstddef>

namespace ooze {

/** C[M,N] (+)= A[M,K] · B[N,K]ᵀ  — a Linear layer y = x·Wᵀ with HF's [out,in] weight layout. */
void matmul_nt(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate);

/** C[M,N] (+)= A[M,K] · B[K,N]  — e.g. dx = dy · W. */
void matmul_nn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate);

/** C[M,N] (+)= A[K,M]ᵀ · B[K,N]  — e.g. dW = dyᵀ · x. */
void matmul_tn(const float* A, const float* B, float* C, int M, int N, int K, bool accumulate);

}  // namespace ooze
