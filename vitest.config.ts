// Test runner configuration: real servers and child processes make tests slower than unit tests
// usually are, so timeouts are generous. Files run in parallel, at least two at a time (vitest's own
// default is one fewer than the cores: one on two cores, where two finish the suite in about 60 % of
// the time), the slowest files first (test/sequencer.ts), so that no long file is left to run alone
// at the end. The unit tests and the native addon's in-process tests share one process per worker
// (SHARED); every other file gets a process of its own.
// docs/reliability.md, "The suite's wall time".
import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";
import { SlowFirst } from "./test/sequencer.ts";

/**
 * Files that share one process per worker: they start no child process and change no process-wide
 * state (environment variables read at load, the addon's settings), so a fresh process per file —
 * about 0.6 s each — bought nothing. Not gemm-avx2.test.ts: it sets OOZE_NO_AVX512 before the addon loads.
 */
const SHARED = [
  "test/unit/**/*.test.ts",
  ...["critic", "engine-backend", "engine-lora", "engine", "gemm-threads", "gemm", "lora", "loss", "model-hf", "model-init", "model-rope", "optim", "radix-cache", "train-long", "train", "variable-batch", "worker-protocol"].map((f) => `test/native/${f}.test.ts`),
];

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: Math.max(2, availableParallelism() - 1),
    sequence: { sequencer: SlowFirst },
    reporters: ["default"],
    projects: [
      { extends: true, test: { name: "shared", include: SHARED, isolate: false } },
      { extends: true, test: { name: "processes", include: ["test/**/*.test.ts"], exclude: SHARED } },
    ],
  },
});
