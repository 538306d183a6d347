// The GPU serving model of the simulated engine: how long one prefill or decode forward pass takes,
// read from a small table (decode tokens/s by batch size and context length; prefill tokens/s by
// chunk size) with interpolation between its points, plus the KV cache's capacity in tokens and the
// time a weight update takes. The default table stands for Llama-3.1-8B-Instruct in bf16 served by
// SGLang on one H100 80GB (SXM); where each number comes from is said next to it.
import { z } from "zod";
import { OozeError } from "../../errors.ts";

/** A serving model: the table and the engine's limits. */
export interface PerfTable {
  /** What it stands for (shown in /model_info's model_path). */
  name: string;
  /** Batch sizes of the decode table's rows (ascending). */
  decodeBatch: number[];
  /** Context lengths (tokens per sequence) of its columns (ascending). */
  decodeContext: number[];
  /** decodeTokensPerSecond[i][j]: output tokens/s of the whole batch at decodeBatch[i], decodeContext[j]. */
  decodeTokensPerSecond: number[][];
  /** Prefill chunk sizes (tokens in one forward pass, ascending). */
  prefillTokens: number[];
  /** Prefill throughput (tokens/s) at those chunk sizes. */
  prefillTokensPerSecond: number[];
  /** Largest prefill chunk per forward pass (SGLang's chunked_prefill_size). */
  chunkTokens: number;
  /** KV cache capacity in tokens (SGLang's max_total_num_tokens). */
  kvTokens: number;
  /** Requests decoding together at most (SGLang's max_running_requests). */
  maxRunning: number;
  /** Time of one /update_weights_from_disk, ms. */
  updateWeightsMs: number;
  /** Longest context a request may have. */
  maxContext: number;
}

// Calibration of the default table (Llama-3.1-8B-Instruct, bf16, SGLang, one H100 80GB SXM):
// - Large-batch decode: 16,215 output tokens/s for SGLang offline on ShareGPT (1,000 prompts; short
//   contexts, a few hundred tokens) in AIMultiple's engine comparison (research.aimultiple.com/
//   inference-engines, Llama 3.1 8B-Instruct, bf16, H100 80GB). The 256-sequence row at 512 tokens of
//   context is set to that plateau (~16k tokens/s).
// - Single-sequence decode: not taken from a publication (none found with SGLang, this model and an
//   H100 together) but from the hardware: a decode step reads all 16 GB of bf16 weights, at H100 SXM's
//   3.35 TB/s at least 4.8 ms; 6.5 ms a step (~155 tokens/s) is assumed for kernel launch and
//   scheduling overhead.
// - Context: each sequence's KV cache is read every step: 128 KiB a token for this model (32 layers ×
//   8 KV heads × 128 dims × K and V × 2 bytes), at ~3 TB/s effective; the columns add that time.
// - Prefill: compute-bound, ~16 GFLOP a token (2 × 8e9 parameters); at ~40 % of the H100's 989 dense
//   bf16 TFLOP/s that is ~25k tokens/s for large chunks; small chunks are held up by the same ~6 ms a
//   forward pass costs at least. An assumption, stated, not a measurement.
// - KV capacity: with mem_fraction_static ≈ 0.88 of 80 GB, minus 16 GB of weights and activations,
//   ~50 GB of KV pool / 128 KiB ≈ 400k tokens (SGLang prints this figure as max_total_num_tokens).
// - chunked_prefill_size 8192 and max_running_requests 256: SGLang's defaults on an H100 for this size.
// - Weight update: 1.5 s assumed for reloading 16 GB of weights (from page cache / over NCCL).
// Replace any of it with measured figures: `ooze sim-engine --table FILE.json` (this shape).

const STEP_MS = 6.5; // one decode step of a single short sequence
const PER_SEQ_MS = 0.015; // per-sequence compute and scheduling in a decode step
const KV_BYTES = 131_072; // bytes of KV cache per token
const KV_BW = 3.0e12; // effective bytes/s reading the KV cache

function decodeRate(batch: number, context: number): number {
  const ms = STEP_MS + PER_SEQ_MS * batch + (batch * context * KV_BYTES * 1000) / KV_BW;
  return Math.round((batch * 1000) / ms);
}

const DECODE_BATCH = [1, 8, 32, 64, 128, 256, 512];
const DECODE_CONTEXT = [512, 2048, 8192, 32768];

