// Shared checks for the gemm tests: runs the native matmul and the reference on one shape and
// reports the first differing values. Tolerance: |native − ref| ≤ 1e-5 · Σ_k|a·b| + 1e-30 per element.
import { loadNative } from "../../native/load.ts";
import { matmulRef, type MatmulKind } from "../../native/reference/gemm.ts";

/** Relative tolerance against Σ_k |a·b| (fp32 accumulation over K ≤ ~3000 stays well inside). */
export const RTOL = 1e-5;

/** Deterministic uniform [-1, 1) floats (mulberry32). */
export function randomArray(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = ((t ^ (t >>> 14)) >>> 0) / 2147483648 - 1;
  }
  return out;
}

/** Compares native vs reference for one shape; returns "" or a description of the first mismatches. */
export function checkShape(kind: MatmulKind, M: number, N: number, K: number, accumulate: boolean): string {
  const { matmul } = loadNative();
  const seed = M * 1_000_003 + N * 1009 + K * 7 + (accumulate ? 1 : 0);
  const A = randomArray(M * K, seed);
  const B = randomArray(N * K, seed + 1);
  const C0 = accumulate ? randomArray(M * N, seed + 2) : new Float32Array(M * N).fill(Number.NaN);
  const got = C0.slice();
  const want = C0.slice();
  matmul(kind, A, B, got, M, N, K, accumulate);
  const scale = matmulRef(kind, A, B, want, M, N, K, accumulate);
  const bad: string[] = [];
  let count = 0;
  for (let i = 0; i < M * N; i++) {
    const tol = RTOL * scale[i]! + 1e-30;
    const diff = Math.abs(got[i]! - want[i]!);
    if (!(diff <= tol)) {
      count++;
      if (bad.length < 5) {
        bad.push(`C[${Math.floor(i / N)},${i % N}] native ${got[i]} ref ${want[i]} (|diff| ${diff.toExponential(2)} > tol ${tol.toExponential(2)})`);
      }
    }
  }
  if (count === 0) return "";
  return `${kind} M=${M} N=${N} K=${K} accumulate=${accumulate}: ${count} of ${M * N} differ; first: ${bad.join("; ")}`;
}
