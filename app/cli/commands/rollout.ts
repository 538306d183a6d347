// `ooze rollout FILE --engines URL[,URL…] --out samples.jsonl`: rollouts only — the topology's task
// played on the given engines (embedded `ooze serve` or external SGLang), one sample per line with
// tokens, response_length, loss_mask, rollout_logprobs, reward, status, weight_versions. Generation
// goes through the Fleet: a dispatch that fails (an error status, a lost or malformed reply) or
// misses its progress deadline is retried, elsewhere where there is another engine; a sample is
// recorded as failed only when its retries are exhausted, with the reason in metadata.error.
import { createWriteStream } from "node:fs";
import { dirname } from "node:path";
import type { Command } from "commander";
import { OozeError } from "../../../src/errors.ts";
import { loadTopology } from "../../../src/topology/load.ts";
import { trainConfigOf } from "../../../actors/protocol/config.ts";
import type { Sample } from "../../../src/sample.ts";

interface RolloutOptions {
  engines: string;
  out: string;
  prompts: string;
  samplesPerPrompt?: string;
  firstPrompt: string;
  temperature?: string;
  progressTimeout?: string;
  retries?: string;
  verbose?: boolean;
}

/** The integer value of option `--name`, at least `min`; CONFIG_INVALID naming the flag otherwise. */
export function int(name: string, v: string, min: number): number {
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
    .option("--progress-timeout <ms>", "progress deadline of a generation request before it is abandoned and re-dispatched (fleet progressTimeoutMs; default 10000, tightened by observed durations)")
    .option("--verbose", "print the fleet's log (re-dispatches, faults, engines leaving and joining) to stderr")
    .option("--retries <n>", "failed dispatches of one request retried before its sample is recorded as failed (default 10)")
    .action(async (file: string, opts: RolloutOptions) => {
      const topo = loadTopology(file);
      const { train } = trainConfigOf({ ...topo, engines: { count: 0, urls: opts.engines.split(",") } });
      const [{ loadTask }, { FleetGenerator }, { rolloutRange }, { faultSummary }] = await Promise.all([
        import("../../../actors/environment/task-loader.ts"),
        import("../../../actors/rollout/generator.ts"),
        import("../../../actors/rollout/rollout.ts"),
        import("../../../src/engine/fleet/fleet.ts"),
      ]);
      const task = await loadTask(train.task, train.taskConfig, dirname(topo.file ?? file), { model: train.model });
      const fleetOpts: { healthIntervalMs: number; progressTimeoutMs?: number; maxRetries?: number } = { healthIntervalMs: 1_000 };
      if (opts.progressTimeout !== undefined) fleetOpts.progressTimeoutMs = int("progress-timeout", opts.progressTimeout, 1);
      if (opts.retries !== undefined) fleetOpts.maxRetries = int("retries", opts.retries, 0);
      const urls = opts.engines.split(",").map((u) => u.trim()).filter(Boolean);
      if (urls.length === 0) throw new OozeError("CONFIG_INVALID", `--engines names no URL (got '${opts.engines}')`);
      const pool = await FleetGenerator.create(urls, opts.verbose ? (l) => process.stderr.write(`${l}\n`) : undefined, fleetOpts);
      const n = opts.samplesPerPrompt !== undefined ? int("samples-per-prompt", opts.samplesPerPrompt, 1) : train.samplesPerPrompt;
      const temperature = opts.temperature !== undefined ? Number(opts.temperature) : train.temperature;
      if (!(temperature >= 0)) throw new OozeError("CONFIG_INVALID", `--temperature must be ≥ 0 (got '${opts.temperature}')`);
      const first = int("first-prompt", opts.firstPrompt, 0);
      const prompts = int("prompts", opts.prompts, 1);
      const out = createWriteStream(opts.out);
      // One attempt per episode: the fleet's retries are the retries (an episode run again would re-sample).
      const r = await rolloutRange(task, pool, { firstPrompt: first, prompts, samplesPerPrompt: n, firstSample: first * n }, { seed: train.seed, temperature, attempts: 1 })
        .finally(() => pool.close());
      const faults = pool.takeFaultStats();
      for (const s of r.samples) out.write(`${JSON.stringify(sampleLine(s))}\n`);
      await new Promise<void>((res, rej) => out.end((e?: Error | null) => (e ? rej(e) : res())));
      const ok = r.samples.filter((s) => s.reward !== null);
      const mean = ok.reduce((a, s) => a + s.reward!, 0) / Math.max(1, ok.length);
      const full = ok.filter((s) => s.reward! >= 1).length / Math.max(1, ok.length);
      console.log(`ooze rollout: ${r.samples.length} samples (${r.failures} failed) in ${r.seconds.toFixed(1)} s, reward mean ${mean.toFixed(3)}, full reward ${full.toFixed(3)} → ${opts.out}`);
      console.log(`ooze rollout: engine faults: ${faults.retried} retried, ${faults.exhausted} exhausted a request's retries (${faultSummary(faults.faults)})`);
      const failed = r.samples.filter((s) => s.status === "failed");
      if (failed.length > 0) console.log(`ooze rollout: ${failed.length} samples failed; first (index ${failed[0]!.index}): ${String(failed[0]!.metadata.error)}`);
    });
}
