// The fleet's adaptive progress deadline (src/engine/fleet/retry.ts) keeps the slowest of the last 64
// dispatch durations as they come and go, instead of taking the maximum at each ask; it must give
// what taking the maximum gives, for any sequence of durations.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ProgressDeadlines, type RetrySettings } from "../../src/engine/fleet/retry.ts";

const settings: RetrySettings = {
  progressTimeoutMs: 1e9, progressTimeoutPerTokenMs: 0, minProgressTimeoutMs: 0, maxDispatchMs: Infinity, maxStreamIdleMs: Infinity,
  retryBaseMs: 1, retryMaxMs: 1, random: () => 0.5,
};

describe("ProgressDeadlines", () => {
  it("adapts to 4 × the slowest of the last 64 dispatches, as a maximum over them would", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 10_000 }), { minLength: 8, maxLength: 300 }), (durations) => {
        const d = new ProgressDeadlines(settings);
        durations.forEach((ms, i) => {
          d.observe(ms);
          if (i + 1 >= 8) expect(d.dispatchMs(16, 0)).toBe(4 * Math.max(...durations.slice(Math.max(0, i + 1 - 64), i + 1)));
        });
      }),
      { numRuns: 200 },
    );
  });
});
