// Crash containment: the trainer runs in a child process; SIGKILL and SIGSEGV of the child reject the
// call in flight with a retryable WORKER_DIED, the supervisor restarts it, and the new worker's params
// equal the last restore point (a saved checkpoint dir, or params it was given). The faults run against
// both workers: the native one and the PyTorch one (python/ooze_torch), which speak one protocol.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { OozeError } from "../../src/errors.ts";
import { checkTensor, randomPacked, tinyTrainConfig } from "../../native/reference/train-check.ts";
import { packSamples, Trainer } from "../../native/trainer.ts";
import { TrainerWorker } from "../../native/worker/client.ts";
import { waitUntil } from "../harness/index.ts";
import { torchCommand } from "../harness/torch.ts";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const cfg = tinyTrainConfig(false, 29);
const batch = packSamples([
  { tokens: Int32Array.from([1, 5, 9, 3, 4, 7, 8]), responseLength: 4, lossMask: Uint8Array.from([1, 1, 0, 1]), rolloutLogprobs: null, advantage: 1 },
  { tokens: Int32Array.from([2, 6, 11, 12, 13]), responseLength: 3, lossMask: Uint8Array.from([1, 1, 1]), rolloutLogprobs: null, advantage: -0.5 },
]);

/** Starts a worker whose restarts can be awaited one by one. */
async function startWorker(backend: "native" | "torch" = "native"): Promise<{ w: TrainerWorker; nextRestart: () => Promise<number> }> {
  const waiters: ((n: number) => void)[] = [];
  const w = await TrainerWorker.start({
    source: { config: cfg, params: null, seed: 3 },
    command: backend === "torch" ? await torchCommand() : null,
    onRestart: (e) => waiters.shift()?.(e.restarts),
  });
  return { w, nextRestart: () => new Promise<number>((res) => waiters.push(res)) };
}

async function expectWorkerDied(p: Promise<unknown>): Promise<void> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(OozeError);
  expect((err as OozeError).code).toBe("WORKER_DIED");
  expect((err as OozeError).retryable).toBe(true);
}

describe("TrainerWorker (native)", () => {
  it("serves the Trainer's calls from another process with the same results", async () => {
    const { w } = await startWorker();
    try {
      const { pid } = await w.ping();
      expect(pid).not.toBe(process.pid);
      expect(pid).toBe(w.pid);
      const local = await Trainer.create({ config: cfg, params: null, seed: 3 });
      const packed = randomPacked([5, 8], cfg.vocab_size, 1);
      const a = await w.logprobs(packed, 0.9), b = await local.logprobs(packed, 0.9);
      expect(checkTensor("logprobs", a.logprobs, b.logprobs, 0, 0)).toBe("");
      const m1 = await w.trainStep(batch, {}, { lr: 1e-2 });
      const m2 = await local.trainStep(batch, {}, { lr: 1e-2 });
      expect(m1.loss).toBe(m2.loss);
      expect(checkTensor("params", await w.getParams(), await local.getParams(), 0, 0)).toBe("");
      // Errors come back as OozeErrors and the worker keeps serving.
      await expect(w.logprobs({ tokens: new Int32Array([1, 99]), cuSeqlens: new Int32Array([0, 2]) })).rejects.toThrow(/outside the vocabulary/);
      expect((await w.info()).step).toBe(1);
    } finally {
      await w.close();
    }
  });

});

