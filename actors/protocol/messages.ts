// The protocol of the training loop's actors on JetStream (msgpack, typed arrays intact, validated
// once at the edge): prompt groups to generate, each group's finished samples, training batches,
// and new weight versions; plus the version record kept in the job's versions KV bucket.
import { z } from "zod";
import { createRegistry, defineMessage, zFloat32Array, zInt32Array, zUint8Array } from "../../src/codec/index.ts";
import { sampleProblem, type Sample } from "../../src/sample.ts";

const index = z.number().int().min(0);

const sampleFields = {
  index,
  groupIndex: index,
  rolloutId: z.string(),
  prompt: z.unknown(),
  tokens: zInt32Array(),
  responseLength: index,
  lossMask: zUint8Array(),
  rolloutLogprobs: zFloat32Array(),
  reward: z.number().nullable(),
  status: z.enum(["pending", "completed", "truncated", "aborted", "failed"]),
  weightVersions: z.array(z.object({ start: index, end: index, version: z.string() })),
  metadata: z.record(z.string(), z.unknown()),
  policy: z.string().optional(),
};

const aligned = (s: Sample, ctx: z.RefinementCtx) => {
  const p = sampleProblem(s);
  if (p !== null) ctx.addIssue({ code: "custom", message: p });
};

/** A Sample on the wire (lengths checked with sampleProblem). */
export const sampleSchema = z.object(sampleFields).superRefine((s, ctx) => aligned(s as Sample, ctx)) as unknown as z.ZodType<Sample>;
/** A sample with the advantage the trainer uses for its model tokens: what a batch carries. */
export interface TrainSample extends Sample {
  advantage: number;
}

/** A TrainSample on the wire. */
export const trainSampleSchema = z
  .object({ ...sampleFields, advantage: z.number() })
  .superRefine((s, ctx) => aligned(s as Sample, ctx)) as unknown as z.ZodType<TrainSample>;

/** A prompt group of the data stream: its prompt index and its sample indices [firstSample, firstSample + count). */
export const pendingGroup = z.object({
  prompt: index,
  firstSample: index,
  count: z.number().int().min(1),
  /** 0 for the prompt's first generation; n for its n-th regeneration after it went stale (fully_async). */
  attempt: index.default(0),
});
/** A prompt group launched and not yet trained, dropped or requeued. */
export type PendingGroup = z.output<typeof pendingGroup>;

/** The msgID of a prompt group: one per prompt and attempt, so a re-fed group is stored once. */
export const promptMsgId = (prompt: number, attempt: number) => (attempt === 0 ? `prompt-${prompt}` : `prompt-${prompt}-a${attempt}`);

/** One prompt group to generate (PROMPTS, a work queue; msgID promptMsgId(groupIndex, attempt)). */
export const promptGroup = defineMessage({
  kind: "train.prompt-group",
  v: 1,
  schema: z.object({
    /** The prompt's index: the task's reset index and the group index. */
    groupIndex: index,
    /** Sample indices are firstSample … firstSample + samples - 1 (the same on every redelivery). */
    firstSample: index,
    samples: z.number().int().min(1),
    /** The training step this group is generated for (fully_async: the step the trainer was on at launch + 1). */
    step: z.number().int().min(1),
    /** Regeneration count of this prompt (fully_async requeues a stale group under new sample indices). */
    attempt: index.default(0),
  }),
});

/** The msgID of a prompt group's samples: one per prompt and attempt, so a regenerated group is stored once. */
export const groupMsgId = (prompt: number, attempt: number) => (attempt === 0 ? `group-${prompt}` : `group-${prompt}-a${attempt}`);

/**
 * One prompt group's finished episodes, as one message (SAMPLES; msgID groupMsgId(groupIndex,
 * attempt)): its samples in index order (a failed episode is a sample with status "failed"), then
 * what the buffer needs to decide the group.
 */
export const groupMsg = defineMessage({
  kind: "train.group",
  v: 1,
  schema: z
    .object({
      groupIndex: index,
      /** The group's first sample index and attempt, as its prompt message said. */
      firstSample: index,
      attempt: index.default(0),
      samples: z.array(sampleSchema),
      /** Prefix-cache counters of the rollout's engines while it generated the group (approximate per group). */
      promptTokens: index,
      cachedTokens: index,
    })
    .superRefine((g, ctx) => {
      for (const [i, s] of g.samples.entries())
        if (s.groupIndex !== g.groupIndex) ctx.addIssue({ code: "custom", path: ["samples", i, "groupIndex"], message: `sample ${s.index} has groupIndex ${s.groupIndex}, not the group's ${g.groupIndex}` });
    }),
});
/** A group message's body. */
export type GroupBody = z.output<typeof groupMsg.schema>;

