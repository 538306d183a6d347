// The fully_async feeder (actors/buffer/continuous.ts) on scripted runs: a clock of ticks where each
// prompt's generation takes a scripted number of ticks and the trainer trains and syncs a batch in a
// fixed number of ticks, the feeder's stream I/O recorded. Checks that with lateGroups wait a long
// group delays a batch instead of going stale (nothing requeued, the prompts trained in order as in
// sync mode, no token beyond the bound, no group launched that is never trained), and that with
// lateGroups requeue the same script regenerates it.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { ContinuousFeeder } from "../../actors/buffer/continuous.ts";
import { heldGroups } from "../../actors/buffer/buffer-actor.ts";
import { trainSchema } from "../../actors/protocol/config.ts";
import type { BatchBody, GroupBody, PendingGroup, VersionRecord } from "../../actors/protocol/messages.ts";
import { SampleBuilder } from "../../src/sample.ts";

interface Script {
  steps: number;
  promptsPerStep: number;
  samplesPerPrompt: number;
  maxStaleness: number;
  maxInflightGroups: number;
  lateGroups: "wait" | "requeue";
  /** Ticks the generation of prompt p takes (every attempt). */
  ticks: (prompt: number) => number;
  /** Ticks from a batch's publication to its weights being synced. */
  trainTicks: number;
  /** Changes a group's message before the feeder gets it (malformed input). */
  corrupt?: (g: GroupBody) => GroupBody;
  /** The buffer's maxEmptyRounds (default 10). */
  maxEmptyRounds?: number;
}

interface Launch extends PendingGroup {
  /** The synced weight version when it was launched (its samples' tokens carry it). */
  version: number;
  tick: number;
}

const record = (version: number, step: number): VersionRecord => ({ version, step, modelDir: `v${version}`, at: 0 });

function groupOf(l: Launch): GroupBody {
  const samples = Array.from({ length: l.count }, (_, k) => {
    const b = new SampleBuilder(l.firstSample + k, l.prompt, `r${l.firstSample + k}`, null, [1, 2]);
    b.appendModel([3, 4], [-0.5, -0.5], String(l.version));
    return b.build((l.firstSample + k) % 2, "completed");
  });
  return { groupIndex: l.prompt, firstSample: l.firstSample, attempt: l.attempt, samples, promptTokens: 0, cachedTokens: 0 };
}

/** Runs the script until `steps` batches are published; the batches and every launch, in order. */
async function simulate(s: Script, log: string[] = []): Promise<{ batches: BatchBody[]; launched: Launch[]; log: string[] }> {
  const train = trainSchema.parse({
    mode: "fully_async", steps: s.steps, promptsPerStep: s.promptsPerStep, samplesPerPrompt: s.samplesPerPrompt,
    maxStaleness: s.maxStaleness, maxInflightGroups: s.maxInflightGroups, lateGroups: s.lateGroups,
  });
  let tick = 0, version = 0, synced = 0;
  const batches: BatchBody[] = [];
  const launched: Launch[] = [];
  const generating: { l: Launch; done: number }[] = [];
  const feeder = new ContinuousFeeder({ train }, {
    publishPrompt: async (g) => {
      const l = { ...g, version, tick };
      launched.push(l);
      generating.push({ l, done: tick + s.ticks(g.prompt) });
    },
    publishBatch: async (b) => {
      batches.push(b);
    },
    log: (line) => log.push(line),
  }, s.maxEmptyRounds);
  // the feeder keeps its counts of generating and trainable attempts as they change: they must equal a recount
  const checkCounts = () => {
    const f = feeder as unknown as { live: Map<number, { complete: boolean; superseded: boolean }>; generating: number; trainable: number };
    const live = [...f.live.values()];
    expect([f.generating, f.trainable]).toEqual([live.filter((l) => !l.complete).length, live.filter((l) => !l.superseded).length]);
    // every undecided group's message is held unacked: the buffer's consumer must allow them all (and a batch's worth more)
    expect(live.length).toBeLessThanOrEqual(heldGroups(train) - train.promptsPerStep);
  };
  await feeder.start({ batches: 0, nextPrompt: 0, nextSample: 0, pending: [], floor: 0, inStreams: [] });
  await feeder.onVersion(record(0, 0));
  let training: number | null = null; // tick when the batch being trained is synced
  while (batches.length < s.steps) {
    if (++tick > 100_000)
      throw new Error(`${JSON.stringify({ ...s, ticks: undefined })}: batch ${batches.length + 1} not cut after ${tick} ticks; ${generating.length} groups generating; last log lines: ${log.slice(-3).join(" | ")}`);
    if (training !== null && tick >= training) {
      training = null;
      await feeder.onVersion(record(++version, ++synced));
      checkCounts();
    }
    for (const e of generating.filter((x) => x.done <= tick)) {
      generating.splice(generating.indexOf(e), 1);
      await feeder.onGroup((s.corrupt ?? ((g) => g))(groupOf(e.l)), () => () => {});
      checkCounts();
    }
    if (training === null && batches.length > synced) training = tick + s.trainTicks;
  }
  return { batches, launched, log };
}

