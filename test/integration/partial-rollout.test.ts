// Partial rollout end to end, as fully_async uses it: an episode generating on an embedded engine
// through the loop's FleetGenerator is interrupted by a weight update (pause → update → continue);
// it keeps the tokens sampled so far — exactly those the old weights sample alone, same logprobs —
// and finishes on the new weights, each span recorded under its version. Without partial rollout
// the interrupted turn is generated again on the new weights (one version only).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Task } from "../../actors/environment/task.ts";
import { FleetGenerator, startEngineProcess, type EngineProcess } from "../../actors/rollout/generator.ts";
import { runEpisode, type EpisodeSpec } from "../../actors/rollout/episode.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { encodeBytes } from "../../src/engine/tokenizer.ts";
import type { Sample } from "../../src/sample.ts";
import { waitUntil } from "../harness/index.ts";

/** One turn of up to 400 tokens (the tiny model's context is 512). */
const longTurn: Task<null> = {
  name: "long-turn",
  maxTurns: 1,
  maxTurnTokens: 400,
  reset: () => ({ prompt: "go:", promptIds: encodeBytes("go:", true), state: null }),
  step: () => ({ state: null, observation: new Int32Array(0), done: true }),
  reward: () => 0,
};

const root = mkdtempSync(join(tmpdir(), "ooze-partial-"));
const dirOf = (v: number) => join(root, `v${v}`);
let engine: EngineProcess;
let gen: FleetGenerator;
let version = 0;

beforeAll(async () => {
  for (let v = 0; v <= 24; v++) await initModelDir("tiny", dirOf(v), v);
  engine = await startEngineProcess({ modelDir: dirOf(0), maxRunning: 8, cacheTokens: 4096, weightVersion: "0" });
  gen = await FleetGenerator.create([engine.url]);
}, 60_000);

afterAll(async () => {
  await gen?.close();
  await engine?.stop();
  rmSync(root, { recursive: true, force: true });
});

/**
 * Runs `spec` at the current weights, then, if that generation is long (a weight update can land in
 * it), again with a weight update while it generates; null for a short one.
 */
async function interrupted(spec: EpisodeSpec): Promise<{ ref: Sample; got: Sample; from: string; to: string } | null> {
  const [ref] = await runEpisode(longTurn, gen, spec);
  if (!ref || ref.responseLength < 200 || version >= 24) return null;
  let settled = false;
  const running = runEpisode(longTurn, gen, spec).then(([s]) => s!).finally(() => (settled = true));
  await waitUntil(() => settled || gen.fleet.list()[0]!.inFlight > 0, { what: "the episode's request on the engine", intervalMs: 1 });
  const from = String(version);
  version++;
  await gen.fleet.updateWeights(dirOf(version), String(version));
  return { ref, got: await running, from, to: String(version) };
}

const model = (s: Sample) => Array.from(s.tokens.subarray(s.tokens.length - s.responseLength));

describe("partial rollout through the loop's generator", () => {
  it("an interrupted generation keeps its tokens and resumes on the new weights; without partial rollout it starts over", async () => {
    // Whether the update lands mid-generation depends on timing; try a few episodes until one is
    // cut with tokens on both sides, and check every outcome's invariants on the way.
    let partial: { ref: Sample; got: Sample; from: string; to: string } | null = null;
    for (let i = 0; i < 40 && !partial; i++) {
      const r = await interrupted({ index: i, groupIndex: 0, seed: 0, temperature: 1, samplingSeed: 1000 + i });
      if (!r) continue;
      const spans = r.got.weightVersions;
      expect(spans.reduce((n, sp) => n + sp.end - sp.start, 0)).toBe(r.got.responseLength);
      if (spans.length === 2) partial = r;
      else if (spans[0]!.version === r.from) expect(model(r.got)).toEqual(model(r.ref)); // done before the pause
      else expect(spans.map((sp) => sp.version)).toEqual([r.to]); // cut before its first token
    }
    expect(partial).not.toBeNull();
    const { ref, got, from, to } = partial!;
    const [a, b] = got.weightVersions as [Sample["weightVersions"][number], Sample["weightVersions"][number]];
    expect([a.version, b.version]).toEqual([from, to]);
    expect(a.start).toBe(0);
    expect(b.start).toBe(a.end);
    // The old weights' span is exactly what they sample alone: kept, not regenerated.
    expect(model(got).slice(0, a.end)).toEqual(model(ref).slice(0, a.end));
    for (let k = 0; k < a.end; k++) expect(got.rolloutLogprobs[k]).toBeCloseTo(ref.rolloutLogprobs[k]!, 3);
    expect(Array.from(got.lossMask)).toEqual(new Array(got.responseLength).fill(1));

    // partialRollout: false — every outcome is sampled by one version only.
    for (let i = 0, tried = 0; i < 40 && tried < 3; i++) {
      const r = await interrupted({ index: 100 + i, groupIndex: 0, seed: 0, temperature: 1, samplingSeed: 2000 + i, partialRollout: false });
      if (!r) continue;
      tried++;
      expect(r.got.weightVersions).toHaveLength(1);
      expect(r.got.weightVersions[0]).toMatchObject({ start: 0, end: r.got.responseLength });
    }
  }, 60_000);

  it("a pause in place (train.pauseOnUpdate: in_place) keeps the request running across the update: one dispatch, recorded under the older version", async () => {
    const prompt = encodeBytes("go:", true);
    const sampling = { max_new_tokens: 400, temperature: 1, ignore_eos: true };
    let crossed = 0;
    for (let i = 0; i < 40 && crossed < 2 && version < 24; i++) {
      let settled = false;
      const running = gen.fleet.generate({ inputIds: prompt, sampling: { ...sampling, sampling_seed: 3000 + i } }).finally(() => (settled = true));
      await waitUntil(() => settled || gen.fleet.list()[0]!.inFlight > 0, { what: "the request on the engine", intervalMs: 1 });
      const from = String(version);
      version++;
      await gen.fleet.updateWeights(dirOf(version), String(version), { mode: "in_place", flushCache: false });
      // still running once the update is done: it ran across it
      const across = !settled;
      const r = await running;
      // never cut: the whole budget from one dispatch, recorded under the version it started on
      expect([r.status, r.outputIds.length, r.redispatches]).toEqual(["truncated", 400, 0]);
      expect(r.weightVersions).toEqual([{ start: 0, end: 400, version: from }]);
      if (across) crossed++;
    }
    expect(crossed).toBe(2);
    // abort mode, for contrast: a request cut by the update is dispatched again
    let settled = false;
    const running = gen.fleet.generate({ inputIds: prompt, sampling: { ...sampling, sampling_seed: 4000 } }).finally(() => (settled = true));
    await waitUntil(() => settled || gen.fleet.list()[0]!.inFlight > 0, { what: "the request on the engine", intervalMs: 1 });
    version++;
    await gen.fleet.updateWeights(dirOf(version), String(version));
    const r = await running;
    if (r.weightVersions.length === 2) expect(r.redispatches).toBe(1);
  }, 60_000);
});
