// The `train:` and `engines:` sections of a topology, validated with zod and filled with defaults:
// everything `ooze train` needs to know about the task, the model, the loop and its hyperparameters.
import { z } from "zod";
import { OozeError } from "../../src/errors.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { agentSchema } from "./agent-config.ts";
import { policiesSchema, roleSchema } from "./policies.ts";

const estimators = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo"] as const;

/** Schema of `train:`. */
export const trainSchema = z
  .object({
    /**
     * sync: generate, train, sync, repeat. async: generation of step n+1 overlaps training of step n.
     * fully_async: generation never stops (actors/buffer/continuous.ts); weight updates interrupt it
     * (partial rollout) and the staleness bound keeps batches near the trainer's version.
     */
    mode: z.enum(["sync", "async", "fully_async"]).default("sync"),
    /**
     * fully_async: a weight update aborts in-flight generations, which keep their tokens and resume
     * on the new weights (each span recorded under its version). false: an interrupted turn is
     * generated again from its start on the new weights (its old tokens are discarded).
     */
    partialRollout: z.boolean().default(true),
    /**
     * fully_async: most weight versions a trained sample's oldest token may lag the trainer's version
     * (older groups are regenerated from their prompt, never trained). null = 2 in fully_async, off otherwise.
     */
    maxStaleness: z.number().int().min(0).nullable().default(null),
    /**
     * fully_async: prompt groups generating at once; null = promptsPerStep × max(1, maxStaleness).
     * With lateGroups wait, fewer may: a group is launched only while the undecided groups before it
     * fit in the batches the staleness bound lets it reach.
     */
    maxInflightGroups: z.number().int().min(1).nullable().default(null),
    /**
     * fully_async: long groups that would outlast the staleness bound. wait: batches take the groups
     * in launch order (a batch waits for its slowest) and launches stay within the bound's reach, so
     * no group goes stale and long episodes are trained, not regenerated; requeue: a batch takes the
     * oldest complete groups at once and groups that go stale are generated again (which trains
     * shorter episodes than sync: the attempts that finish in time are the short ones).
     */
    lateGroups: z.enum(["wait", "requeue"]).default("wait"),
    /**
     * A black-box agent run as a command per episode through the gateway (actors/environment/agent);
     * train.task is then an agent task module (prompts and reward).
     */
    agent: agentSchema.optional(),
    /** A built-in task name (addition, guess-number) or a module path relative to the topology. */
    task: z.string().default("addition"),
    taskConfig: z.record(z.string(), z.unknown()).default({}),
    /** Model preset to initialise from (ignored when `model` is set). */
    preset: z.string().default("quickstart"),
    /** An existing model directory to start from. */
    model: z.string().optional(),
    seed: z.number().int().min(0).default(0),
    /**
     * Standard deviation of the preset's random initialisation (HF's 0.02). A LoRA policy over a random
     * base cannot move the frozen embeddings: at 0.02 no token of the quickstart model can reach more
     * than ~4 % at temperature 1, at 0.1 over 99 % (docs/policies.md).
     */
    initStd: z.number().positive().max(1).default(0.02),
    /** Training steps (each: one batch, one optimizer step, one weight version). */
    steps: z.number().int().min(1).default(100),
    /** Stop after this many seconds of wall time (checkpoint and summary as usual); 0 = no limit. */
    maxSeconds: z.number().min(0).default(0),
    promptsPerStep: z.number().int().min(1).default(16),
    samplesPerPrompt: z.number().int().min(1).default(8),
    temperature: z.number().positive().default(1),
    lr: z.number().positive().default(3e-3),
    /** Linear learning-rate warmup over the first N steps (0 = none). */
    lrWarmupSteps: z.number().int().min(0).default(0),
    /**
     * After the warmup: constant, or a linear or half-cosine decay to lr × lrMinRatio at step
     * lrDecaySteps (default: the last step, `steps`), so late steps of a converging policy move it less.
     */
    lrDecay: z.enum(["constant", "linear", "cosine"]).default("constant"),
    lrDecaySteps: z.number().int().positive().nullable().default(null),
    lrMinRatio: z.number().min(0).max(1).default(0.1),
    weightDecay: z.number().min(0).default(0),
    maxGradNorm: z.number().positive().default(1),
    beta2: z.number().min(0).max(1).default(0.99),
    /** AdamW epsilon (a larger one damps updates of rarely-used parameters, e.g. the embedding rows of rarely-sampled tokens). */
    adamEps: z.number().positive().default(1e-8),
    estimator: z.enum(estimators).default("grpo"),
    /**
     * group: critic-free, one advantage per sample from its group (`estimator`). ppo: a critic (a
     * value head on the policy's trunk, trained in the same worker) and token-level GAE advantages
     * over the model's tokens, per-turn rewards included (settings under `ppo:`); `estimator` is not used.
     */
    algorithm: z.enum(["group", "ppo"]).default("group"),
    /** PPO with a critic (algorithm: ppo). */
    ppo: z
      .object({
        /** Discount per model token (environment tokens take no step). */
        gamma: z.number().min(0).max(1).default(1),
        /** GAE λ (0: one-step TD, 1: Monte Carlo). */
        lambda: z.number().min(0).max(1).default(0.95),
        /** Weight of the value loss beside the policy loss (they share the trunk). */
        valueCoef: z.number().positive().default(0.5),
        /** Value clip ε_v around the values the returns were computed with; null = unclipped. */
        valueClip: z.number().positive().nullable().default(0.2),
        /** batch: advantages whitened over the batch's model tokens; none: raw GAE. */
        whitening: z.enum(["batch", "none"]).default("batch"),
        /**
         * shared: a value head on the policy's trunk (one forward and backward for both). separate:
         * a value model of its own (with a value head) in the same trainer worker, started from
         * `criticPreset` or, when null, from a copy of the policy's starting weights.
         */
        critic: z.enum(["shared", "separate"]).default("shared"),
        /** critic: separate: a model preset for the value model (same vocabulary as the policy); null = the policy's weights. */
        criticPreset: z.string().nullable().default(null),
      })
      .strict()
      .prefault({}),
    /** Drop groups whose rewards are all equal. */
    dropZeroVariance: z.boolean().default(false),
    /**
     * Negative-sample reinforcement (grpo, gspo, dr_grpo, rloo): each episode of a group whose rewards
     * are all equal and not above 0 gets advantage −failedGroupAdvantage instead of 0, so a policy
     * collapsed onto a failing answer for a prompt is pushed off it. 0 = off. Such groups are dropped
     * first when dropZeroVariance is on.
     */
    failedGroupAdvantage: z.number().min(0).default(0),
    /** Optimizer steps per batch (mini-batches of whole groups; PPO clipping keeps them near the rollout policy). */
    updatesPerStep: z.number().int().min(1).default(1),
    epsClip: z.number().positive().default(0.2),
    epsClipHigh: z.number().positive().optional(),
    entropyCoef: z.number().default(0),
    /**
     * Weight of a cross-entropy against the uniform distribution over the vocabulary, added to the
     * loss at every trained token. Its gradient on the logits, π − 1/V, does not vanish where a
     * collapsed policy puts probability near 1 on one token (the entropy bonus's does); 0 = off.
     */
    uniformCoef: z.number().min(0).default(0),
    /**
     * Adaptive entropy control (as in Skywork-OR1): after each step the entropy coefficient rises by
     * entropyCoefStep while the mean token entropy is below this target and falls (not below 0)
     * above it; null = the coefficient stays entropyCoef.
     */
    entropyTarget: z.number().positive().nullable().default(null),
    entropyCoefStep: z.number().positive().default(0.005),
    /** Upper bound of the adaptive coefficient (null = none): without one it winds up while the entropy stays below target. */
    entropyCoefMax: z.number().positive().nullable().default(null),
    /**
     * The target moves linearly from entropyTarget at step 0 to entropyTargetFinal at step
     * entropyTargetSteps and stays there (null = a constant target). A floor that suits exploring is
     * above the entropy of a policy that has learned: held there, it pulls the learned policy back.
     */
    entropyTargetFinal: z.number().positive().nullable().default(null),
    entropyTargetSteps: z.number().int().positive().default(1000),
    /**
     * How new weights reach the engines: full (the trainer's checkpoint directory) or delta (a
     * lossless delta against the previous version, actors/weight-sync/delta-sync.ts; an engine that
     * cannot take it loads the full checkpoint, recorded).
     */
    weightSync: z.enum(["full", "delta"]).default("full"),
    /** Delta wire: fp32 (the trainer's weights bit for bit) or bf16 (rounded to bf16, as RL systems ship to SGLang). */
    weightSyncWire: z.enum(["fp32", "bf16"]).default("fp32"),
    /**
     * Keep the engines' prefix caches across a weight update (SGLang's `flush_cache: false`), as
     * PipelineRL keeps its KV: the turns an update aborts resume, and the next turns of episodes in
     * flight start, over keys and values computed by the previous weights instead of prefilling their
     * conversations again. Their new tokens are sampled (and their logprobs recorded) by the new
     * weights over that older context. Default false: an update flushes the caches, as SGLang does.
     */
    keepCacheOnUpdate: z.boolean().default(false),
    /**
     * How a weight update pauses the engines (SGLang's /pause_generation mode): `abort` (default)
     * ends the running requests, which the rollout dispatches again with the tokens they had
     * (partial rollout); `in_place` keeps them in the engines' batches, to go on under the new
     * weights after the update, with their KV — one exchange instead of two, and no re-prefill. Needs
     * keepCacheOnUpdate (the caches cannot be flushed under running requests). A request that runs
     * across an update is recorded under the older version unless the fleet streams (`fleet.stream`:
     * then per token).
     */
    pauseOnUpdate: z.enum(["abort", "in_place"]).default("abort"),
    /** Checkpoint every K steps (and at exit). */
    checkpointEvery: z.number().int().min(1).default(20),
    /** Checkpoint directories kept (the newest ones). */
    keepCheckpoints: z.number().int().min(1).default(3),
    /**
     * Write OUT/samples.jsonl: every trained sample's tokens and which of them the model sampled
     * (loss mask 1), one line per sample. ooze/testing's tokensAsSampled checks them against what
     * the engines returned. Off by default: it grows with the run.
     */
    recordTokens: z.boolean().default(false),
    /**
     * The dashboard's trajectory explorer (app/dash/explorer.ts): the trainer writes each step's
     * samples — trained ones with their advantage, and the step's failed episodes — to
     * OUT/explorer/step-NNNNNNNN.jsonl (token ids, loss mask and logprobs as base64 typed arrays,
     * weight-version spans, reward, group, status, metadata with agent transcripts), keeping the
     * files of the newest keepSteps steps; keepSteps 0 writes none.
     */
    explorer: z
      .object({ keepSteps: z.number().int().min(0).default(20) })
      .strict()
      .prefault({}),
    /**
     * Which trainer worker trains: the native C++ worker (the default: no Python, CPU), or the
     * PyTorch worker (python/ooze_torch: any transformers causal LM, CPU or CUDA, bf16 or fp32 with
     * fp32 master weights, FSDP2 across `gpus` ranks). `ooze setup torch` prepares its Python.
     */
    trainer: z
      .object({
        backend: z.enum(["native", "torch"]).default("native"),
        /** torch: auto = cuda when torch sees a GPU, else cpu. */
        device: z.enum(["auto", "cpu", "cuda"]).default("auto"),
        /** torch: compute precision (weights and optimizer stay fp32). */
        dtype: z.enum(["fp32", "bf16"]).default("fp32"),
        /** torch: ranks of the FSDP2 group (one GPU each on cuda; processes over gloo on cpu). */
        gpus: z.number().int().min(1).default(1),
        /** torch: recompute each layer's activations in the backward (less memory, more time). */
        gradientCheckpointing: z.boolean().default(false),
        /** torch: CPU threads per rank (null: torch's default). */
        threads: z.number().int().min(1).nullable().default(null),
      })
      .strict()
      .prefault({})
      .superRefine((t, ctx) => {
        if (t.backend === "native" && (t.device !== "auto" || t.dtype !== "fp32" || t.gpus !== 1 || t.gradientCheckpointing))
          ctx.addIssue({ code: "custom", message: "device, dtype, gpus and gradientCheckpointing apply to backend: torch (the native worker trains fp32 on CPU)" });
      }),
    /** Training micro-batch size in tokens (bounds activation memory); null = whole batch. */
    microBatchTokens: z.number().int().min(1).nullable().default(null),
    /**
     * Benchmarks at scale: a simulated trainer instead of the native worker (actors/trainer/sim-trainer.ts):
     * a step takes stepOverheadMs + its batch's tokens / tokensPerSecond, and trains nothing.
     */
    simulate: z
      .object({ tokensPerSecond: z.number().positive(), stepOverheadMs: z.number().min(0).default(0) })
      .strict()
      .nullable()
      .default(null),
    /**
     * What trains over the model (actors/protocol/policies.ts): `{NAME: {lora: {rank, alpha, targets,
     * rslora}} | {full: true}}`. Absent: the full model, as one policy. Several policies (LoRA adapters
     * over the one base, or full models of their own starting from it) are one per role of the task
     * (`roles`) or picked by an agent's requests.
     */
    policies: policiesSchema,
    /**
     * A task played by several roles: each role's policy (`{describer: describer, guesser: guesser}`),
     * or `{policy, contexts}`: the role plays `contexts` independent contexts of its own wherever the
     * task opens one (e.g. 8 guesses of one message: the guesser's group baseline is then its own
     * guesses of that message, and the describer's reward the mean of them).
     */
    roles: z.record(z.string().min(1), roleSchema).nullable().default(null),
  })
  .strict()
  .superRefine((t, ctx) => {
    for (const [role, r] of Object.entries(t.roles ?? {})) {
      const p = typeof r === "string" ? r : r.policy;
      if (!t.policies?.[p]) ctx.addIssue({ code: "custom", path: ["roles", role], message: `policy '${p}' is not one of policies (${Object.keys(t.policies ?? {}).join(", ") || "none"})` });
    }
    if (t.pauseOnUpdate === "in_place" && !t.keepCacheOnUpdate)
      ctx.addIssue({ code: "custom", path: ["pauseOnUpdate"], message: "in_place keeps the running requests' KV across the update, so the caches cannot be flushed: set keepCacheOnUpdate: true" });
    if (!t.policies) return;
    const names = Object.keys(t.policies);
    if (names.length === 0) ctx.addIssue({ code: "custom", path: ["policies"], message: "name at least one policy, or leave policies out (the full model trains)" });
    if (names.length > 1) {
      if (!t.roles && !t.agent)
        ctx.addIssue({ code: "custom", path: ["roles"], message: `several policies (${names.join(", ")}): map the task's roles to them with roles: {ROLE: POLICY} (an agent picks them by the requests' model field)` });
      if (t.roles && t.agent) ctx.addIssue({ code: "custom", path: ["roles"], message: "an agent picks its policies by the requests' model field; leave roles out" });
      if (t.algorithm === "ppo") ctx.addIssue({ code: "custom", path: ["algorithm"], message: "several policies train with group advantages only so far (algorithm: group)" });
      if (t.weightSync === "delta") ctx.addIssue({ code: "custom", path: ["weightSync"], message: "several policies are synced whole, one directory per policy; use weightSync: full" });
    }
    const lora = Object.entries(t.policies).find(([, p]) => "lora" in p);
    if (lora && t.weightSync === "delta")
      ctx.addIssue({ code: "custom", path: ["weightSync"], message: `policy ${lora[0]} is a LoRA adapter, which is synced whole (it is small); use weightSync: full` });
    if (lora && t.algorithm === "ppo" && t.ppo.critic === "separate")
      ctx.addIssue({ code: "custom", path: ["ppo", "critic"], message: "a separate value model with a LoRA policy is not supported; use critic: shared" });
  });

