import { describe, expect, it } from "vitest";
import { SampleBuilder, sampleProblem } from "../../src/sample.ts";

describe("SampleBuilder", () => {
  it("keeps tokens, mask, logprobs and version spans aligned across turns", () => {
    const b = new SampleBuilder(7, 3, "ep-1", "guess", [256, 10, 11]);
    b.appendModel([1, 2], [-0.5, -0.25], "1");
    b.appendEnv([40, 41, 42]);
    b.appendModel([3], [-1], "1");
    b.appendModel([4, 5], [-2, -3], "2"); // weight update mid-episode (partial rollout)
    const s = b.build(1, "completed");
    expect(Array.from(s.tokens)).toEqual([256, 10, 11, 1, 2, 40, 41, 42, 3, 4, 5]);
    expect(s.responseLength).toBe(8);
    expect(Array.from(s.lossMask)).toEqual([1, 1, 0, 0, 0, 1, 1, 1]);
    expect(Array.from(s.rolloutLogprobs)).toEqual([-0.5, -0.25, 0, 0, 0, -1, -2, -3]);
    expect(s.weightVersions).toEqual([
      { start: 0, end: 2, version: "1" },
      { start: 5, end: 6, version: "1" },
      { start: 6, end: 8, version: "2" },
    ]);
    expect(sampleProblem(s)).toBeNull();
  });

  it("merges adjacent spans of one version and grows past its initial capacity", () => {
    const b = new SampleBuilder(0, 0, "r", null, [1]);
    for (let i = 0; i < 500; i++) b.appendModel([i % 256], [-0.1], "v");
    const s = b.build(0, "truncated");
    expect(s.weightVersions).toEqual([{ start: 0, end: 500, version: "v" }]);
    expect(s.tokens.length).toBe(501);
    expect(b.modelTokens).toBe(500);
  });

  it("rejects misaligned appends and detects broken samples", () => {
    const b = new SampleBuilder(0, 0, "r", null, [1]);
    expect(() => b.appendModel([1, 2], [-1], "v")).toThrow(/2 ids but 1 logprobs/);
    const s = b.build(null, "failed");
    expect(sampleProblem({ ...s, lossMask: new Uint8Array(3) })).toMatch(/lossMask/);
  });
});
