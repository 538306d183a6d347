// fully_async mode of `ooze train`: generation never stops. Prompt groups are launched one by one
// and kept in flight up to a bounded look-ahead (maxInflightGroups groups generating or waiting for
// the trainer), so the engines stay busy while the trainer trains; a finished group goes to the
// buffer at once and the trainer takes the first `promptsPerStep` complete groups. After each step
// the new version is pushed to the engines (pause → update → continue): in-flight generations are
// aborted, keep their tokens and resume on the new weights (partial rollout; every span carries the
// version that sampled it). A group whose oldest token is more than `maxStaleness` versions behind
// the trainer is never trained: its sample indices are recorded as requeued and its prompt is
// generated again under new sample indices. Checkpoints record the groups in flight (RunState.pending);
// a resumed run generates them again first, from their prompt index, with their sample indices.
import { setMaxListeners } from "node:events";
import type { Sample } from "../../src/sample.ts";
import { GroupBuffer, type Batch } from "../buffer/groups.ts";
import { rolloutRange } from "../rollout/rollout.ts";
import type { TrainStepResult } from "../trainer/policy-trainer.ts";
import { fullyAsyncLimits } from "./config.ts";
import type { LoopContext } from "./loop.ts";
import type { PendingGroup } from "./state.ts";

/** Times a prompt may be requeued as stale before it is dropped (recorded in `dropped`, with a log line). */
export const MAX_REQUEUES = 3;

interface LiveGroup extends PendingGroup {
  /** Settles when every episode of the group has ended. */
  done: Promise<void>;
  /** The group's samples once it finished. */
  samples: Sample[] | null;
}

const indices = (g: PendingGroup) => Array.from({ length: g.count }, (_, i) => g.firstSample + i);

