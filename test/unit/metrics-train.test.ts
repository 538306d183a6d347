// The training metrics helpers: JSONL round trip, the reward chart's SVG, the first step whose
// trailing mean reaches a target, and the train: section's defaults and errors.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { appendJsonl, firstReaching, readJsonl, rewardStats, rewardSvg, type StepMetrics } from "../../actors/protocol/metrics.ts";

const m = (step: number, reward: number): StepMetrics =>
  ({ step, reward_mean: reward, reward_max_frac: reward / 2, success_rate: reward / 2, seconds: step * 2 }) as StepMetrics;

describe("train metrics", () => {
  it("reward statistics: failed samples left out, success from the task's test or else the full reward", () => {
    const s = (reward: number | null, success?: boolean) => ({ reward, metadata: success === undefined ? {} : { success } });
    // a guess found on the 3rd turn (reward 0.8, success), a full reward without a test, a miss, a failed generation
    expect(rewardStats([s(0.8, true), s(1), s(0, false), s(null)])).toEqual({ reward_mean: 0.6, reward_max_frac: 1 / 3, success_rate: 2 / 3 });
    expect(rewardStats([s(null)])).toEqual({ reward_mean: 0, reward_max_frac: 0, success_rate: 0 });
  });

  it("appends and reads JSONL records", () => {
    const dir = mkdtempSync(join(tmpdir(), "ooze-metrics-"));
    try {
      const p = join(dir, "m.jsonl");
      expect(readJsonl(p)).toEqual([]);
      appendJsonl(p, { step: 1, x: 0.5 });
      appendJsonl(p, { step: 2, x: 1 });
      expect(readJsonl(p)).toEqual([{ step: 1, x: 0.5 }, { step: 2, x: 1 }]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("draws a well-formed SVG with one path per series, escaping the title", () => {
    const svg = rewardSvg([m(1, 0.1), m(2, 0.5), m(3, 0.9)], "a<b & c");
    expect(svg.startsWith("<svg")).toBe(true);
    expect(svg.endsWith("</svg>")).toBe(true);
    expect(svg.match(/<path /g)).toHaveLength(2);
    expect(svg).toContain("a&lt;b &amp; c");
    expect(rewardSvg([], "empty")).not.toContain("<path");
  });

  it("finds the first step whose trailing mean reaches the target", () => {
    const ms = [0.1, 0.5, 0.9, 0.95, 0.92, 0.99].map((r, i) => m(i + 1, r));
    expect(firstReaching(ms, 0.9, 3)?.step).toBe(5);
    expect(firstReaching(ms, 0.99, 3)).toBeNull();
  });

  it("fills train: defaults and names bad fields", () => {
    const { train, engines } = trainConfigOf({ train: { steps: 3 }, engines: undefined, file: "t.yaml" });
    expect(train).toMatchObject({ mode: "sync", task: "addition", steps: 3, estimator: "grpo", uniformCoef: 0 });
    expect(() => trainConfigOf({ train: { uniformCoef: -0.1 }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: uniformCoef/);
    expect(train.pauseOnUpdate).toBe("abort");
    expect(() => trainConfigOf({ train: { pauseOnUpdate: "in_place" }, engines: undefined, file: "t.yaml" })).toThrow(/train: pauseOnUpdate: in_place .*set keepCacheOnUpdate: true/);
    expect(trainConfigOf({ train: { pauseOnUpdate: "in_place", keepCacheOnUpdate: true }, engines: undefined, file: "t.yaml" }).train.pauseOnUpdate).toBe("in_place");
    expect(engines.count).toBe(1);
    expect(() => trainConfigOf({ train: { mode: "fast" }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: mode/);
    expect(() => trainConfigOf({ train: {}, engines: { count: 0 }, file: "t.yaml" })).toThrow(/at least one engine/);
  });

  it("algorithm: ppo fills the ppo: defaults and names bad ppo fields", () => {
    const { train } = trainConfigOf({ train: { algorithm: "ppo", ppo: { lambda: 0.9 } }, engines: undefined, file: "t.yaml" });
    expect(train.algorithm).toBe("ppo");
    expect(train.ppo).toEqual({ gamma: 1, lambda: 0.9, valueCoef: 0.5, valueClip: 0.2, whitening: "batch", critic: "shared", criticPreset: null });
    expect(trainConfigOf({ train: {}, engines: undefined, file: "t.yaml" }).train.algorithm).toBe("group");
    expect(() => trainConfigOf({ train: { ppo: { lambda: 2 } }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: ppo\.lambda: Too big/);
    expect(() => trainConfigOf({ train: { ppo: { gama: 1 } }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: ppo: Unrecognized key: "gama"/);
    expect(() => trainConfigOf({ train: { algorithm: "a2c" }, engines: undefined, file: "t.yaml" })).toThrow(/t\.yaml: train: algorithm/);
  });
});
