// Test runner configuration: real servers and child processes make tests slower than unit tests
// usually are, so timeouts are generous; files run in parallel across the machine's cores.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    reporters: process.env.CI ? ["default"] : ["default"],
  },
});
