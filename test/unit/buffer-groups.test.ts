import { describe, expect, it } from "vitest";
import { GroupBuffer } from "../../actors/buffer/groups.ts";
import { SampleBuilder, type Sample } from "../../src/sample.ts";

let next = 0;
function sample(group: number, reward: number, version = "0", rollout = `r${next}`): Sample {
  const b = new SampleBuilder(next++, group, rollout, null, [1, 2]);
  b.appendModel([3], [-1], version);
  return b.build(reward, "completed");
}

describe("GroupBuffer", () => {
  it("completes uneven groups when the rollout side closes them", () => {
    const buf = new GroupBuffer({ batchGroups: 2, estimator: "grpo", dropZeroVariance: true, maxStaleness: null });
    buf.add(sample(0, 1));
    buf.add(sample(0, 0));
    buf.add(sample(0, 0));
    expect(buf.readyGroups).toBe(0);
    expect(buf.close(0, 3)).toBe(0);
    buf.add(sample(1, 1));
    expect(buf.close(1, 2)).toBeNull(); // one sample still missing
    expect(buf.add(sample(1, 0))).toBe(1);
    const { batch } = buf.takeBatch(0);
    expect(batch!.samples).toHaveLength(5);
    expect(batch!.groups).toEqual([0, 1]);
    const sum0 = batch!.samples.filter((s) => s.groupIndex === 0).reduce((a, s) => a + s.advantage, 0);
    expect(sum0).toBeCloseTo(0, 9);
  });

  it("drops zero-variance groups and ignores redelivered samples", () => {
    const buf = new GroupBuffer({ batchGroups: 1, estimator: "grpo", dropZeroVariance: true, maxStaleness: null });
    const s = sample(5, 1);
    buf.add(s);
    buf.add(s);
    buf.add(sample(5, 1));
    buf.close(5, 2);
    expect(buf.stats.dropped).toBe(1);
    expect(buf.takeBatch(0).batch).toBeNull();
  });

  it("requeues groups beyond the staleness bound and reports staleness", () => {
    const buf = new GroupBuffer({ batchGroups: 1, estimator: "dr_grpo", dropZeroVariance: false, maxStaleness: 1 });
    buf.add(sample(0, 1, "3"));
    buf.add(sample(0, 0, "4"));
    buf.close(0, 2);
    buf.add(sample(1, 1, "1"));
    buf.add(sample(1, 0, "4"));
    buf.close(1, 2);
    const { batch, requeue } = buf.takeBatch(4);
    expect(requeue).toEqual([1]);
    expect(batch!.groups).toEqual([0]);
    expect(batch!.stalenessMax).toBe(1);
  });

  it("computes advantages per policy, and a role task's contexts per prompt", () => {
    const buf = new GroupBuffer({ batchGroups: 1, estimator: "dr_grpo", dropZeroVariance: false, maxStaleness: null });
    const ctx = (policy: string, prompt: number[], reward: number, rollout: string): Sample => {
      const b = new SampleBuilder(next++, 9, rollout, null, prompt, policy);
      b.appendModel([3], [-1], "0");
      return b.build(reward, "completed", { context: policy === "describer" ? 0 : 1 });
    };
    // two describer episodes (rewards 1 and 0); the guesser answered message 7 twice and message 8 twice
    const samples = [
      ctx("describer", [1, 65], 1, "r0"), ctx("guesser", [1, 7], 1, "r0.1"), ctx("guesser", [1, 7], 1, "r0.2"),
      ctx("describer", [1, 65], 0, "r3"), ctx("guesser", [1, 8], 0, "r3.1"), ctx("guesser", [1, 8], 0, "r3.2"),
    ];
    for (const s of samples) buf.add(s);
    buf.close(9, samples.length);
    const adv = new Map(buf.takeBatch(0).batch!.samples.map((s) => [s.rolloutId, s.advantage]));
    // the describers' baseline is their own mean (0.5); each message's guesses have their own (1 and 0)
    expect([adv.get("r0"), adv.get("r3")]).toEqual([0.5, -0.5]);
    expect([adv.get("r0.1"), adv.get("r0.2"), adv.get("r3.1"), adv.get("r3.2")]).toEqual([0, 0, 0, 0]);

    // reinforce_pp has no group baseline: it whitens over each policy's samples of the batch, so a
    // message whose guesses all failed is pushed down by the other message's successes (it was whitened
    // within its own group, where equal rewards gave it 0, until Nov 29)
    const pp = new GroupBuffer({ batchGroups: 1, estimator: "reinforce_pp", dropZeroVariance: false, maxStaleness: null });
    for (const s of samples) pp.add(s);
    pp.close(9, samples.length);
    const a = new Map(pp.takeBatch(0).batch!.samples.map((s) => [s.rolloutId, s.advantage]));
    const z = 1 / Math.sqrt(1 / 3); // rewards 1, 1, 0, 0: mean 0.5, unbiased sd √(1/3)
    for (const [id, want] of [["r0.1", 0.5 * z], ["r0.2", 0.5 * z], ["r3.1", -0.5 * z], ["r3.2", -0.5 * z]] as const) expect(a.get(id)).toBeCloseTo(want, 5);
    expect(a.get("r0")).toBeCloseTo(1 / Math.sqrt(2), 5); // the describers: rewards 1, 0 (sd √(1/2))
    expect(a.get("r3")).toBeCloseTo(-1 / Math.sqrt(2), 5);
  });
});
