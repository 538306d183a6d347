// Supervised fine-tuning (`ooze sft`): JSONL examples — prompt/completion pairs or chat messages
// rendered with the model's chat template — become token sequences with a loss mask (1 only on what
// the assistant says, its end-of-turn token included), and the native trainer worker takes
// cross-entropy steps on them: the gradient of −(1/N)·Σ log π(token) over the N masked tokens of the
// step (Trainer.backward with dlogp = −mask/N, then clip + AdamW), so no clipping and no ratio. The
// result is an HF checkpoint directory.
import { copyFileSync, existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../../src/errors.ts";
import { mulberry32 } from "../../src/random.ts";
import { TrainerWorker } from "../../native/worker/client.ts";
import { parseOpenAIRequest, type ChatTemplate, type ChatTokenizer } from "../../src/gateway/index.ts";
import { learningRate, type PolicyTrainerConfig } from "./policy-trainer.ts";

/** Files of a model directory that are not weights and are copied to the SFT checkpoint (and to `ooze train`'s checkpoints). */
export const TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "chat_template.jinja"];

/** Copies the tokenizer and chat template files `from` has into `to`, so a checkpoint serves as it is (with the model's own tokenizer). */
export function copyTokenizerFiles(from: string, to: string): void {
  for (const f of TOKENIZER_FILES) if (existsSync(join(from, f))) copyFileSync(join(from, f), join(to, f));
}

/** One training sequence: ids and, per id, whether its logprob is trained (position 0 never is). */
export interface SftExample {
  tokens: Int32Array;
  mask: Uint8Array;
  /** file:line it came from, for messages. */
  where: string;
}

/** What SFT needs to turn text into ids. */
export interface SftTokenizer {
  encode(text: string): number[];
  /** Prepended to every sequence, or null. */
  bos: number | null;
  /** Appended to each completion (trained: the model learns to stop). */
  eos: number;
}

/** A sequence to train on, in pieces: text (mask 0) and assistant turns (mask 1). */
export type SftPieces = { ids: number[]; train: boolean }[];

/**
 * Renders a chat example with the model's chat template into one sequence, or several where the
 * template renders an earlier turn differently once the conversation goes on (Qwen3 drops the
 * reasoning of turns before the last user message).
 */
export type ChatRenderer = (messages: unknown[], tools: unknown[] | null, where: string) => SftPieces[];

/**
 * Reads a JSONL file of `{"prompt", "completion"}` or `{"messages": [...], "tools"?: [...]}` lines
 * (blank lines skipped). Errors name file:line and the field.
 */
export function readSftJsonl(file: string, tok: SftTokenizer, chat: ChatRenderer | null): SftExample[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `${file}: cannot read: ${(e as Error).message}`, { cause: e });
  }
  const out: SftExample[] = [];
  text.split("\n").forEach((line, i) => {
    const where = `${file}:${i + 1}`;
    if (line.trim() === "") return;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new OozeError("CONFIG_INVALID", `${where}: not JSON: ${(e as Error).message}`);
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new OozeError("CONFIG_INVALID", `${where}: each line must be a JSON object with prompt/completion or messages`);
    const o = v as Record<string, unknown>;
    let sequences: SftPieces[];
    if ("messages" in o) {
      if (!Array.isArray(o.messages) || o.messages.length === 0) throw new OozeError("CONFIG_INVALID", `${where}: field 'messages' must be a non-empty array`);
      if (o.tools !== undefined && !Array.isArray(o.tools)) throw new OozeError("CONFIG_INVALID", `${where}: field 'tools' must be an array`);
      if (!chat) throw new OozeError("CONFIG_INVALID", `${where}: chat messages need the model's chat template, and none is available for this model`);
      sequences = chat(o.messages, (o.tools as unknown[] | undefined) ?? null, where);
    } else {
      for (const f of ["prompt", "completion"] as const)
        if (typeof o[f] !== "string") throw new OozeError("CONFIG_INVALID", `${where}: field '${f}' must be a string (or give 'messages')`);
      const pieces: SftPieces = [];
      if (tok.bos !== null) pieces.push({ ids: [tok.bos], train: false });
      pieces.push({ ids: tok.encode(o.prompt as string), train: false }, { ids: [...tok.encode(o.completion as string), tok.eos], train: true });
      sequences = [pieces];
    }
    for (const pieces of sequences) {
      const n = pieces.reduce((a, p) => a + p.ids.length, 0);
      const tokens = new Int32Array(n), mask = new Uint8Array(n);
      let at = 0;
      for (const p of pieces) {
        tokens.set(p.ids, at);
        if (p.train) mask.fill(1, at, at + p.ids.length);
        at += p.ids.length;
      }
      mask[0] = 0; // the first token has no logprob
      if (!mask.includes(1)) throw new OozeError("CONFIG_INVALID", `${where}: nothing to learn (no assistant / completion tokens)`);
      out.push({ tokens, mask, where });
    }
  });
  if (out.length === 0) throw new OozeError("CONFIG_INVALID", `${file}: no examples`);
  return out;
}

