// The policy trainer's schedules, against a real trainer worker on the tiny preset: linear learning-rate
// warmup, and adaptive entropy control (the coefficient rises while the batch's token entropy is under
// the target and falls, not below zero, while it is above).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { initModelDir } from "../../native/model-dir.ts";
import { PolicyTrainer, type PolicyTrainerConfig } from "../../actors/trainer/policy-trainer.ts";
import { baseTrainerConfig, oppositeAdvantageBatch } from "../fixtures/policy-batch.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-policy-trainer-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const base = baseTrainerConfig;
const batch = oppositeAdvantageBatch;

async function start(name: string, config: PolicyTrainerConfig): Promise<PolicyTrainer> {
  const dir = join(root, name, "v0");
  await initModelDir("tiny", dir, 0);
  return PolicyTrainer.start({ modelDir: dir, version: 0, weightsRoot: join(root, name), config });
}

describe("PolicyTrainer", () => {
  it("warms the learning rate up linearly over lrWarmupSteps", async () => {
    const t = await start("warmup", { ...base, lrWarmupSteps: 4 });
    try {
      expect([1, 2, 4, 9].map((v) => t.lrAt(v))).toEqual([2.5e-4, 5e-4, 1e-3, 1e-3]);
    } finally {
      await t.close();
    }
    const flat = await start("flat", base);
    try {
      expect(flat.lrAt(1)).toBe(1e-3);
    } finally {
      await flat.close();
    }
  });

  it("moves the entropy coefficient towards the entropy target, never below zero", async () => {
    // an untrained model's token entropy is about ln(259) ≈ 5.5 nats: under 100, over 0.5
    const up = await start("ent-up", { ...base, entropyTarget: 100, entropyCoefStep: 0.02 });
    try {
      await up.step(batch());
      await up.step(batch());
      expect(up.entropyCoef).toBeCloseTo(0.05, 10);
    } finally {
      await up.close();
    }
    const down = await start("ent-down", { ...base, entropyTarget: 0.5, entropyCoefStep: 0.006 });
    try {
      await down.step(batch());
      expect(down.entropyCoef).toBeCloseTo(0.004, 10);
      await down.step(batch());
      expect(down.entropyCoef).toBe(0);
    } finally {
      await down.close();
    }
  });
});