/** Runs fully_async steps until ctx.more() says stop; every step is recorded with ctx.commit(). */
export async function runFullyAsync(ctx: LoopContext): Promise<void> {
  const { cfg, task, gen, trainer, sync } = ctx;
  const { maxStaleness, maxInflightGroups } = fullyAsyncLimits(cfg);
  const buffer = new GroupBuffer({ batchGroups: cfg.promptsPerStep, estimator: cfg.estimator, dropZeroVariance: cfg.dropZeroVariance, maxStaleness });
  const abandon = new AbortController();
  setMaxListeners(0, abandon.signal); // every episode in flight listens to it
  let nextPrompt = ctx.start.nextPrompt;
  let nextSample = ctx.start.nextSample;
  /** Launched and not yet trained, dropped or requeued, by prompt index. */
  const live = new Map<number, LiveGroup>();
  /** Groups to launch before fresh prompts: the checkpoint's in-flight groups, then requeued prompts. */
  const queue: PendingGroup[] = [...(ctx.start.pending ?? [])];
  if (queue.length > 0) ctx.log(`fully_async: generating again the ${queue.length} groups in flight at the checkpoint (prompts ${queue.map((g) => g.prompt).join(", ")})`);
  const requeues = new Map<number, number>();
  /** Groups the filter dropped since the last step: their samples, for metrics and batches.jsonl. */
  let filtered: Sample[] = [];
  let droppedSinceStep = 0;
  let stopping = false;
  let fatal: unknown = null;
  let wake: (() => void) | null = null;
  const notify = () => {
    const w = wake;
    wake = null;
    w?.();
  };

  const launch = (g: PendingGroup) => {
    const rec: LiveGroup = { ...g, samples: null, done: Promise.resolve() };
    live.set(g.prompt, rec);
    rec.done = rolloutRange(task, gen, { firstPrompt: g.prompt, prompts: 1, samplesPerPrompt: g.count, firstSample: g.firstSample }, {
      seed: cfg.seed, temperature: cfg.temperature, partialRollout: cfg.partialRollout, signal: abandon.signal,
    }).then(
      (r) => {
        if (abandon.signal.aborted) return;
        rec.samples = r.samples;
        const before = buffer.stats.dropped;
        for (const s of r.samples) buffer.add(s);
        buffer.close(g.prompt, g.count);
        if (buffer.stats.dropped > before) {
          live.delete(g.prompt);
          filtered.push(...r.samples);
          droppedSinceStep++;
          fill();
        }
        notify();
      },
      (e: unknown) => {
        fatal ??= e;
        notify();
      },
    );
  };
  const fill = () => {
    while (!stopping && live.size < maxInflightGroups) {
      const g = queue.shift();
      if (g) launch(g);
      else {
        launch({ prompt: nextPrompt++, firstSample: nextSample, count: cfg.samplesPerPrompt });
        nextSample += cfg.samplesPerPrompt;
      }
    }
  };
  /** Groups launched (or queued) and not decided: what a checkpoint must regenerate on resume. */
  const pending = (): PendingGroup[] =>
    [...live.values(), ...queue].map((g) => ({ prompt: g.prompt, firstSample: g.firstSample, count: g.count })).sort((a, b) => a.firstSample - b.firstSample);

  let step = ctx.start.step;
  try {
    fill();
    let more = ctx.more(step);
    while (more) {
      const stepStart = performance.now();
      step++;
      const requeued: number[] = [];
      const requeuedPrompts: number[] = [];
      const tooStale: number[] = [];
      let batch: Batch | null = null;
      // Wait for promptsPerStep fresh complete groups; stale ones go back to be generated again.
      for (;;) {
        if (fatal) throw fatal;
        // Dynamic sampling: after many filtered groups, train on what there is (or nothing).
        const partial = droppedSinceStep >= 3 * cfg.promptsPerStep;
        const r = buffer.takeBatch(trainer.version, { partial });
        for (const p of r.requeue) {
          const g = live.get(p)!;
          live.delete(p);
          const times = (requeues.get(p) ?? 0) + 1;
          requeues.set(p, times);
          if (times > MAX_REQUEUES) {
            tooStale.push(...indices(g));
            ctx.log(`fully_async: prompt ${p} was too stale ${times} times (its generation outlasts the staleness bound ${maxStaleness}); dropped`);
            continue;
          }
          requeued.push(...indices(g));
          requeuedPrompts.push(p);
          queue.push({ prompt: p, firstSample: nextSample, count: g.count });
          nextSample += g.count;
        }
        if (r.requeue.length > 0) fill();
        if (r.batch) {
          batch = r.batch;
          break;
        }
        if (partial && droppedSinceStep >= 4 * cfg.promptsPerStep) break;
        await new Promise<void>((resolve) => (wake = resolve));
      }
      const rolloutSeconds = (performance.now() - stepStart) / 1000;
      // The fates this step decided: the batch's groups, and the groups the filter dropped meanwhile.
      const all = filtered;
      filtered = [];
      droppedSinceStep = 0;
      const dropped = [...all.map((s) => s.index), ...tooStale];
      const trainedIdx = new Set(batch?.samples.map((s) => s.index) ?? []);
      for (const p of batch?.groups ?? []) {
        const g = live.get(p)!;
        live.delete(p);
        for (const s of g.samples!) {
          all.push(s);
          if (!trainedIdx.has(s.index)) dropped.push(s.index); // failed episodes of a trained group
        }
      }
      fill();

      const tTrain = performance.now();
      ctx.hooks.beforeTrain?.(step, trainer, batch?.samples ?? []);
      const restartsBefore = trainer.restarts;
      let trained: TrainStepResult | null = null;
      if (batch && batch.samples.length > 0) trained = await trainer.step(batch.samples);
      const trainSeconds = (performance.now() - tTrain) / 1000;
      // pause → update → continue: generations in flight are cut and resume on the new weights.
      // Awaited here, so the engines serve the trainer's version whenever it takes a batch (a push
      // overlapped with the next step would leave them a version behind for a while: more stale groups).
      const tSync = performance.now();
      if (trained) await sync.push(trained.modelDir, trained.version);
      const syncSeconds = (performance.now() - tSync) / 1000;
      more = ctx.more(step);
      if (!more) stopping = true; // the checkpoint below records exactly the groups launched
      await ctx.commit({
        step, samples: batch?.samples ?? [], all, dropped, requeued, requeuedPrompts, stalenessMax: batch?.stalenessMax ?? 0, rolloutSeconds,
        trained, stepSeconds: (performance.now() - stepStart) / 1000, trainSeconds, syncSeconds, restarts: trainer.restarts - restartsBefore,
        droppedGroups: buffer.stats.dropped,
        trainedPrompts: batch?.groups ?? [],
        state: { step, nextPrompt, nextSample, weightVersion: trainer.version, pending: pending() },
      });
    }
  } finally {
    // Groups still in flight are abandoned (the last checkpoint lists them as pending).
    stopping = true;
    abandon.abort();
    await Promise.allSettled([...live.values()].map((g) => g.done));
  }
}
