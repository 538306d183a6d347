// Reference matrix multiplication for the native kernels (native/src/kernels.h): plain loops with
// float64 accumulation, plus the per-element error scale Σ_k |a·b| that tolerances are stated in.

/** Which operand is transposed: nt C=A·Bᵀ (B is [N,K]), nn C=A·B (B is [K,N]), tn C=Aᵀ·B (A is [K,M]). */
export type MatmulKind = "nt" | "nn" | "tn";

/** Flat-index strides of op(A)(i, k) and op(B)(k, j) for a kind: index = i·ai + k·ak, k·bk + j·bj. */
function strides(kind: MatmulKind, M: number, N: number, K: number) {
  return {
    ai: kind === "tn" ? 1 : K,
    ak: kind === "tn" ? M : 1,
    bk: kind === "nt" ? 1 : N,
    bj: kind === "nt" ? K : 1,
  };
}

/**
 * C[M,N] (+)= op(A)·op(B) in float64, rounded to float32 once. Returns `scale`, Σ_k |A(i,k)·B(k,j)|
 * per element of C: the natural yardstick for rounding error of a length-K dot product.
 */
export function matmulRef(
  kind: MatmulKind,
  A: Float32Array,
  B: Float32Array,
  C: Float32Array,
  M: number,
  N: number,
  K: number,
  accumulate: boolean,
): Float64Array {
  const { ai, ak, bk, bj } = strides(kind, M, N, K);
  const scale = new Float64Array(M * N);
  for (let i = 0; i < M; i++) {
    for (let j = 0; j < N; j++) {
      let s = 0;
      let m = 0;
      let pa = i * ai;
      let pb = j * bj;
      for (let k = 0; k < K; k++, pa += ak, pb += bk) {
        const p = A[pa]! * B[pb]!;
        s += p;
        m += Math.abs(p);
      }
      const c = i * N + j;
      if (accumulate) {
        m += Math.abs(C[c]!);
        s += C[c]!;
      }
      C[c] = s;
      scale[c] = m;
    }
  }
  return scale;
}
