// Concurrent matmul calls from several JS threads (worker_threads, each loading the addon) share the
// kernels' helper team: every result must equal the single-threaded result bit for bit.
import { existsSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { describe, expect, it } from "vitest";
import { addonCandidates, loadNative } from "../../native/load.ts";
import { randomArray } from "./gemm-check.ts";

const M = 100, N = 700, K = 250; // above the threading threshold; splits by columns
const workerCode = `
const { parentPort, workerData } = require("node:worker_threads");
const addon = require(workerData.path);
const { A, B, M, N, K, reps, kind } = workerData;
const C = new Float32Array(M * N);
const sums = [];
for (let r = 0; r < reps; r++) {
  addon.matmul(kind, A, B, C, M, N, K, false);
  sums.push(Buffer.from(C.buffer).toString("base64"));
}
parentPort.postMessage(sums);
`;

function runWorker(path: string, kind: string, A: Float32Array, B: Float32Array): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const w = new Worker(workerCode, { eval: true, workerData: { path, A, B, M, N, K, reps: 15, kind } });
    w.once("message", (m: string[]) => resolve(m));
    w.once("error", reject);
    w.once("exit", (code) => (code === 0 ? undefined : reject(new Error(`worker exited with ${code}`))));
  });
}

describe("matmul from concurrent threads", () => {
  it("gives the single-threaded result bit for bit in every thread", async () => {
    const native = loadNative();
    const path = addonCandidates().find((p) => existsSync(p))!;
    for (const kind of ["nt", "tn"] as const) {
      const A = randomArray(M * K, 11);
      const B = randomArray(N * K, 12);
      const before = native.gemmThreads();
      native.gemmThreads(1);
      const want = new Float32Array(M * N);
      native.matmul(kind, A, B, want, M, N, K, false);
      native.gemmThreads(before);
      const wantB64 = Buffer.from(want.buffer).toString("base64");
      const results = await Promise.all([0, 1, 2].map(() => runWorker(path, kind, A, B)));
      const bad = results.flat().filter((r) => r !== wantB64).length;
      expect(bad, `${kind}: results that differ from the single-threaded one`).toBe(0);
    }
  });
});