/** The invariants of lateGroups wait: nothing requeued or dropped, prompts trained in order, none beyond the bound, nothing launched for nothing. */
function expectInOrderWithinBound(s: Script, r: { batches: BatchBody[]; launched: Launch[] }): void {
  const P = s.promptsPerStep;
  expect(r.batches.flatMap((b) => b.requeued ?? [])).toEqual([]);
  expect(r.batches.flatMap((b) => b.dropped)).toEqual([]);
  expect(r.batches.flatMap((b) => b.trainedPrompts ?? [])).toEqual(Array.from({ length: s.steps * P }, (_, i) => i));
  for (const b of r.batches) {
    // batch n is trained at version n - 1 (one version per step)
    for (const x of b.samples) expect(b.step - 1 - Number(x.weightVersions[0]!.version)).toBeLessThanOrEqual(s.maxStaleness);
    expect(b.stalenessMax).toBeLessThanOrEqual(s.maxStaleness);
  }
  const trained = r.batches.flatMap((b) => b.samples.map((x) => x.index));
  expect(new Set(trained).size).toBe(trained.length);
  expect(trained.sort((a, b) => a - b)).toEqual(r.launched.flatMap((l) => Array.from({ length: l.count }, (_, k) => l.firstSample + k)).sort((a, b) => a - b));
}

describe("ContinuousFeeder (fully_async)", () => {
  // Two long groups (prompts 0 and 1, 4 ticks) launched with short ones (1 tick), bound 1, four groups
  // generating: by the time they finish, the short groups behind them have made two versions.
  const script: Script = {
    steps: 4, promptsPerStep: 2, samplesPerPrompt: 2, maxStaleness: 1, maxInflightGroups: 4, lateGroups: "wait",
    ticks: (p) => (p < 2 ? 4 : 1), trainTicks: 1,
  };

  it("lateGroups wait: long groups delay their batch instead of going stale, and are trained", async () => {
    const r = await simulate(script);
    expectInOrderWithinBound(script, r);
    expect(r.batches[0]!.trainedPrompts).toEqual([0, 1]);
  });

  it("lateGroups requeue: the same script regenerates the long groups (the length bias wait removes)", async () => {
    const r = await simulate({ ...script, lateGroups: "requeue" });
    const requeued = r.batches.flatMap((b) => b.requeuedPrompts ?? []);
    expect(requeued).toContain(0);
    expect(requeued).toContain(1);
    expect(r.batches.flatMap((b) => b.requeued ?? []).length).toBeGreaterThan(0); // samples generated for nothing
  });

  it("lateGroups wait: a group message that repeats a sample index is dropped, not waited for", async () => {
    const s: Script = { ...script, steps: 2, corrupt: (g) => (g.groupIndex === 0 ? { ...g, samples: [g.samples[0]!, g.samples[0]!] } : g) };
    const r = await simulate(s);
    expect(r.batches.flatMap((b) => b.droppedPrompts ?? [])).toEqual([0]);
    expect(r.batches.flatMap((b) => b.trainedPrompts ?? [])).toEqual([1, 2, 3, 4]);
    expect(r.log.some((l) => l.includes("group of prompt 0") && l.includes("repeats a sample index"))).toBe(true);
  });

  it("an agent whose every episode fails: each empty batch is a round, and after maxEmptyRounds the job stops saying why", async () => {
    const failed = (g: GroupBody): GroupBody => ({
      ...g,
      samples: g.samples.map((x) => ({ ...x, status: "failed" as const, metadata: { ...x.metadata, error: "the agent made no model request" } })),
    });
    const log: string[] = [];
    const run = simulate({ ...script, steps: 50, corrupt: failed, maxEmptyRounds: 3 }, log);
    await expect(run).rejects.toMatchObject({ code: "AGENTS_UNPRODUCTIVE", retryable: false });
    await expect(run).rejects.toThrow(/^3 rounds in a row produced no trainable sample .*"the agent made no model request" \(×\d+\)/);
    const warnings = log.filter((l) => l.includes("WARNING"));
    expect(warnings.map((l) => /round (\d+) in a row/.exec(l)?.[1])).toEqual(["1", "2", "3"]);
    // a productive batch between empty ones starts the count again
    let n = 0;
    const someFail = (g: GroupBody) => (Math.floor(n++ / 8) % 2 === 0 ? failed(g) : g);
    const ok = await simulate({ ...script, steps: 12, corrupt: someFail, maxEmptyRounds: 2 });
    expect(ok.batches).toHaveLength(12);
    expect(ok.batches.filter((b) => b.samples.length === 0).length).toBeGreaterThan(1);
  });

  it("lateGroups wait on random heavy-tailed schedules: the invariants hold", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.record({
          steps: fc.integer({ min: 1, max: 8 }),
          promptsPerStep: fc.integer({ min: 1, max: 4 }),
          samplesPerPrompt: fc.integer({ min: 1, max: 3 }),
          maxStaleness: fc.integer({ min: 0, max: 3 }),
          maxInflightGroups: fc.integer({ min: 1, max: 12 }),
          trainTicks: fc.integer({ min: 1, max: 3 }),
          // a discrete Pareto-like law: mostly short, some up to 40 ticks
          lengths: fc.array(fc.integer({ min: 0, max: 99 }).map((u) => Math.min(40, Math.floor(100 / (100 - u)))), { minLength: 1, maxLength: 40 }),
        }),
        async ({ lengths, ...rest }) => {
          const s: Script = { ...rest, lateGroups: "wait", ticks: (p) => lengths[p % lengths.length]! };
          expectInOrderWithinBound(s, await simulate(s));
        },
      ),
      { numRuns: 200 },
    );
  });
});
