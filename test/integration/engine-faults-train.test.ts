// Engine faults under `ooze train`'s actor loop (issue 13): the job's only engine, a real `ooze
// serve` (tiny preset), sits behind the fault-injecting proxy of ooze/testing, which holds back the
// reply of 30 % of /generate requests on an open connection (a hung engine). The rollout actor's
// fleet abandons each such dispatch at its progress deadline (set in the rollout actor's config) and
// re-dispatches it: the run finishes every step with no failed, dropped, lost or duplicated sample.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { enginesSchema, trainSchema } from "../../actors/protocol/config.ts";
import { readJsonl, type BatchRecord, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { assertInvariants, everySampleOnce, noFailedSamples, startEngineFaultProxy, useNats, versionsIncrease, waitUntil } from "../harness/index.ts";

const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-engine-faults-train-"));
let engine: ChildProcess | null = null;

afterAll(async () => {
  if (engine && engine.exitCode === null && engine.signalCode === null) {
    const gone = new Promise((r) => engine!.once("exit", r));
    engine.kill("SIGTERM");
    await gone;
  }
  rmSync(dir, { recursive: true, force: true });
});

describe("ooze train with a hanging engine", () => {
  it("30 % of /generate replies never come: every step trains all its samples, none failed, lost or duplicated", async () => {
    engine = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--preset", "tiny", "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    engine.stdout!.on("data", (d) => (log += d));
    engine.stderr!.on("data", (d) => (log += d));
    const url = await waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "the ooze serve URL", diagnostics: () => log });
    const proxy = await startEngineFaultProxy(url, { kind: "hang", rate: 0.3, seed: 5 });
    const lines: string[] = [];
    try {
      const topology = parseTopology(
        [
          "name: tiny-train-faults",
          "actors:",
          "  - { name: trainer, kind: train.trainer }",
          "  - { name: rollout, kind: train.rollout, config: { progressTimeoutMs: 3000, maxRetries: 20 } }",
        ].join("\n"),
      );
      const out = join(dir, "run");
      const s = await runTrainJob({
        topology,
        train: trainSchema.parse({ task: "addition", taskConfig: { digits: 1 }, preset: "tiny", promptsPerStep: 3, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 10, steps: 3 }),
        engines: enginesSchema.parse({ count: 0, urls: [proxy.url] }),
        out,
        job: `engine-faults-train-${process.pid}`,
        verbose: true,
        nats: { url: nats.server.url, token: nats.server.token },
        log: (l) => lines.push(l),
      });
      expect(s.steps).toBe(3);
      expect(proxy.stats().faulted.hang ?? 0, lines.join("\n")).toBeGreaterThan(0);
      expect(lines.some((l) => /progress deadline/.test(l))).toBe(true);
      await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, noFailedSamples, versionsIncrease], lines.join("\n"));
      expect(readJsonl<StepMetrics>(join(out, "metrics.jsonl"))).toHaveLength(3);
      const records = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
      expect(records.flatMap((r) => r.dropped)).toEqual([]);
      expect(records.flatMap((r) => r.trained)).toHaveLength(36);
    } finally {
      await proxy.close();
    }
  }, 240_000);
});
