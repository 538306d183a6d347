// fully_async mode of `ooze train`: generation never stops. Prompt groups are launched one by one
// and kept in flight up to a bounded look-ahead (maxInflightGroups groups generating, and at most
// one batch more of complete groups waiting for the trainer), so the engines stay busy while the
// trainer trains; a finished group goes to the
// buffer at once and the trainer takes the first `promptsPerStep` complete groups. After each step
// the new version is pushed to the engines (pause → update → continue): in-flight generations are
// aborted, keep their tokens and resume on the new weights (partial rollout; every span carries the
// version that sampled it). A group whose oldest token is more than `maxStaleness` versions behind
// the trainer is never trained: its sample indices are recorded as requeued and its prompt is
// generated again under new sample indices, as soon as that is certain (a group still generating
// whose tokens already are too old is cut at once rather than finished for nothing). Checkpoints
// record the groups in flight (RunState.pending); a resumed run generates them again first, from
// their prompt index, with their sample indices.
import { setMaxListeners } from "node:events";
import type { Sample } from "../../src/sample.ts";
import { GroupBuffer, type Batch } from "../buffer/groups.ts";
import { rolloutRange } from "../rollout/rollout.ts";
import type { TrainStepResult } from "../trainer/policy-trainer.ts";
import { fullyAsyncLimits } from "./config.ts";
import type { Generator } from "./engines.ts";
import type { LoopContext } from "./loop.ts";
import type { PendingGroup } from "./state.ts";

/** Times a prompt may be requeued as stale before it is dropped (recorded in `dropped`, with a log line). */
export const MAX_REQUEUES = 3;

interface LiveGroup extends PendingGroup {
  /** Settles when every episode of the group has ended. */
  done: Promise<void>;
  /** The group's samples once it finished. */
  samples: Sample[] | null;
  /** Oldest weight version of any token its episodes got back so far (Infinity before the first). */
  oldest: number;
  /** Stops the group's episodes (itself, or the whole loop's abandon signal). */
  ctl: AbortController;
  /** Cut because its tokens are already beyond the staleness bound: requeued when it settles. */
  doomed: boolean;
}

const indices = (g: PendingGroup) => Array.from({ length: g.count }, (_, i) => g.firstSample + i);

