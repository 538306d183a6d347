// The loop at scale in miniature: `ooze train`'s actors (fleet, router, rollout, buffer, trainer,
// weight sync) on a real nats-server, against four simulated engines (real HTTP servers in this
// process, src/engine/sim/) and the simulated trainer (train.simulate: no native worker), on the
// heavy-tailed multi-turn bench task, in sync and fully_async mode (and fully_async with its updates
// paused in place, train.pauseOnUpdate): every sample index is trained or
// dropped once, versions 1..3 in order, every engine ends at version 3 (pause → update → continue ran
// against each), the engines' prefix caches serve the episodes' later turns, and no trainer worker
// process was started.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { enginesSchema, trainSchema } from "../../actors/protocol/config.ts";
import { readJsonl, type BatchRecord, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { H100_LLAMA_8B } from "../../src/engine/sim/perf-model.ts";
import { type SimEngines, startSimEngines } from "../../src/engine/sim/sim-engines.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { useNats } from "../harness/index.ts";

const nats = useNats();
const dirs: string[] = [];
const fleets: SimEngines[] = [];
afterAll(async () => {
  await Promise.all(fleets.map((f) => f.close()));
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

describe("the loop against simulated engines and a simulated trainer", () => {
  const cases = [{ mode: "sync" }, { mode: "fully_async" }, { mode: "fully_async", inPlace: true }] as const;
  for (const c of cases) {
    const mode = c.mode, inPlace = "inPlace" in c;
    it(`${mode}${inPlace ? ", updates paused in place" : ""}: every sample index once, versions in order, every engine updated, no trainer worker`, async () => {
      const out = mkdtempSync(join(tmpdir(), "ooze-sim-train-"));
      dirs.push(out);
      // the default table's 1.5 s weight update (an 8B model's reload) three times a case was 4.5 s of its
      // ~8; the loop's order of pause, update and continue is the same at 0.2 s
      const engines = await startSimEngines({ count: 4, seed: 1, table: { ...H100_LLAMA_8B, updateWeightsMs: 200 } });
      fleets.push(engines);
      const lines: string[] = [];
      await runTrainJob({
        topology: parseTopology("name: sim-train\nactors: [{ name: rollout, kind: train.rollout }]\n"),
        train: trainSchema.parse({
          mode, steps: 3, promptsPerStep: 4, samplesPerPrompt: 4, preset: "tiny", checkpointEvery: 100,
          task: resolve("bench/lib/long-tail-task.ts"), taskConfig: { alpha: 1.0, maxTurns: 4, turnTokens: 8 },
          simulate: { tokensPerSecond: 20_000, stepOverheadMs: 10 },
          ...(inPlace ? { keepCacheOnUpdate: true, pauseOnUpdate: "in_place" } : {}),
        }),
        engines: enginesSchema.parse({ count: 0, urls: engines.urls }),
        out, job: `sim-train-${mode.replace("_", "-")}${inPlace ? "-in-place" : ""}`, verbose: true,
        nats: { url: nats.server.url, token: nats.server.token },
        log: (l) => lines.push(l),
      });
      const metrics = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
      expect(metrics.map((m) => m.weight_version)).toEqual([1, 2, 3]);
      const records = readJsonl<BatchRecord & { requeued?: number[] }>(join(out, "batches.jsonl"));
      const seen = records.flatMap((r) => [...r.trained, ...r.dropped, ...(r.requeued ?? [])]).sort((a, b) => a - b);
      expect(new Set(seen).size, lines.slice(-20).join("\n")).toBe(seen.length);
      if (mode === "sync") expect(seen).toEqual(Array.from({ length: 48 }, (_, i) => i));
      for (const u of engines.urls) expect(await new EngineClient(u).weightVersion()).toBe("3");
      expect(engines.stats().reduce((n, s) => n + s.hitTokens, 0)).toBeGreaterThan(0);
      expect(lines.some((l) => /trainer: worker pid - at weight version 0/.test(l))).toBe(true);
    }, 120_000);
  }
});
