// The critic inside the trainer worker process: a shared value head survives a SIGKILLed worker
// through its checkpoint; a separate value model (a second Trainer in the same process) gives the
// values, trains on the value loss alone, leaves the policy untouched, is saved to dir/critic beside
// the policy and comes back after a SIGKILL at its last save.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { initModelDir } from "../../native/model-dir.ts";
import { packSamples, VALUE_HEAD_FILE, type NativeTrainBatch } from "../../native/trainer.ts";
import { CRITIC_DIR, TrainerWorker } from "../../native/worker/client.ts";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "ooze-critic-worker-"));
  dirs.push(d);
  return d;
};

const packed = packSamples([
  { tokens: Int32Array.from([1, 5, 9, 3, 4, 7, 8]), responseLength: 4, lossMask: Uint8Array.from([1, 1, 0, 1]), rolloutLogprobs: null, advantage: 1 },
  { tokens: Int32Array.from([2, 6, 11, 12, 13]), responseLength: 3, lossMask: Uint8Array.from([1, 1, 1]), rolloutLogprobs: null, advantage: -0.5 },
]);
const T = packed.tokens.length;
const withValues = (oldValues: Float32Array): NativeTrainBatch => ({ ...packed, oldValues, returns: Float32Array.from({ length: T }, (_, i) => (i % 2 ? 1 : -1)) });

/** Resolves on the worker's next completed restart. */
function restarted(w: { onRestart: ((n: number) => void)[] }): Promise<number> {
  return new Promise((res) => w.onRestart.push(res));
}

describe("critic in the trainer worker", () => {
  it("shared value head: trained with the policy, saved as value_head.bin, back after SIGKILL", async () => {
    const dir = tmp();
    await initModelDir("tiny", join(dir, "v0"), 1);
    const hooks = { onRestart: [] as ((n: number) => void)[] };
    const w = await TrainerWorker.start({ source: { modelDir: join(dir, "v0") }, valueHead: true, onRestart: (e) => hooks.onRestart.shift()?.(e.restarts) });
    try {
      const { values } = await w.logprobs(packed);
      expect(values).not.toBeNull();
      await w.trainStep(withValues(values!), { valueCoef: 1 }, { lr: 0.01 });
      await w.save(join(dir, "v1"), "1", { optimizer: true });
      expect(existsSync(join(dir, "v1", VALUE_HEAD_FILE))).toBe(true);
      const saved = (await w.getValueHead())!;
      expect(saved.params.some((x) => x !== 0)).toBe(true);
      await w.trainStep(withValues(values!), { valueCoef: 1 }, { lr: 0.01 }); // not saved: lost with the worker
      const back = restarted(hooks);
      process.kill(w.pid!, "SIGKILL");
      await back;
      const head = (await w.getValueHead())!;
      expect(Array.from(head.params)).toEqual(Array.from(saved.params));
      expect(head.step).toBe(1);
    } finally {
      await w.close();
    }
  });

  it("separate value model: values from it, value loss trains it alone, saved in dir/critic, back after SIGKILL", async () => {
    const dir = tmp();
    await initModelDir("tiny", join(dir, "v0"), 1);
    await initModelDir("tiny", join(dir, "critic-init"), 2);
    const hooks = { onRestart: [] as ((n: number) => void)[] };
    const w = await TrainerWorker.start({
      source: { modelDir: join(dir, "v0") }, critic: { modelDir: join(dir, "critic-init") },
      onRestart: (e) => hooks.onRestart.shift()?.(e.restarts),
    });
    try {
      const critic = w.critic!;
      expect((await w.logprobs(packed)).values).toBeNull(); // the policy has no head
      const { values } = await critic.logprobs(packed);
      expect(values).not.toBeNull();
      const policyBefore = await w.getParams(), criticBefore = await critic.getParams();
      // two steps: the head starts at zero, so only from the second does the gradient reach the trunk
      for (let k = 0; k < 2; k++) {
        const m = await critic.trainStep({ ...withValues(values!), advantages: new Float32Array(T) }, { valueCoef: 1, valueClip: null }, { lr: 0.01 });
        expect(m.valueLoss).toBeGreaterThan(0);
        expect(m.pgLoss).toBe(0);
      }
      expect(Array.from(await w.getParams())).toEqual(Array.from(policyBefore)); // the policy did not move
      const criticAfter = await critic.getParams();
      expect(criticAfter.some((x, i) => x !== criticBefore[i])).toBe(true); // the critic's trunk did
      await w.save(join(dir, "v1"), "1", { optimizer: true });
      expect(existsSync(join(dir, "v1", CRITIC_DIR, "model.safetensors"))).toBe(true);
      expect(existsSync(join(dir, "v1", CRITIC_DIR, VALUE_HEAD_FILE))).toBe(true);
      expect(existsSync(join(dir, "v1", VALUE_HEAD_FILE))).toBe(false);
      const back = restarted(hooks);
      process.kill(w.pid!, "SIGKILL");
      await back;
      expect(Array.from(await critic.getParams())).toEqual(Array.from(criticAfter));
      expect((await critic.getValueHead())!.step).toBe(2);
    } finally {
      await w.close();
    }
  });
});