/**
 * SFT hyperparameters. The learning-rate schedule is the RL trainer's (`learningRate`): linear warmup
 * over `lrWarmupSteps` (default none), then `lrDecay` (default constant) to lr × `lrMinRatio` (default
 * 0.1) at the last step.
 */
export interface SftOptions extends Pick<PolicyTrainerConfig, "lrWarmupSteps" | "lrDecay" | "lrMinRatio"> {
  /** Model directory to start from (HF checkpoint). */
  modelDir: string;
  out: string;
  steps: number;
  /** Examples per step. */
  batch: number;
  /** Peak AdamW learning rate. */
  lr: number;
  seed: number;
  maxGradNorm?: number;
  weightDecay?: number;
  /** Steps between loss measurements (default 10; the first and last step are always measured). */
  lossEvery?: number;
  /**
   * Stop early once the mean of the last UNTIL_LOSS_WINDOW measured losses is at most this (the
   * learning-rate schedule still spans `steps`).
   */
  untilLoss?: number;
  /** After each step (loss NaN where not measured). */
  onStep?: (s: { step: number; loss: number; tokens: number; gradNorm: number; lr: number }) => void;
}

/** Packs examples into one batch: ids, cuSeqlens and dlogp = −mask/N (N = masked tokens of the step). */
export function packSft(examples: readonly SftExample[]): { tokens: Int32Array; cuSeqlens: Int32Array; dLogprobs: Float32Array; mask: Uint8Array; n: number } {
  const total = examples.reduce((a, e) => a + e.tokens.length, 0);
  const tokens = new Int32Array(total), cuSeqlens = new Int32Array(examples.length + 1), mask = new Uint8Array(total);
  let at = 0;
  examples.forEach((e, i) => {
    tokens.set(e.tokens, at);
    mask.set(e.mask, at);
    at += e.tokens.length;
    cuSeqlens[i + 1] = at;
  });
  let n = 0;
  for (const m of mask) n += m;
  const dLogprobs = new Float32Array(total);
  for (let t = 0; t < total; t++) if (mask[t]) dLogprobs[t] = -1 / n;
  return { tokens, cuSeqlens, dLogprobs, mask, n };
}

/** How many measured losses `untilLoss` averages (with the default lossEvery, the last ~50 steps). */
export const UNTIL_LOSS_WINDOW = 5;

/** What `runSft` did: `steps` run (fewer than asked when `untilLoss` was reached), `recentLoss` the mean of the last measured losses. */
export interface SftResult {
  firstLoss: number;
  lastLoss: number;
  recentLoss: number;
  /** Whether `untilLoss` stopped the run (null without one). */
  reached: boolean | null;
  steps: number;
  tokens: number;
}

/**
 * Trains up to `steps` cross-entropy steps over shuffled epochs of `examples` (fewer when
 * `untilLoss` is reached) and saves the model to `out`.
 */
