// Generation alone, for a bench's ideal overlap bound: a task's prompt groups generated on given
// engines through the real fleet and router (FleetGenerator, cache-aware) with `window` groups kept in
// flight (as fully_async keeps them), no trainer and no weight updates. The rate counts the samples of
// the groups completed after the first `skip` and up to the `upto`th (start-up and the last groups'
// tail excluded).
import { FleetGenerator } from "../../actors/rollout/generator.ts";
import { loadTask } from "../../actors/environment/task-loader.ts";
import { rolloutRange } from "../../actors/rollout/rollout.ts";
import type { FleetOptions } from "../../src/engine/fleet/types.ts";
import type { Sample } from "../../src/sample.ts";

/** What generationOnly measured. */
export interface GenerationOnly {
  /** Samples per second between the skip-th and the upto-th completed group. */
  sps: number;
  /** Every generated group, in completion order. */
  groups: Sample[][];
  /** Seconds between those completions. */
  seconds: number;
}

/** Generates `total` groups of `samplesPerPrompt`, `window` at once; the rate over completions skip..upto. */
export async function generationOnly(o: {
  urls: readonly string[];
  task: string;
  taskConfig: Record<string, unknown>;
  baseDir: string;
  samplesPerPrompt: number;
  window: number;
  total: number;
  skip: number;
  upto: number;
  seed?: number;
  temperature?: number;
  /** The fleet's options (its progress deadlines, health checks). */
  fleet?: FleetOptions;
}): Promise<GenerationOnly> {
  const task = await loadTask(o.task, o.taskConfig, o.baseDir);
  const gen = await FleetGenerator.create(o.urls, undefined, o.fleet);
  try {
    const done: { at: number; samples: Sample[] }[] = [];
    let next = 0;
    await new Promise<void>((resolve, reject) => {
      const launch = () => {
        const p = next++;
        rolloutRange(task, gen, { firstPrompt: p, prompts: 1, samplesPerPrompt: o.samplesPerPrompt, firstSample: p * o.samplesPerPrompt }, { seed: o.seed ?? 0, temperature: o.temperature ?? 1 }).then((r) => {
          done.push({ at: performance.now(), samples: r.samples });
          if (next < o.total) launch();
          if (done.length === o.total) resolve();
        }, reject);
      };
      for (let i = 0; i < Math.min(o.window, o.total); i++) launch();
    });
    const first = done[o.skip - 1]!, last = done[o.upto - 1]!;
    const n = done.slice(o.skip, o.upto).reduce((k, d) => k + d.samples.length, 0);
    const seconds = (last.at - first.at) / 1000;
    return { sps: n / seconds, groups: done.map((d) => d.samples), seconds };
  } finally {
    await gen.close();
  }
}