describe.each(["native", "torch"] as const)("TrainerWorker faults (%s worker)", (backend) => {
  // One worker through the three faults in turn (each restart is a fresh child process, so the
  // stages do not lean on each other's state): a torch worker takes seconds to start, not 0.1 s.
  it("SIGKILL restores the saved checkpoint and optimizer; SIGSEGV the params it was given, with calls made during the restart waiting for it; close() ends the child", async () => {
    const { w, nextRestart } = await startWorker(backend);
    let closed = false;
    try {
      // SIGKILL: the call in flight rejects with WORKER_DIED; the restart holds the saved checkpoint
      await w.trainStep(batch, {}, { lr: 1e-2 });
      const dir = mkdtempSync(join(tmpdir(), "ooze-worker-"));
      dirs.push(dir);
      await w.save(dir, "v1", { optimizer: true });
      const saved = await w.getParams();
      await w.trainStep(batch, {}, { lr: 1e-2 }); // moves past the checkpoint
      expect(checkTensor("moved", await w.getParams(), saved, 0, 0)).not.toBe("");
      const killedPid = w.pid!;
      const inFlight = w.hangForTest();
      const restarted = nextRestart();
      process.kill(killedPid, "SIGKILL");
      await expectWorkerDied(inFlight);
      expect(await restarted).toBe(1);
      expect(w.pid).not.toBe(killedPid);
      expect(checkTensor("params after restart", await w.getParams(), saved, 0, 0)).toBe("");
      expect(w.restoreSource).toEqual({ modelDir: dir });
      expect((await w.info()).step).toBe(1); // the AdamW state saved with the checkpoint came back too

      // SIGSEGV: restarts from the last params it was given (now the restore point)
      const given = (await w.getParams()).map((v, i) => v + (i % 7) * 1e-3);
      await w.setParams(given);
      await w.trainStep(batch, {}, { lr: 1e-2 });
      const segvPid = w.pid!;
      const inFlight2 = w.hangForTest();
      const restarted2 = nextRestart();
      process.kill(segvPid, "SIGSEGV");
      await expectWorkerDied(inFlight2);
      // Issued before the restart finished: queued until the new worker is ready.
      const params = await w.getParams();
      expect(await restarted2).toBe(2);
      expect(checkTensor("params after SIGSEGV", params, given, 0, 0)).toBe("");
      // And it trains again.
      const m = await w.trainStep(batch, {}, { lr: 1e-2 });
      expect(Number.isFinite(m.loss)).toBe(true);

      // close() ends the child process
      const pid = w.pid!;
      await w.close();
      closed = true;
      await waitUntil(
        () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        },
        { what: `worker pid ${pid} to exit` },
      );
      await expect(w.ping()).rejects.toThrow(/closed/);
    } finally {
      if (!closed) await w.close();
    }
    // three torch starts (import torch and transformers, ~8 s of CPU each): 26 s on an idle pair of
    // cores, past 60 s while two other torch-heavy files start theirs (Nov 29, three workers)
  }, 180_000);
});

describe("a LoRA adapter in the native worker", () => {
  it("trains over the frozen base, and after SIGKILL the restarted worker holds the saved adapter and its optimizer", async () => {
    const waiters: ((n: number) => void)[] = [];
    const w = await TrainerWorker.start({
      source: { config: cfg, params: null, seed: 3 },
      lora: { rank: 2, alpha: 4, targets: ["q_proj", "v_proj", "down_proj"], seed: 1 },
      onRestart: (e) => waiters.shift()?.(e.restarts),
    });
    try {
      expect((await w.info()).lora).toMatchObject({ rank: 2, alpha: 4, targets: ["q_proj", "v_proj", "down_proj"] });
      const base = await w.getParams();
      await w.trainStep(batch, {}, { lr: 1e-2 });
      const dir = mkdtempSync(join(tmpdir(), "ooze-worker-lora-"));
      dirs.push(dir);
      await w.save(dir, "v1", { optimizer: true });
      const saved = (await w.getLora())!.params;
      await w.trainStep(batch, {}, { lr: 1e-2 });
      expect(checkTensor("adapter moved", (await w.getLora())!.params, saved, 0, 0)).not.toBe("");
      expect(checkTensor("base frozen", await w.getParams(), base, 0, 0)).toBe("");
      const restarted = new Promise<number>((res) => waiters.push(res));
      process.kill(w.pid!, "SIGKILL");
      expect(await restarted).toBe(1);
      expect(checkTensor("adapter after restart", (await w.getLora())!.params, saved, 0, 0)).toBe("");
      expect((await w.info()).step).toBe(1); // the adapter's AdamW state came back with it
    } finally {
      await w.close();
    }
  });
});
