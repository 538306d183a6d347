// `ooze sft`: supervised fine-tuning of a model directory (or a fresh preset) on a JSONL file of
// prompt/completion pairs or chat messages, with a progress bar; writes an HF checkpoint directory
// (actors/trainer/sft.ts does the work on the native trainer worker).
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Command } from "commander";
import { SingleBar } from "cli-progress";
import { OozeError } from "../../../src/errors.ts";
import { EOS_ID } from "../../../src/engine/tokenizer.ts";

interface SftCliOptions {
  model?: string;
  preset?: string;
  data: string;
  out: string;
  steps?: string;
  epochs: string;
  batch: string;
  lr: string;
  lrWarmup?: string;
  lrDecay: string;
  lrMinRatio: string;
  seed: string;
  untilLoss?: string;
  quiet?: boolean;
}

/** Exit status when --until-loss was not reached within --steps (the checkpoint is written all the same). */
export const EXIT_LOSS_NOT_REACHED = 2;

function num(name: string, v: string, min: number, integer: boolean): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n < min || (integer && !Number.isInteger(n)))
    throw new OozeError("CONFIG_INVALID", `--${name} must be ${integer ? "an integer" : "a number"} ≥ ${min} (got '${v}')`);
  return n;
}

export function register(program: Command) {
  program
    .command("sft")
    .description("supervised fine-tuning on JSONL ({prompt, completion} or {messages}); loss only on completion / assistant tokens; writes an HF checkpoint to --out")
    .requiredOption("--data <files>", "JSONL training examples (several files: comma-separated)")
    .requiredOption("--out <dir>", "checkpoint directory to write")
    .option("--model <dir>", "model directory to start from")
    .option("--preset <name>", "start from a randomly initialised preset instead (tiny, quickstart, small, base100m)")
    .option("--steps <n>", "optimizer steps (default: --epochs passes over the data)")
    .option("--epochs <n>", "passes over the data when --steps is not given", "3")
    .option("--batch <n>", "examples per step", "8")
    .option("--lr <x>", "peak AdamW learning rate", "1e-3")
    .option("--lr-warmup <n>", "steps of linear warmup from 0 to --lr (default: 5% of the steps; Adam starts fresh each run)")
    .option("--lr-decay <kind>", "after the warmup: constant, linear or cosine decay to lr × --lr-min-ratio at the last step", "cosine")
    .option("--lr-min-ratio <x>", "where the decay ends, as a fraction of --lr", "0.1")
    .option("--seed <n>", "shuffling seed (and the preset's initialisation)", "0")
    .option("--until-loss <x>", `stop early once the mean of the last 5 measured losses (one every 10 steps) is at most x; --steps is then the most to run (the lr schedule spans it), and the exit status is ${EXIT_LOSS_NOT_REACHED} if x was not reached`)
    .option("--quiet", "no progress bar")
    .action(async (opts: SftCliOptions) => {
      if ((opts.model === undefined) === (opts.preset === undefined)) throw new OozeError("CONFIG_INVALID", "give exactly one of --model DIR or --preset NAME");
      const batch = num("batch", opts.batch, 1, true), lr = num("lr", opts.lr, 0, false), seed = num("seed", opts.seed, 0, true);
      const { readSftJsonl, runSft } = await import("../../../actors/trainer/sft.ts");
      const { readModelConfig, initModelDir } = await import("../../../native/model-dir.ts");
      let scratch: string | null = null;
      try {
        let modelDir = opts.model;
        if (modelDir === undefined) {
          scratch = mkdtempSync(join(tmpdir(), "ooze-sft-"));
          modelDir = join(scratch, "init");
          await initModelDir(opts.preset!, modelDir, seed);
        }
        const config = await readModelConfig(modelDir);
        const { byteChatTokenizer, loadHfChatModel, JinjaChatTemplate, BuiltinChatTemplate } = await import("../../../src/gateway/index.ts");
        const { chatRenderer } = await import("../../../actors/trainer/sft.ts");
        // the model's own tokenizer and chat template, or the byte-level model's built-in ones (as the gateway renders them)
        const hf = existsSync(join(modelDir, "tokenizer.json")) ? loadHfChatModel(modelDir) : null;
        if (!hf && config.vocab_size <= EOS_ID) throw new OozeError("CONFIG_INVALID", `${modelDir}/config.json: vocab_size ${config.vocab_size} is too small for the byte tokenizer (needs > ${EOS_ID}) and there is no tokenizer.json`);
        const tokenizer = hf?.tokenizer ?? byteChatTokenizer();
        const bos = tokenizer.bosToken ? tokenizer.encode(tokenizer.bosToken) : [];
        const tok = { encode: (t: string) => tokenizer.encode(t), bos: bos.length === 1 ? bos[0]! : null, eos: tokenizer.stopIds[0] ?? EOS_ID };
        const render = chatRenderer(tokenizer, hf ? new JinjaChatTemplate(hf.chatTemplate, tokenizer) : new BuiltinChatTemplate(tokenizer));
        const examples = opts.data.split(",").filter((f) => f !== "").flatMap((f) => readSftJsonl(f, tok, render));
        const longest = Math.max(...examples.map((e) => e.tokens.length));
        const tooLong = examples.find((e) => e.tokens.length > config.max_position_embeddings);
        if (tooLong) throw new OozeError("CONFIG_INVALID", `${tooLong.where}: ${tooLong.tokens.length} tokens, more than the model's max_position_embeddings (${config.max_position_embeddings})`);
        const steps = opts.steps !== undefined ? num("steps", opts.steps, 1, true) : Math.max(1, Math.ceil((num("epochs", opts.epochs, 1, true) * examples.length) / batch));
        const lrWarmupSteps = opts.lrWarmup !== undefined ? num("lr-warmup", opts.lrWarmup, 0, true) : Math.round(steps * 0.05);
        const lrDecay = opts.lrDecay;
        if (lrDecay !== "constant" && lrDecay !== "linear" && lrDecay !== "cosine") throw new OozeError("CONFIG_INVALID", `--lr-decay must be constant, linear or cosine (got '${lrDecay}')`);
        const lrMinRatio = num("lr-min-ratio", opts.lrMinRatio, 0, false);
        const untilLoss = opts.untilLoss !== undefined ? num("until-loss", opts.untilLoss, 0, false) : undefined;
        if (lrMinRatio > 1) throw new OozeError("CONFIG_INVALID", `--lr-min-ratio must be ≤ 1 (got '${opts.lrMinRatio}')`);
        const bar = process.stderr.isTTY && !opts.quiet ? new SingleBar({ format: "sft {value}/{total} |{bar}| loss {loss} | lr {lr} | {secs}s", hideCursor: true, stream: process.stderr }) : null;
        const t0 = performance.now();
        bar?.start(steps, 0, { loss: "-", lr: "-", secs: "0" });
        const r = await runSft(examples, {
          modelDir, out: opts.out, steps, batch, lr, lrWarmupSteps, lrDecay, lrMinRatio, seed, ...(untilLoss !== undefined ? { untilLoss } : {}),
          onStep: (s) => {
            const secs = ((performance.now() - t0) / 1000).toFixed(0);
            if (bar) bar.update(s.step, { secs, lr: s.lr.toExponential(2), ...(Number.isNaN(s.loss) ? {} : { loss: s.loss.toFixed(4) }) });
            else if (!opts.quiet && (s.step === 1 || s.step % 10 === 0 || s.step === steps)) process.stderr.write(`[ooze] sft step ${s.step}/${steps} loss ${s.loss.toFixed(4)} lr ${s.lr.toExponential(2)} grad-norm ${s.gradNorm.toFixed(3)} ${secs}s\n`);
          },
        });
        bar?.stop();
        const reached = r.reached ? `; reached --until-loss ${untilLoss} at step ${r.steps} (mean of the last measured losses ${r.recentLoss.toFixed(4)})` : "";
        console.log(
          `ooze sft: ${r.steps} steps on ${examples.length} examples (longest ${longest} tokens, ${r.tokens} trained tokens) in ${((performance.now() - t0) / 1000).toFixed(1)} s (lr ${lr}, warmup ${lrWarmupSteps}, ${lrDecay} decay); loss ${r.firstLoss.toFixed(4)} → ${r.lastLoss.toFixed(4)}${reached}; checkpoint ${opts.out}`,
        );
        if (r.reached === false) {
          process.stderr.write(
            `[ooze] sft: --until-loss ${untilLoss} not reached in ${steps} steps (mean of the last measured losses ${r.recentLoss.toFixed(4)}); the checkpoint is written — run again with --model ${opts.out} to go on\n`,
          );
          process.exitCode = EXIT_LOSS_NOT_REACHED;
        }
      } finally {
        if (scratch) rmSync(scratch, { recursive: true, force: true });
      }
    });
}
