// `ooze rollout FILE --engines URL[,URL…] --out samples.jsonl`: rollouts only — the topology's task
// played on the given engines (embedded `ooze serve` or external SGLang), one sample per line with
// tokens, response_length, loss_mask, rollout_logprobs, reward, status, weight_versions.
import { createWriteStream } from "node:fs";
import { dirname } from "node:path";
import type { Command } from "commander";
import { OozeError } from "../../errors.ts";
import { loadTopology } from "../../topology/load.ts";
import { trainConfigOf } from "../../../actors/loop/config.ts";
import type { Sample } from "../../sample.ts";

interface RolloutOptions {
  engines: string;
  out: string;
  prompts: string;
  samplesPerPrompt?: string;
  firstPrompt: string;
  temperature?: string;
}

function int(name: string, v: string, min: number): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new OozeError("CONFIG_INVALID", `--${name} must be an integer ≥ ${min} (got '${v}')`);
  return n;
}

/** One JSONL line of a sample (typed arrays as plain arrays). */
export function sampleLine(s: Sample): Record<string, unknown> {
  return {
    index: s.index,
    group_index: s.groupIndex,
    prompt: s.prompt,
    tokens: Array.from(s.tokens),
    response_length: s.responseLength,
    loss_mask: Array.from(s.lossMask),
    rollout_logprobs: Array.from(s.rolloutLogprobs),
    reward: s.reward,
    status: s.status,
    weight_versions: s.weightVersions,
    metadata: s.metadata,
  };
}

export function register(program: Command) {
  program
    .command("rollout")
    .description("run the topology's task on the given engines (no training); write one sample per line")
    .argument("<file>", "topology YAML file with a train: section (task, temperature, samplesPerPrompt)")
    .requiredOption("--engines <urls>", "comma-separated engine URLs (ooze serve or SGLang)")
    .requiredOption("--out <file>", "samples JSONL file")
    .option("--prompts <n>", "number of prompts", "16")
    .option("--first-prompt <n>", "index of the first prompt", "0")
    .option("--samples-per-prompt <n>", "override train.samplesPerPrompt")
    .option("--temperature <t>", "override train.temperature")
    .action(async (file: string, opts: RolloutOptions) => {
      const topo = loadTopology(file);
      const { train } = trainConfigOf({ ...topo, engines: { count: 0, urls: opts.engines.split(",") } });
      const [{ loadTask }, { EnginePool }, { rolloutRange }] = await Promise.all([
        import("../../../actors/loop/task-loader.ts"),
        import("../../../actors/loop/engines.ts"),
        import("../../../actors/rollout/rollout.ts"),
      ]);
      const task = await loadTask(train.task, train.taskConfig, dirname(topo.file ?? file));
      const pool = new EnginePool(opts.engines.split(",").map((u) => u.trim()).filter(Boolean)); // direct: no weight updates needed
      const n = opts.samplesPerPrompt !== undefined ? int("samples-per-prompt", opts.samplesPerPrompt, 1) : train.samplesPerPrompt;
      const temperature = opts.temperature !== undefined ? Number(opts.temperature) : train.temperature;
      if (!(temperature >= 0)) throw new OozeError("CONFIG_INVALID", `--temperature must be ≥ 0 (got '${opts.temperature}')`);
      const first = int("first-prompt", opts.firstPrompt, 0);
      const prompts = int("prompts", opts.prompts, 1);
      const out = createWriteStream(opts.out);
      const r = await rolloutRange(task, pool, { firstPrompt: first, prompts, samplesPerPrompt: n, firstSample: first * n }, { seed: train.seed, temperature });
      for (const s of r.samples) out.write(`${JSON.stringify(sampleLine(s))}\n`);
      await new Promise<void>((res, rej) => out.end((e?: Error | null) => (e ? rej(e) : res())));
      const ok = r.samples.filter((s) => s.reward !== null);
      const mean = ok.reduce((a, s) => a + s.reward!, 0) / Math.max(1, ok.length);
      const full = ok.filter((s) => s.reward! >= 1).length / Math.max(1, ok.length);
      console.log(`ooze rollout: ${r.samples.length} samples (${r.failures} failed) in ${r.seconds.toFixed(1)} s, reward mean ${mean.toFixed(3)}, full reward ${full.toFixed(3)} → ${opts.out}`);
    });
}