export async function runSft(examples: readonly SftExample[], o: SftOptions): Promise<SftResult> {
  const worker = await TrainerWorker.start({ source: { modelDir: o.modelDir } });
  const rand = mulberry32(o.seed);
  let order: number[] = [];
  const next = (): SftExample => {
    if (order.length === 0) {
      order = examples.map((_, i) => i);
      for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(rand() * (i + 1));
        [order[i], order[j]] = [order[j]!, order[i]!];
      }
    }
    return examples[order.pop()!]!;
  };
  let firstLoss = NaN, lastLoss = NaN, tokens = 0, done = 0;
  let reached: boolean | null = o.untilLoss === undefined ? null : false;
  const recent: number[] = [];
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  try {
    for (let step = 1; step <= o.steps; step++) {
      const batch = Array.from({ length: Math.min(o.batch, examples.length) }, next);
      const p = packSft(batch);
      const packed = { tokens: p.tokens, cuSeqlens: p.cuSeqlens };
      // the loss costs a forward pass of its own: measured on the first, every `lossEvery`-th and the last step
      let loss = NaN;
      if (step === 1 || step % (o.lossEvery ?? 10) === 0 || step === o.steps) {
        const { logprobs } = await worker.logprobs(packed, 1);
        loss = 0;
        for (let t = 0; t < p.tokens.length; t++) if (p.mask[t]) loss -= logprobs[t]! / p.n;
      }
      await worker.zeroGrads();
      await worker.backward(packed, 1, p.dLogprobs, new Float32Array(p.tokens.length));
      const lr = learningRate({ ...o, lrDecaySteps: o.steps }, step);
      const r = await worker.applyGrads({ lr, maxGradNorm: o.maxGradNorm ?? 1, weightDecay: o.weightDecay ?? 0 });
      if (step === 1) firstLoss = loss;
      if (!Number.isNaN(loss)) {
        lastLoss = loss;
        recent.push(loss);
        if (recent.length > UNTIL_LOSS_WINDOW) recent.shift();
      }
      tokens += p.n;
      done = step;
      o.onStep?.({ step, loss, tokens: p.n, gradNorm: r.gradNorm, lr });
      if (o.untilLoss !== undefined && recent.length === UNTIL_LOSS_WINDOW && !Number.isNaN(loss) && mean(recent) <= o.untilLoss) {
        reached = true;
        break;
      }
    }
    await worker.save(o.out, "sft");
    // The tokenizer travels with the weights, so the checkpoint serves as it is.
    copyTokenizerFiles(o.modelDir, o.out);
  } finally {
    await worker.close();
  }
  return { firstLoss, lastLoss, recentLoss: mean(recent), reached, steps: done, tokens };
}

/**
 * The chat renderer of a model: OpenAI-format messages (and tools) rendered with its chat template
 * exactly as the gateway renders an agent's requests. Each assistant message is what the template
 * writes for it after its prompt (the rendering of the messages before it, with the generation
 * prompt), up to and including the end-of-turn id: its text, reasoning and tool calls exactly as the
 * template writes them, so the model learns to sample what the gateway will render back — trained
 * (mask 1); everything else (template, system, user, tool results) mask 0. Turns go into one
 * sequence while each prompt extends the text before it; where it does not (the template re-renders
 * an earlier turn, e.g. drops its reasoning), a new sequence starts with that prompt whole, as the
 * gateway splits a trajectory there. Text after the last assistant message is dropped.
 */
export function chatRenderer(tokenizer: ChatTokenizer, template: ChatTemplate): ChatRenderer {
  const eos = tokenizer.stopIds[0];
  if (eos === undefined) throw new OozeError("CONFIG_INVALID", "sft: the tokenizer has no end-of-turn id");
  const eosText = tokenizer.specialText.get(eos);
  if (eosText === undefined) throw new OozeError("CONFIG_INVALID", `sft: the tokenizer does not write its end-of-turn id ${eos} as text`);
  return (messages, tools, where) => {
    let req;
    try {
      req = parseOpenAIRequest({ messages, ...(tools ? { tools } : {}) });
    } catch (e) {
      throw new OozeError("CONFIG_INVALID", `${where}: ${(e as Error).message}`);
    }
    const sequences: SftPieces[] = [];
    let current: SftPieces | null = null;
    let consumed = ""; // the text the current sequence's ids stand for
    req.messages.forEach((m, i) => {
      if (m.role !== "assistant") return;
      const prompt = template.render(req.messages.slice(0, i), req.tools);
      const through = template.render(req.messages.slice(0, i + 1), req.tools);
      const end = through.indexOf(eosText, prompt.length);
      if (!through.startsWith(prompt) || end < 0)
        throw new OozeError("CONFIG_INVALID", `${where}: the chat template does not write assistant message ${i} after its prompt, ended by ${eosText}, so it cannot be trained on`);
      const turn = through.slice(prompt.length, end);
      if (current !== null && prompt.startsWith(consumed)) {
        current.push({ ids: tokenizer.encode(prompt.slice(consumed.length)), train: false });
      } else {
        current = [{ ids: tokenizer.encode(prompt), train: false }];
        sequences.push(current);
      }
      current.push({ ids: [...tokenizer.encode(turn), eos], train: true });
      consumed = prompt + turn + eosText;
    });
    if (sequences.length === 0) throw new OozeError("CONFIG_INVALID", `${where}: field 'messages' has no assistant message to learn`);
    return sequences;
  };
}