/** The default table (see the calibration notes above). */
export const H100_LLAMA_8B: PerfTable = {
  name: "sim:llama-3.1-8b-instruct-bf16@h100-sglang",
  decodeBatch: DECODE_BATCH,
  decodeContext: DECODE_CONTEXT,
  decodeTokensPerSecond: DECODE_BATCH.map((b) => DECODE_CONTEXT.map((c) => decodeRate(b, c))),
  prefillTokens: [16, 128, 512, 2048, 8192],
  prefillTokensPerSecond: [2_400, 15_000, 22_000, 25_000, 25_000],
  chunkTokens: 8192,
  kvTokens: 400_000,
  maxRunning: 256,
  updateWeightsMs: 1500,
  maxContext: 131_072,
};

const ascending = (xs: number[]) => xs.every((x, i) => i === 0 || x > xs[i - 1]!);
const tableSchema = z
  .object({
    name: z.string().min(1),
    decodeBatch: z.array(z.number().positive()).min(1).refine(ascending, "must be ascending"),
    decodeContext: z.array(z.number().positive()).min(1).refine(ascending, "must be ascending"),
    decodeTokensPerSecond: z.array(z.array(z.number().positive())),
    prefillTokens: z.array(z.number().positive()).min(1).refine(ascending, "must be ascending"),
    prefillTokensPerSecond: z.array(z.number().positive()),
    chunkTokens: z.number().int().positive(),
    kvTokens: z.number().int().positive(),
    maxRunning: z.number().int().positive(),
    updateWeightsMs: z.number().min(0),
    maxContext: z.number().int().positive(),
  })
  .strict();

/** Checks a table (e.g. from a JSON file); errors name `where` and the field. */
export function parsePerfTable(value: unknown, where: string): PerfTable {
  const r = tableSchema.safeParse(value);
  if (!r.success) throw new OozeError("CONFIG_INVALID", `${where}: ${r.error.issues.map((i) => `${i.path.join(".") || "(table)"}: ${i.message}`).join("; ")}`);
  const t = r.data;
  if (t.decodeTokensPerSecond.length !== t.decodeBatch.length || t.decodeTokensPerSecond.some((row) => row.length !== t.decodeContext.length))
    throw new OozeError("CONFIG_INVALID", `${where}: decodeTokensPerSecond must have ${t.decodeBatch.length} rows (decodeBatch) of ${t.decodeContext.length} values (decodeContext)`);
  if (t.prefillTokensPerSecond.length !== t.prefillTokens.length)
    throw new OozeError("CONFIG_INVALID", `${where}: prefillTokensPerSecond must have ${t.prefillTokens.length} values (prefillTokens)`);
  return t;
}

/** Where x falls between the points xs: the lower index and the weight of the upper one (clamped at the ends). */
function bracket(xs: readonly number[], x: number, log: boolean): [number, number] {
  if (x <= xs[0]!) return [0, 0];
  const last = xs.length - 1;
  if (x >= xs[last]!) return [last, 0];
  let i = 0;
  while (xs[i + 1]! < x) i++;
  const f = log ? (Math.log(x) - Math.log(xs[i]!)) / (Math.log(xs[i + 1]!) - Math.log(xs[i]!)) : (x - xs[i]!) / (xs[i + 1]! - xs[i]!);
  return [i, f];
}

/** Milliseconds of one decode step of `batch` sequences averaging `context` tokens. */
export function decodeStepMs(t: PerfTable, batch: number, context: number): number {
  if (batch <= 0) return 0;
  // Interpolate step time (not throughput): linear in batch size, log-linear in context.
  const stepAt = (i: number, j: number) => (t.decodeBatch[i]! * 1000) / t.decodeTokensPerSecond[i]![j]!;
  const [i, fi] = bracket(t.decodeBatch, batch, false);
  const [j, fj] = bracket(t.decodeContext, Math.max(1, context), true);
  const i2 = Math.min(i + 1, t.decodeBatch.length - 1);
  const j2 = Math.min(j + 1, t.decodeContext.length - 1);
  const lo = stepAt(i, j) * (1 - fj) + stepAt(i, j2) * fj;
  const hi = stepAt(i2, j) * (1 - fj) + stepAt(i2, j2) * fj;
  let ms = lo * (1 - fi) + hi * fi;
  // Beyond the largest batch of the table: throughput stays at its plateau.
  const maxB = t.decodeBatch[t.decodeBatch.length - 1]!;
  if (batch > maxB) ms *= batch / maxB;
  return ms;
}

/** Milliseconds of one prefill forward pass over `tokens` new tokens. */
export function prefillMs(t: PerfTable, tokens: number): number {
  if (tokens <= 0) return 0;
  const [i, f] = bracket(t.prefillTokens, tokens, true);
  const i2 = Math.min(i + 1, t.prefillTokens.length - 1);
  const rate = t.prefillTokensPerSecond[i]! * (1 - f) + t.prefillTokensPerSecond[i2]! * f;
  return (tokens * 1000) / rate;
}
