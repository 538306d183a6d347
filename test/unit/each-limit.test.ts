// eachLimit (src/each-limit.ts): every item once, never more than the limit in flight, and a failure
// thrown only after every call ran.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { eachLimit } from "../../src/each-limit.ts";

describe("eachLimit", () => {
  it("calls every item once, at most `limit` at once", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.nat(3), { maxLength: 40 }), fc.integer({ min: 1, max: 8 }), async (delays, limit) => {
        let running = 0;
        let most = 0;
        const seen: number[] = [];
        await eachLimit(delays.keys(), limit, async (i) => {
          running++;
          most = Math.max(most, running);
          await new Promise((r) => setTimeout(r, delays[i]));
          seen.push(i);
          running--;
        });
        expect(seen.sort((a, b) => a - b)).toEqual([...delays.keys()]);
        expect(most).toBeLessThanOrEqual(limit);
        if (delays.length >= limit) expect(most).toBe(limit);
      }),
      { numRuns: 30 },
    );
  });

  it("runs every call even when one fails, then throws the first failure", async () => {
    const done: number[] = [];
    const run = eachLimit([0, 1, 2, 3, 4], 2, async (i) => {
      await new Promise((r) => setTimeout(r, 1));
      if (i === 1 || i === 3) throw new Error(`item ${i}`);
      done.push(i);
    });
    await expect(run).rejects.toThrow("item 1");
    expect(done.sort()).toEqual([0, 2, 4]);
  });
});
