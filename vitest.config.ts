// Test runner configuration: real servers and child processes make tests slower than unit tests
// usually are, so timeouts are generous. Files run in parallel, at least three at a time (vitest's
// own default is one fewer than the cores: one on two cores, where two finish the suite in about 60 %
// of the time, and three 4 % sooner than two, since many tests wait on timers, elections and
// children), the slowest files first (test/sequencer.ts), so that no long file is left to run alone
// at the end. Test files share one process per worker (isolate: false): a fresh process per file cost
// about 0.6 s of imports each (71 s of the suite's import time, 20 s shared). Each file starts and
// stops its own servers and children and restores what it changes in the process (environment
// variables); ISOLATED lists the files that cannot share.
// docs/reliability.md, "The suite's wall time".
import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";
import { SlowFirst } from "./test/sequencer.ts";

/** Files that need a process of their own: gemm-avx2 sets OOZE_NO_AVX512 before the addon loads. */
const ISOLATED = ["test/native/gemm-avx2.test.ts"];

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: Math.max(3, availableParallelism() - 1),
    sequence: { sequencer: SlowFirst },
    reporters: ["default"],
    projects: [
      { extends: true, test: { name: "shared", include: ["test/**/*.test.ts"], exclude: ISOLATED, isolate: false } },
      { extends: true, test: { name: "isolated", include: ISOLATED } },
    ],
  },
});
