// Both trainer workers against one set of golden vectors (test/fixtures/trainer-golden: losses and
// gradients from the float64 references), the PyTorch worker's logprobs against the native engine's
// sampled ones on a shared fp32 checkpoint (on-policy), a LoRA adapter in both workers (logprobs,
// adapter gradients and AdamW steps; checkpoints both ways; the engine serving the torch worker's
// adapter), a 2-rank FSDP2 group over gloo against one process, the loss of one rank of a group, and
// the clear errors of a model or Python it cannot use. The single-process cases share one PyTorch worker.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Unpackr } from "msgpackr";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initFamilyModelDir, initModelDir } from "../../native/model-dir.ts";
import { checkTensor } from "../../native/reference/train-check.ts";
import { packSamples, Trainer, type NativeLossMetrics, type NativeTrainBatch } from "../../native/trainer.ts";
import { TrainerWorker } from "../../native/worker/client.ts";
import { checkTorchModel, ensureTorchEnv } from "../../native/worker/torch-env.ts";
import type { BackendSampling, TokenEvent } from "../../src/engine/backend.ts";
import { OozeError } from "../../src/errors.ts";
import { torchCommand, torchPython } from "../harness/torch.ts";

interface GoldenCase {
  name: string;
  critic: boolean;
  loss: Record<string, unknown>;
  metrics: Record<string, number>;
  grads: Float32Array;
  headGrads: Float32Array | null;
}
interface Golden {
  config: Record<string, unknown> & { vocab_size: number };
  params: Float32Array;
  valueHead: Float32Array;
  temperature: number;
  batch: Required<NativeTrainBatch> & { rolloutLogprobs: Float32Array; refLogprobs: Float32Array; oldValues: Float32Array; returns: Float32Array };
  forward: { logprobs: Float32Array; entropy: Float32Array; values: Float32Array };
  cases: GoldenCase[];
}

const golden = new Unpackr({ moreTypes: true, useRecords: false }).unpack(
  readFileSync(new URL("../fixtures/trainer-golden/golden.msgpack", import.meta.url)),
) as Golden;

