// Disk full on a checkpoint write (ooze/testing's disk-full fault, on a small tmpfs): the policy
// trainer's save of a new version fails with ENOSPC after the update ran in the worker; once space is
// back, the batch trained again must give exactly the weights and optimizer state of one clean step
// (the worker was put back at the previous version), not of two. Skipped, saying why, where a tmpfs
// cannot be mounted (not root, not Linux).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { PolicyTrainer } from "../../actors/trainer/policy-trainer.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { baseTrainerConfig, oppositeAdvantageBatch } from "../fixtures/policy-batch.ts";
import { createDiskFiller, mountTmpfs, tmpfsUnavailable } from "../harness/index.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-trainer-disk-full-"));
const why = tmpfsUnavailable();
let disk: { dir: string; unmount(): void } | null = null;
afterAll(() => {
  disk?.unmount();
  rmSync(root, { recursive: true, force: true });
});
if (why) process.stdout.write(`trainer-disk-full: skipped: ${why}\n`);

const config = baseTrainerConfig;
const batch = oppositeAdvantageBatch;

async function start(dir: string): Promise<PolicyTrainer> {
  await initModelDir("tiny", join(dir, "v0"), 0);
  return PolicyTrainer.start({ modelDir: join(dir, "v0"), version: 0, weightsRoot: dir, config });
}

describe.skipIf(why !== null)("a checkpoint write on a full disk", () => {
  it("fails, and the batch trained again once space is back gives the weights of exactly one step", async () => {
    disk = mountTmpfs(join(root, "disk"), 8 << 20);
    const full = createDiskFiller(disk.dir);
    const faulted = await start(join(disk.dir, "run"));
    const clean = await start(join(root, "clean"));
    try {
      await full.fill();
      const err = await faulted.step(batch()).catch((e: unknown) => e as Error);
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toMatch(/disk full|ENOSPC|no space/i);
      await full.free();
      const a = await faulted.step(batch());
      const b = await clean.step(batch());
      expect(a.version).toBe(1);
      expect(b.version).toBe(1);
      for (const f of ["model.safetensors", "optimizer.bin"]) {
        const x = readFileSync(join(a.modelDir, f));
        const y = readFileSync(join(b.modelDir, f));
        expect(x.equals(y), `${f} after a failed save and a retry equals one clean step's`).toBe(true);
      }
    } finally {
      await full.free();
      await faulted.close();
      await clean.close();
    }
  }, 120_000);
});