/** Schema of `engines:` (embedded engines started by `ooze train`, or external URLs). */
export const enginesSchema = z
  .object({
    count: z.number().int().min(0).default(1),
    maxRunning: z.number().int().min(1).default(128),
    cacheTokens: z.number().int().min(1).default(32768),
    /** External SGLang-compatible servers to use in addition to (or instead of) embedded ones. */
    urls: z.array(z.string().url()).default([]),
  })
  .strict();

export type TrainConfig = z.infer<typeof trainSchema>;
export type EnginesConfig = z.infer<typeof enginesSchema>;

/** The topology's `train:` and `engines:` sections, checked; errors name the field. */
export function trainConfigOf(topo: Pick<Topology, "train" | "engines" | "file">): { train: TrainConfig; engines: EnginesConfig } {
  const where = topo.file ?? "topology";
  const t = trainSchema.safeParse(topo.train ?? {});
  if (!t.success) throw new OozeError("CONFIG_INVALID", `${where}: train: ${issues(t.error)}`);
  const e = enginesSchema.safeParse(topo.engines ?? {});
  if (!e.success) throw new OozeError("CONFIG_INVALID", `${where}: engines: ${issues(e.error)}`);
  if (e.data.count === 0 && e.data.urls.length === 0)
    throw new OozeError("CONFIG_INVALID", `${where}: engines: count is 0 and no urls are given; the loop needs at least one engine`);
  return { train: t.data, engines: e.data };
}

/** The staleness bound and look-ahead fully_async runs with (defaults filled in). */
export function fullyAsyncLimits(cfg: TrainConfig): { maxStaleness: number; maxInflightGroups: number } {
  const maxStaleness = cfg.maxStaleness ?? 2;
  return { maxStaleness, maxInflightGroups: cfg.maxInflightGroups ?? cfg.promptsPerStep * Math.max(1, maxStaleness) };
}

function issues(err: z.ZodError): string {
  return err.issues.map((i) => `${i.path.join(".") || "(section)"}: ${i.message}`).join("; ");
}