const root = mkdtempSync(join(tmpdir(), "ooze-torch-worker-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
beforeAll(async () => void (await torchPython()), 240_000); // a fresh machine installs the venv first

const start = async (backend: "native" | "torch", opts: Partial<Parameters<typeof TrainerWorker.start>[0]> = {}) =>
  TrainerWorker.start({
    source: { config: golden.config, params: golden.params, seed: null },
    command: backend === "torch" ? await torchCommand() : null,
    ...opts,
  });

/**
 * One PyTorch worker serves the cases below that need a single process (each loads what it needs
 * first): starting one (Python, torch) is most of such a case's time on two cores.
 */
let sharedTorch: Promise<TrainerWorker> | null = null;
const torchWorker = () => (sharedTorch ??= start("torch"));
afterAll(async () => void (await (await sharedTorch?.catch(() => null))?.close()));

/** The golden model as an HF directory (written once, in-process). */
let goldenModel: Promise<string> | null = null;
const goldenModelDir = () => (goldenModel ??= (async () => {
  const dir = join(root, "golden-model");
  await (await Trainer.create({ config: golden.config, params: golden.params, seed: null })).save(dir);
  return dir;
})());

describe.each(["native", "torch"] as const)("golden vectors: %s worker", (backend) => {
  it("lays out its parameters as the native trainer does, and every loss and gradient equals the float64 reference's", async () => {
    const w = backend === "torch" ? await torchWorker() : await start(backend);
    try {
      const info = await w.info();
      const native = await start("native");
      expect(info.tensors).toEqual((await native.info()).tensors);
      await native.close();
      await w.setValueHead(golden.valueHead);
      const b = golden.batch;
      const fwd = await w.logprobs({ tokens: b.tokens, cuSeqlens: b.cuSeqlens }, golden.temperature);
      expect(checkTensor("logprobs", fwd.logprobs, golden.forward.logprobs, 2e-5, 0)).toBe("");
      expect(checkTensor("entropy", fwd.entropy, golden.forward.entropy, 2e-5, 0)).toBe("");
      expect(checkTensor("values", fwd.values!, golden.forward.values, 2e-5, 0)).toBe("");
      const problems: string[] = [];
      for (const c of golden.cases) {
        await w.zeroGrads();
        const loss = c.loss as { tisCap: number | null; klCoef: number };
        const batch: NativeTrainBatch = {
          tokens: b.tokens, cuSeqlens: b.cuSeqlens, lossMask: b.lossMask, advantages: b.advantages, oldLogprobs: b.oldLogprobs,
          rolloutLogprobs: loss.tisCap ? b.rolloutLogprobs : null, refLogprobs: loss.klCoef ? b.refLogprobs : null,
          oldValues: c.critic ? b.oldValues : null, returns: c.critic ? b.returns : null,
        };
        const m = await w.accumulate(batch, c.loss);
        for (const [k, want] of Object.entries(c.metrics)) {
          const got = m[k as keyof NativeLossMetrics];
          if (!(Math.abs(got - want) <= 1e-5 + 1e-4 * Math.abs(want))) problems.push(`${c.name}: ${k} ${got} vs ${want}`);
        }
        const grads = await w.getGrads();
        for (const t of info.tensors) {
          const n = t.shape.reduce((a, x) => a * x, 1);
          const e = checkTensor(`${c.name}: ${t.name}`, grads.subarray(t.offset, t.offset + n), c.grads.subarray(t.offset, t.offset + n), 3e-5, 1e-3);
          if (e) problems.push(e);
        }
        const head = (await w.getValueHead())!.grads;
        const e = checkTensor(`${c.name}: value head`, head, c.headGrads ?? new Float32Array(head.length), 3e-5, 1e-3);
        if (e) problems.push(e);
      }
      expect(problems).toEqual([]);
    } finally {
      if (backend === "native") await w.close();
    }
  }, 120_000);
});

const sampling: BackendSampling = { maxNewTokens: 12, temperature: 0.8, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: true, seed: 5 };

/** The engine's samples of `prompts` (seeds 5, 6, …) under an adapter (null: the base), packed with their logprobs; closes the engine. */
async function engineSamples(engine: ReturnType<typeof createNativeBackend>, prompts: number[][], s: BackendSampling, adapter: string | null) {
  prompts.forEach((p, i) => engine.add(`r${i}`, Int32Array.from(p), { ...s, seed: 5 + i }, adapter));
  const events: TokenEvent[] = [];
  while (engine.running() > 0) events.push(...(await engine.step()));
  engine.close();
  return packSamples(prompts.map((p, i) => {
    const evs = events.filter((e) => e.rid === `r${i}`);
    return { tokens: Int32Array.from([...p, ...evs.map((e) => e.tokenId)]), responseLength: evs.length, lossMask: new Uint8Array(evs.length).fill(1), rolloutLogprobs: Float32Array.from(evs.map((e) => e.logprob)), advantage: 0 };
  }));
}

/** The worst |worker − engine| logprob over the sampled tokens. */
async function logprobGap(w: TrainerWorker, batch: ReturnType<typeof packSamples>): Promise<number> {
  const lp = (await w.logprobs(batch, sampling.temperature)).logprobs;
  let worst = 0;
  for (let i = 0; i < lp.length; i++) if (batch.lossMask[i]) worst = Math.max(worst, Math.abs(lp[i]! - batch.rolloutLogprobs![i]!));
  return worst;
}

const LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const;

describe("LoRA: the torch worker against the native one", () => {
  it("one adapter file in both: logprobs, adapter gradients and AdamW steps agree; checkpoints move both ways; the engine serves the torch worker's; bad input is named", async () => {
    const [fromNative, fromTorch, resumed] = ["lora-native", "lora-torch", "lora-resumed"].map((d) => join(root, d)) as [string, string, string];
    const b = golden.batch;
    const kl = golden.cases.find((c) => c.name === "kl k3 + entropy bonus")!.loss;
    const batch: NativeTrainBatch = { ...b, rolloutLogprobs: null, oldValues: null, returns: null };
    const native = await start("native");
    const torch = await torchWorker();
    try {
      // the base on disk, and an adapter on all seven targets whose B is not zero (PEFT's init, B = 0,
      // would leave A without gradient), written by the native worker
      const base = await goldenModelDir();
      await native.setLora({ rank: 4, alpha: 6, targets: [...LORA_TARGETS], seed: 1 });
      const n = (await native.getLora())!.params.length;
      await native.setLora({ rank: 4, alpha: 6, targets: [...LORA_TARGETS], params: Float32Array.from({ length: n }, (_, i) => 0.3 * Math.sin(1.7 * i + 0.3)) });
      await native.saveLora(fromNative, "1", base);
      for (const w of [native, torch]) expect(await w.load(fromNative)).toMatchObject({ weightVersion: "1", optimizerStep: null });
      const [nl, tl] = [(await native.getLora())!, (await torch.getLora())!];
      expect(tl.tensors).toEqual(nl.tensors);
      expect(tl.config).toEqual(nl.config);
      expect(checkTensor("adapter as loaded", tl.params, nl.params, 0, 0)).toBe("");
      expect((await torch.info()).lora).toEqual((await native.info()).lora);

      /** Both workers' logprobs (2e-5) and adapters (atol) agree. */
      const same = async (what: string, atol: number) => {
        const [fn, ft] = [await native.logprobs(b, golden.temperature), await torch.logprobs(b, golden.temperature)];
        expect(checkTensor(`${what}: logprobs`, ft.logprobs, fn.logprobs, 2e-5, 0)).toBe("");
        expect(checkTensor(`${what}: adapter`, (await torch.getLora())!.params, (await native.getLora())!.params, atol, 0)).toBe("");
      };
      await same("loaded", 2e-5);
      const [mn, mt] = [await native.accumulate(batch, kl), await torch.accumulate(batch, kl)];
      for (const k of ["loss", "pgLoss", "kl", "entropy", "clipfrac"] as const) expect(Math.abs(mt[k] - mn[k]), k).toBeLessThanOrEqual(1e-5 + 1e-4 * Math.abs(mn[k]));
      expect(checkTensor("adapter grads", (await torch.getLora())!.grads, (await native.getLora())!.grads, 3e-5, 1e-3)).toBe("");
      await expect(torch.getGrads()).rejects.toThrow(/the base is frozen while a LoRA adapter trains/);
      const optim = { lr: 1e-2, weightDecay: 0.1 };
      const [on, ot] = [await native.applyGrads(optim), await torch.applyGrads(optim)];
      expect(Math.abs(ot.gradNorm - on.gradNorm)).toBeLessThanOrEqual(1e-5 * on.gradNorm);
      await same("after one AdamW step", 1e-5);
      expect(checkTensor("the frozen base", await torch.getParams(), golden.params, 0, 0)).toBe("");

      // the torch worker's checkpoint (adapter naming the base, the adapter's moments) resumes natively
      await torch.save(fromTorch, "2", { optimizer: true });
      expect(JSON.parse(readFileSync(join(fromTorch, "adapter_config.json"), "utf8"))).toMatchObject({ r: 4, lora_alpha: 6, base_model_name_or_path: base });
      expect(await native.load(fromTorch)).toMatchObject({ weightVersion: "2", optimizerStep: 1 });
      await same("the torch checkpoint loaded natively", 0);
      const step = async () => [await native.trainStep(batch, kl, optim, { microBatchTokens: 12 }), await torch.trainStep(batch, kl, optim, { microBatchTokens: 12 })];
      await step();
      await same("a second step from the torch worker's moments", 1e-5);
      // and the native one's resumes on torch
      await native.save(resumed, "3", { optimizer: true });
      expect(await torch.load(resumed)).toMatchObject({ weightVersion: "3", optimizerStep: 2 });
      const [sn, st] = await step();
      expect(st!.step).toBe(3);
      expect(Math.abs(st!.loss - sn!.loss)).toBeLessThanOrEqual(1e-5);
      await same("a third step from the native worker's moments", 1e-5);

      // the engine serves the torch worker's adapter: its sampled logprobs are the worker's under it
      await torch.loadLora(fromTorch);
      const engine = createNativeBackend({ modelDir: base, maxRunning: 4 });
      await engine.lora!.load("torch", fromTorch);
      const sampled = await engineSamples(engine, [[1, 5, 9, 3], [2, 7, 7, 8]], { ...sampling, maxNewTokens: 6 }, "torch");
      expect(await logprobGap(torch, sampled)).toBeLessThanOrEqual(1e-5);

      // bad input, named: a target that is not one, an adapter of another rank or of an unknown module
      await expect(torch.setLora({ targets: ["lm_head" as "q_proj"] })).rejects.toMatchObject({ code: "CONFIG_INVALID", message: expect.stringMatching(/setLora.targets\[0\] 'lm_head' is not one of q_proj/) });
      const config = JSON.parse(readFileSync(join(fromTorch, "adapter_config.json"), "utf8"));
      writeFileSync(join(fromTorch, "adapter_config.json"), JSON.stringify({ ...config, r: 2 }));
      await expect(torch.loadLora(fromTorch)).rejects.toMatchObject({ code: "CHECKPOINT_INVALID", message: expect.stringMatching(/adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': shape \[4, 16\] but the config needs \[2, 16\]/) });
      writeFileSync(join(fromTorch, "adapter_config.json"), JSON.stringify({ ...config, target_modules: ["q_proj", "lm_head"] }));
      await expect(torch.loadLora(fromTorch)).rejects.toThrow(/adapter_config.json: target_modules: 'lm_head' is not a Linear layer ooze adapts/);
      expect((await torch.getLora())!.config.rank).toBe(4); // the adapter it trained stays
    } finally {
      await native.close();
    }
  }, 120_000);
});

describe("the PyTorch worker on a shared fp32 checkpoint", () => {
  it("gives the native engine's sampled logprobs within 1e-5 (Llama 3 and Qwen3 shapes)", async () => {
    const w = await torchWorker();
    for (const arch of ["llama3", "qwen3"]) {
      const dir = join(root, arch);
      await initFamilyModelDir({ arch, size: "tiny", outDir: dir, seed: 4, tokenizerDir: null });
      if (arch === "llama3") expect(checkTorchModel(await torchPython(), dir)).toBe("LlamaForCausalLM");
      const batch = await engineSamples(createNativeBackend({ modelDir: dir, maxRunning: 4 }), [[1, 5, 9, 3], [2, 7, 7, 7, 7, 8, 1], [4]], sampling, null);
      await w.load(dir);
      expect(await logprobGap(w, batch), `${arch}: worst |torch − engine| logprob`).toBeLessThanOrEqual(1e-5);
    }
  }, 120_000);
});

const samples = [
  { tokens: Int32Array.from([1, 5, 9, 3, 4, 7, 8]), responseLength: 4, lossMask: Uint8Array.from([1, 1, 0, 1]), rolloutLogprobs: null, advantage: 1 },
  { tokens: Int32Array.from([2, 6, 11, 12, 13]), responseLength: 3, lossMask: Uint8Array.from([1, 1, 1]), rolloutLogprobs: null, advantage: -0.5 },
  { tokens: Int32Array.from([3, 3, 8, 1, 1, 2, 9, 4]), responseLength: 5, lossMask: Uint8Array.from([1, 1, 1, 1, 1]), rolloutLogprobs: null, advantage: 0.25 },
];

describe("FSDP2 across ranks (gloo on CPU)", () => {
  it("2 ranks give the loss and parameters of 1 rank after 3 steps (1e-5); their checkpoint resumes natively; SIGKILL of rank 1 restarts the group from it; a LoRA adapter across the ranks trains as in 1", async () => {
    const batch = packSamples(samples);
    const waiters: ((n: number) => void)[] = [];
    const start = async (gpus: number) => TrainerWorker.start({
      source: { config: golden.config, params: golden.params, seed: null }, command: await torchCommand({ gpus }), valueHead: true,
      onRestart: (e) => waiters.shift()?.(e.restarts),
    });
    const train = async (w: TrainerWorker, dir: string) => {
      const losses: number[] = [];
      for (let s = 0; s < 3; s++) losses.push((await w.trainStep(batch, { temperature: 0.9, entropyCoef: 0.01 }, { lr: 1e-2, weightDecay: 0.1 })).loss);
      await w.save(dir, "3", { optimizer: true });
      return { losses, params: await w.getParams(), head: (await w.getValueHead())!.params };
    };
    // one rank: the shared worker, on the golden model with a zero value head (what start(1) would hold)
    const w1 = await torchWorker();
    await w1.load(await goldenModelDir());
    await w1.setValueHead(new Float32Array(Number(golden.config.hidden_size) + 1));
    const one = await train(w1, join(root, "fsdp-1"));
    const w2 = await start(2);
    try {
      const dir = join(root, "fsdp-2");
      const two = await train(w2, dir);
      for (let s = 0; s < 3; s++) expect(Math.abs(two.losses[s]! - one.losses[s]!)).toBeLessThanOrEqual(1e-5);
      expect(checkTensor("params", two.params, one.params, 1e-5, 0)).toBe("");
      expect(checkTensor("value head", two.head, one.head, 1e-5, 0)).toBe("");
      // the group's checkpoint is an HF directory with the native optimizer state: the native worker resumes it
      const native = await TrainerWorker.start({ source: { modelDir: dir } });
      try {
        expect((await native.info()).step).toBe(3);
        expect(checkTensor("params loaded natively", await native.getParams(), two.params, 0, 0)).toBe("");
      } finally {
        await native.close();
      }
      // one rank lost mid-call is the whole worker lost: restarted, as a group, from the checkpoint
      await w2.trainStep(batch, {}, { lr: 1e-2 });
      const rank1 = childrenOf(w2.pid!);
      expect(rank1).toHaveLength(1);
      const restarted = new Promise<number>((res) => waiters.push(res));
      const inFlight = w2.hangForTest();
      process.kill(rank1[0]!, "SIGKILL");
      const err = await inFlight.then(() => null, (e: unknown) => e);
      expect(err).toMatchObject({ code: "WORKER_DIED", retryable: true });
      expect(await restarted).toBe(1);
      expect(childrenOf(w2.pid!)).toHaveLength(1);
      expect(checkTensor("params after the restart", await w2.getParams(), two.params, 0, 0)).toBe("");
      expect((await w2.info()).step).toBe(3);

      // A LoRA adapter over the group's model: sharded with it, it trains as in one process
      const adapt = async (w: TrainerWorker) => {
        await w.setLora({ rank: 2, alpha: 4, targets: ["q_proj", "v_proj", "down_proj"], seed: 3 });
        const losses: number[] = [];
        for (let s = 0; s < 2; s++) losses.push((await w.trainStep(batch, { temperature: 0.9, entropyCoef: 0.01 }, { lr: 1e-2 })).loss);
        return { losses, adapter: (await w.getLora())!.params };
      };
      const [a1, a2] = [await adapt(w1), await adapt(w2)];
      for (let s = 0; s < 2; s++) expect(Math.abs(a2.losses[s]! - a1.losses[s]!)).toBeLessThanOrEqual(1e-5);
      expect(a2.adapter.some((x) => x !== 0)).toBe(true);
      expect(checkTensor("adapter", a2.adapter, a1.adapter, 1e-5, 0)).toBe("");
      expect(checkTensor("base under the adapter", await w2.getParams(), two.params, 0, 0)).toBe("");
      // its checkpoint is a PEFT directory naming the base written beside it: the native worker resumes both
      const loraDir = join(root, "fsdp-2-lora");
      await w2.save(loraDir, "5", { optimizer: true });
      const resumed = await TrainerWorker.start({ source: { modelDir: loraDir } });
      try {
        expect(checkTensor("adapter loaded natively", (await resumed.getLora())!.params, a2.adapter, 0, 0)).toBe("");
        expect(checkTensor("base loaded natively", await resumed.getParams(), two.params, 0, 0)).toBe("");
      } finally {
        await resumed.close();
      }
    } finally {
      await w2.close();
    }
  }, 240_000);
});

/** Pids whose parent is `pid` (Linux /proc). */
function childrenOf(pid: number): number[] {
  const text = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
  return text ? text.split(/\s+/).map(Number) : [];
}

describe("errors a user can act on", () => {
  it("a model directory torch cannot load, a package the index lacks, and an interpreter that is not there: each named, with the fix", async () => {
    const python = await torchPython();
    const bad = join(root, "not-a-model");
    await initModelDir("tiny", bad, 1);
    const cfg = JSON.parse(readFileSync(join(bad, "config.json"), "utf8"));
    writeFileSync(join(bad, "config.json"), JSON.stringify({ ...cfg, model_type: "no_such_family" }));
    // the worker that fails to load it starts meanwhile (its own process; starting is most of its time)
    const failed = TrainerWorker.start({ source: { modelDir: bad }, command: await torchCommand(), maxRestarts: 0 }).then(() => null, (e: unknown) => e);
    expect(() => checkTorchModel(python, bad)).toThrow(new RegExp(`${bad}: transformers cannot load this model`));
    // a package the configured index does not have: pip's answer, named, and the fix
    const requirements = join(root, "requirements.txt");
    writeFileSync(requirements, "ooze-no-such-package==1.0\n");
    await expect(ensureTorchEnv(() => undefined, { venv: join(root, "venv"), requirements })).rejects.toThrow(/pip found no ooze-no-such-package==1.0 in the configured package index/);
    const err = await failed;
    expect(err).toBeInstanceOf(OozeError);
    expect((err as OozeError).code).toBe("CHECKPOINT_INVALID");
    expect((err as OozeError).message).toContain(bad);
    const saved = process.env.OOZE_TORCH_PYTHON;
    process.env.OOZE_TORCH_PYTHON = join(root, "no-python");
    try {
      await expect(ensureTorchEnv()).rejects.toThrow(/OOZE_TORCH_PYTHON=.*no-python: no such file/);
    } finally {
      if (saved === undefined) delete process.env.OOZE_TORCH_PYTHON;
      else process.env.OOZE_TORCH_PYTHON = saved;
    }
  }, 120_000);
});
