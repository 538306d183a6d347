// The simulated engine's serving model: table points give back their own figures, interpolation
// stays between neighbours, the default table matches its calibration, and bad tables are refused
// naming the field.
import { describe, expect, it } from "vitest";
import { decodeStepMs, H100_LLAMA_8B as T, parsePerfTable, prefillMs } from "../../src/engine/sim/perf-model.ts";

describe("sim serving model", () => {
  it("decode step time at the table's points is batch / tokens per second", () => {
    T.decodeBatch.forEach((b, i) =>
      T.decodeContext.forEach((c, j) => expect(decodeStepMs(T, b, c)).toBeCloseTo((b * 1000) / T.decodeTokensPerSecond[i]![j]!, 9)),
    );
  });

  it("between points the step time lies between its neighbours'; beyond the last batch, throughput stays at the plateau", () => {
    const lo = decodeStepMs(T, 32, 512), hi = decodeStepMs(T, 64, 2048), mid = decodeStepMs(T, 48, 1024);
    expect(mid).toBeGreaterThan(lo);
    expect(mid).toBeLessThan(hi);
    const last = T.decodeBatch.at(-1)!;
    expect((2 * last) / decodeStepMs(T, 2 * last, 512)).toBeCloseTo(last / decodeStepMs(T, last, 512), 9);
    expect(prefillMs(T, 0)).toBe(0);
    expect(prefillMs(T, 8192)).toBeCloseTo((8192 * 1000) / 25_000, 9);
  });

  it("the default table: ~16k output tokens/s at 256 short sequences, ~150 for one; KV 400k tokens", () => {
    expect(256 / (decodeStepMs(T, 256, 512) / 1000)).toBeGreaterThan(15_000);
    expect(256 / (decodeStepMs(T, 256, 512) / 1000)).toBeLessThan(17_000);
    expect(1 / (decodeStepMs(T, 1, 512) / 1000)).toBeGreaterThan(140);
    expect(1 / (decodeStepMs(T, 1, 512) / 1000)).toBeLessThan(160);
    expect(T.kvTokens).toBe(400_000);
  });

  it("a bad table is refused with the file and the field", () => {
    expect(() => parsePerfTable({ ...T, decodeBatch: [8, 1] }, "t.json")).toThrow(/t\.json: decodeBatch: must be ascending/);
    expect(() => parsePerfTable({ ...T, decodeTokensPerSecond: [[1]] }, "t.json")).toThrow(/t\.json: decodeTokensPerSecond must have 7 rows/);
    expect(() => parsePerfTable({ ...T, kvTokens: -1 }, "t.json")).toThrow(/t\.json: kvTokens/);
    expect(parsePerfTable(JSON.parse(JSON.stringify(T)), "t.json")).toEqual(T);
  });
});
