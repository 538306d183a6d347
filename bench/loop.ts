// Loop benchmark (`npm run bench -- loop [--steps N] [--preset NAME] [--task NAME]`): trained samples/s
// of `ooze train`'s loop in sync and async (one step off-policy) mode on a workload with uneven
// generation lengths (guess-number: 1 to 6 turns per episode), and, for weight sync, the size of one
// step's lossless delta (actors/weight-sync/delta.ts) against the full checkpoint, its apply time and
// whether the applied weights equal the trainer's byte for byte. fully_async is not implemented yet
// (null). Progress on stderr; one JSON line last on stdout.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { weightSyncFigures } from "./lib/weight-sync-figures.ts";
import { enginesSchema, trainSchema } from "../actors/loop/config.ts";
import { runTraining } from "../actors/loop/loop.ts";
import { readJsonl, type StepMetrics } from "../actors/loop/metrics.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const steps = Number(arg("steps", "12"));
const preset = arg("preset", "tiny");
const task = arg("task", "guess-number");
const root = mkdtempSync(join(tmpdir(), "ooze-bench-loop-"));
const say = (s: string) => process.stderr.write(`[bench loop] ${s}\n`);

/** Trained samples per second over the steps after the first (engine and worker start-up excluded). */
async function run(mode: "sync" | "async"): Promise<{ sps: number; out: string }> {
  const out = join(root, mode);
  const train = trainSchema.parse({ mode, task, preset, steps, promptsPerStep: 8, samplesPerPrompt: 8, lr: 0.003, checkpointEvery: 1000 });
  await runTraining({ out, train, engines: enginesSchema.parse({ count: 1, maxRunning: 128 }), baseDir: process.cwd() });
  const ms = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
  const rest = ms.slice(1);
  const seconds = ms[ms.length - 1]!.seconds - ms[0]!.seconds;
  const sps = rest.reduce((n, m) => n + m.samples, 0) / seconds;
  say(`${mode}: ${sps.toFixed(1)} trained samples/s over steps 2..${ms.length}`);
  return { sps, out };
}

try {
  const sync = await run("sync");
  const async_ = await run("async");
  const ws = await weightSyncFigures(join(sync.out, "weights"));
  console.log(
    JSON.stringify({
      workload: `${task}, preset ${preset}, 8 prompts x 8 samples, ${steps} steps`,
      sync: Number(sync.sps.toFixed(2)),
      async: Number(async_.sps.toFixed(2)),
      async_vs_sync: Number((async_.sps / sync.sps).toFixed(3)),
      fully_async: null,
      fully_async_vs_sync: null,
      fully_async_vs_bound: null,
      ...ws,
    }),
  );
} finally {
  rmSync(root, { recursive: true, force: true });
}