/** Counters of the rollouts behind one batch, for metrics.jsonl. */
export const rolloutStats = z.object({
  /** Samples generated for the batch (trained or dropped). */
  generated: index,
  /** reward_mean, reward_max_frac and success_rate of metrics.jsonl (actors/protocol/metrics.ts). */
  rewards: z.object({ reward_mean: z.number(), reward_max_frac: z.number(), success_rate: z.number() }),
  failed: index,
  droppedGroups: index,
  rolloutSeconds: z.number().min(0),
  promptTokens: index,
  cachedTokens: index,
});

/** One training batch (BATCHES; msgID `batch-<step>`). */
export const batchMsg = defineMessage({
  kind: "train.batch",
  v: 1,
  schema: z.object({
    step: z.number().int().min(1),
    samples: z.array(trainSampleSchema),
    groups: z.array(index),
    /** Sample indices generated for this batch and not trained (filtered groups, failed episodes). */
    dropped: z.array(index),
    stalenessMax: index,
    /** Data position after this batch (the next prompt and sample index the buffer feeds). */
    nextPrompt: index,
    nextSample: index,
    /** fully_async: groups launched (or queued) and not decided when the batch was cut: a resumed run generates them again. */
    pending: z.array(pendingGroup).default([]),
    /** fully_async: sample indices and prompts of groups requeued as stale since the previous batch. */
    requeued: z.array(index).default([]),
    requeuedPrompts: z.array(index).default([]),
    /** fully_async: prompts trained in this batch, and prompts dropped (filter, failed, too stale too often) since the previous one. */
    trainedPrompts: z.array(index).default([]),
    droppedPrompts: z.array(index).default([]),
    /** The batch's failed episodes in full (only with train.explorer on; at most MAX_FAILED_SAMPLES): the trainer's explorer files show them. */
    failedSamples: z.array(sampleSchema).default([]),
    stats: rolloutStats,
  }),
});

/** Failed episodes a batch carries for the explorer at most (the rest are only counted and listed in `dropped`). */
export const MAX_FAILED_SAMPLES = 16;

type BatchFields = z.output<typeof batchMsg.schema>;
type FullyAsyncFields = "pending" | "requeued" | "requeuedPrompts" | "trainedPrompts" | "droppedPrompts" | "failedSamples";
/** A batch message's body (the fully_async fields default to empty). */
export type BatchBody = Omit<BatchFields, FullyAsyncFields> & Partial<Pick<BatchFields, FullyAsyncFields>>;

/** The trainer's weights after a step (WEIGHTS; msgID `weights-<step>`). */
export const weightsMsg = defineMessage({
  kind: "train.weights",
  v: 1,
  schema: z.object({
    /** Weight version (unchanged when the step had nothing to train on). */
    version: index,
    /** Model directory (HF safetensors) of that version, on a filesystem every node sees. */
    modelDir: z.string().min(1),
    /** Steps trained so far. */
    step: index,
    /** The data position after that step (where a fresh buffer of a resumed run starts). */
    position: z.object({ nextPrompt: index, nextSample: index, pending: z.array(pendingGroup).default([]) }),
  }),
});

/** One trained step's metrics (METRICS stream; msgID `metrics-<step>`): what the trainer appends to metrics.jsonl. */
export const stepMetricsMsg = defineMessage({
  kind: "train.step-metrics",
  v: 1,
  // Values are numbers, or arrays of numbers (staleness_hist).
  schema: z.object({ step: z.number().int().min(1), metrics: z.record(z.string(), z.union([z.number(), z.array(z.number())])) }),
});

/** What the rollout consumes. */
export const promptRegistry = createRegistry(promptGroup);
/** What the buffer consumes. */
export const groupRegistry = createRegistry(groupMsg);
/** What the trainer consumes. */
export const batchRegistry = createRegistry(batchMsg);
/** What weight-sync consumes. */
export const weightsRegistry = createRegistry(weightsMsg);
/** What progress displays consume. */
export const metricsRegistry = createRegistry(stepMetricsMsg);

/** The job's weight-version record (versions KV, key `latest`): only ever increases. */
export const versionRecord = z.object({
  version: z.number().int().min(-1),
  modelDir: z.string(),
  step: index,
  at: z.number(),
  /** How the version reached the engines (weight-sync; dashboards): full checkpoint or delta, bytes sent, and the full checkpoint's size. */
  sync: z.object({ kind: z.enum(["full", "delta"]), bytes: index, fullBytes: index }).optional(),
});
/** A version record. */
export type VersionRecord = z.infer<typeof versionRecord>;