/** Runs fully_async steps until ctx.more() says stop; every step is recorded with ctx.commit(). */
export async function runFullyAsync(ctx: LoopContext): Promise<void> {
  const { cfg, task, gen, trainer, sync } = ctx;
  const { maxStaleness, maxInflightGroups } = fullyAsyncLimits(cfg);
  const buffer = new GroupBuffer({ batchGroups: cfg.promptsPerStep, estimator: cfg.estimator, dropZeroVariance: cfg.dropZeroVariance, maxStaleness });
  const abandon = new AbortController();
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

  /** Requeued since the last commit: sample indices and prompts (go in the next step's record). */
  let requeued: number[] = [];
  let requeuedPrompts: number[] = [];
  /** Dropped after too many requeues since the last commit. */
  let tooStale: number[] = [];
  /** Prompts dropped since the last commit (filter, or too stale too often). */
  let droppedPrompts: number[] = [];
  /** A stale group goes back to the queue under new sample indices (or is dropped after MAX_REQUEUES). */
  const requeue = (g: PendingGroup) => {
    live.delete(g.prompt);
    const times = (requeues.get(g.prompt) ?? 0) + 1;
    requeues.set(g.prompt, times);
    if (times > MAX_REQUEUES) {
      tooStale.push(...indices(g));
      droppedPrompts.push(g.prompt);
      ctx.log(`fully_async: prompt ${g.prompt} was too stale ${times} times (its generation outlasts the staleness bound ${maxStaleness}); dropped`);
      return;
    }
    requeued.push(...indices(g));
    requeuedPrompts.push(g.prompt);
    queue.push({ prompt: g.prompt, firstSample: nextSample, count: g.count, attempt: 0 });
    nextSample += g.count;
  };

  const launch = (g: PendingGroup) => {
    const ctl = new AbortController();
    setMaxListeners(0, ctl.signal);
    const rec: LiveGroup = { ...g, samples: null, done: Promise.resolve(), oldest: Infinity, ctl, doomed: false };
    live.set(g.prompt, rec);
    // The group's generator notes the oldest version its episodes got back, so a group can be cut
    // as soon as it is certain to be too stale (no need to finish generating it first).
    const tracked: Generator = {
      generate: async (req) => {
        const out = await gen.generate(req);
        // Without partial rollout, a generation that crossed an update is discarded by the episode.
        if (!cfg.partialRollout && new Set(out.weightVersions.map((sp) => sp.version)).size > 1) return out;
        for (const sp of out.weightVersions) {
          const v = Number(sp.version);
          if (Number.isFinite(v) && v < rec.oldest) rec.oldest = v;
        }
        return out;
      },
      updateWeights: (dir, version, o) => gen.updateWeights(dir, version, o),
      replace: (from, to) => gen.replace(from, to),
      takeCacheStats: () => gen.takeCacheStats(),
    };
    rec.done = rolloutRange(task, tracked, { firstPrompt: g.prompt, prompts: 1, samplesPerPrompt: g.count, firstSample: g.firstSample }, {
      seed: cfg.seed, temperature: cfg.temperature, partialRollout: cfg.partialRollout, signal: ctl.signal,
    }).then(
      (r) => {
        if (abandon.signal.aborted) return;
        if (rec.doomed) {
          requeue(rec);
          fill();
          return notify();
        }
        rec.samples = r.samples;
        const before = buffer.stats.dropped;
        for (const s of r.samples) buffer.add(s);
        buffer.close(g.prompt, g.count);
        if (buffer.stats.dropped > before) {
          live.delete(g.prompt);
          filtered.push(...r.samples);
          droppedPrompts.push(g.prompt);
          droppedSinceStep++;
        }
        fill();
        notify();
      },
      (e: unknown) => {
        fatal ??= e;
        notify();
      },
    );
  };
  const fill = () => {
    // Up to maxInflightGroups generating, and at most one batch more waiting for the trainer.
    let generating = 0;
    for (const g of live.values()) if (g.samples === null) generating++;
    for (; !stopping && generating < maxInflightGroups && live.size < maxInflightGroups + cfg.promptsPerStep; generating++) {
      const g = queue.shift();
      if (g) launch(g);
      else {
        launch({ prompt: nextPrompt++, firstSample: nextSample, count: cfg.samplesPerPrompt, attempt: 0 });
        nextSample += cfg.samplesPerPrompt;
      }
    }
  };
  /** Groups launched (or queued) and not decided: what a checkpoint must regenerate on resume. */
  const pending = (): PendingGroup[] =>
    [...live.values(), ...queue].map((g) => ({ prompt: g.prompt, firstSample: g.firstSample, count: g.count, attempt: 0 })).sort((a, b) => a.firstSample - b.firstSample);

  let step = ctx.start.step;
  try {
    fill();
    let more = ctx.more(step);
    while (more) {
      const stepStart = performance.now();
      step++;
      let batch: Batch | null = null;
      // Wait for promptsPerStep fresh complete groups; stale ones go back to be generated again.
      for (;;) {
        if (fatal) throw fatal;
        // Dynamic sampling: after many filtered groups, train on what there is (or nothing).
        const partial = droppedSinceStep >= 3 * cfg.promptsPerStep;
        const r = buffer.takeBatch(trainer.version, { partial });
        for (const p of r.requeue) requeue(live.get(p)!);
        if (r.requeue.length > 0) fill();
        if (r.batch) {
          batch = r.batch;
          break;
        }
        if (partial && droppedSinceStep >= 4 * cfg.promptsPerStep) break;
        await new Promise<void>((resolve) => (wake = resolve));
      }
      const rolloutSeconds = (performance.now() - stepStart) / 1000;
      // The batch's groups leave the live set (their samples: metrics; failed episodes: dropped).
      const all: Sample[] = [];
      const dropped: number[] = [];
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
      // Groups still generating whose tokens are already beyond the bound can never be trained: cut them now.
      for (const g of live.values()) {
        if (g.samples === null && !g.doomed && trainer.version - g.oldest > maxStaleness) {
          g.doomed = true;
          g.ctl.abort();
        }
      }
      // pause → update → continue: generations in flight are cut and resume on the new weights.
      // Awaited here, so the engines serve the trainer's version whenever it takes a batch (a push
      // overlapped with the next step would leave them a version behind for a while: more stale groups).
      const tSync = performance.now();
      if (trained) await sync.push(trained.modelDir, trained.version);
      const syncSeconds = (performance.now() - tSync) / 1000;
      more = ctx.more(step);
      if (!more) stopping = true; // the checkpoint below records exactly the groups launched
      // Everything requeued or dropped up to now goes in this record; the snapshot of pending groups
      // below agrees (a group decided later is in that snapshot, and in the next record).
      const stepRequeued = requeued, stepRequeuedPrompts = requeuedPrompts;
      all.push(...filtered);
      dropped.push(...filtered.map((x) => x.index), ...tooStale);
      filtered = [];
      droppedSinceStep = 0;
      const stepDroppedPrompts = droppedPrompts;
      droppedPrompts = [];
      requeued = [];
      requeuedPrompts = [];
      tooStale = [];
      await ctx.commit({
        step, samples: batch?.samples ?? [], all, dropped, requeued: stepRequeued, requeuedPrompts: stepRequeuedPrompts, stalenessMax: batch?.stalenessMax ?? 0, rolloutSeconds,
        trained, stepSeconds: (performance.now() - stepStart) / 1000, trainSeconds, syncSeconds, restarts: trainer.restarts - restartsBefore,
        droppedGroups: buffer.stats.dropped,
        trainedPrompts: batch?.groups ?? [], droppedPrompts: stepDroppedPrompts,
        state: { step, nextPrompt, nextSample, weightVersion: trainer.version, pending: pending() },
      });
    }
  } finally {
    // Groups still in flight are abandoned (the last checkpoint lists them as pending).
    stopping = true;
    abandon.abort();
    for (const g of live.values()) g.ctl.abort();
    await Promise.allSettled([...live.values()].map((g) => g.done));
  }
}
