// Test runner configuration: real servers and child processes make tests slower than unit tests
// usually are, so timeouts are generous. Files run in parallel: at least two at a time, since most of
// a file's time is spent waiting on its child processes (servers, engines, workers, jobs), and the
// slowest files start first (test/sequencer.ts), so that no long file is left to run alone at the end.
import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";
import { SlowFirst } from "./test/sequencer.ts";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    // vitest's own default is one fewer than the cores: a single file at a time on two cores
    maxWorkers: Math.max(2, availableParallelism() - 1),
    sequence: { sequencer: SlowFirst },
    reporters: ["default"],
  },
});
