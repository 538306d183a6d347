// `ooze train` on an agent topology (a real CLI process: embedded NATS, engine and trainer worker
// children, agent processes through the gateway): episodes yield one or two samples, and every
// step trains exactly the samples its prompts produced, numbered group · slots + episode ·
// maxSegments + segment (slots = samplesPerPrompt × maxSegments = 6 here). And a job whose agent
// never calls the model: it says why each round produced nothing and stops, exit status non-zero,
// after the buffer's maxEmptyRounds (no crash loop), in sync mode and in fully_async (an empty batch is a round).
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";

const dir = mkdtempSync(join(tmpdir(), "ooze-train-agent-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it("trains variable samples per prompt: episode 0 of each group one segment, episode 1 two", () => {
  const r = spawnSync(process.execPath, ["bin/ooze.mjs", "train", "test/fixtures/topologies/agent-segments.yaml", "--out", dir, "--quiet"], { encoding: "utf8", timeout: 300_000 });
  expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
  const batches = readFileSync(join(dir, "batches.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { step: number; trained: number[]; dropped: number[] });
  expect(batches.map((b) => b.step)).toEqual([1, 2]);
  // groups 0-1 in step 1, 2-3 in step 2: episode 0 → index 6g, episode 1 → 6g + 3 and 6g + 4
  const expected = (groups: number[]) => groups.flatMap((g) => [6 * g, 6 * g + 3, 6 * g + 4]).sort((a, b) => a - b);
  expect([...batches[0]!.trained].sort((a, b) => a - b)).toEqual(expected([0, 1]));
  expect([...batches[1]!.trained].sort((a, b) => a - b)).toEqual(expected([2, 3]));
  expect(batches.every((b) => b.dropped.length === 0)).toBe(true);
  const metrics = readFileSync(join(dir, "metrics.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as { samples: number; reward_mean: number });
  expect(metrics.map((m) => m.samples)).toEqual([6, 6]);
  // rewards: 1 for the two samples of each two-segment episode, 0 for the single one → 2/3
  for (const m of metrics) expect(m.reward_mean).toBeCloseTo(2 / 3, 9);
});

it("stops a job whose agent makes no model request, with the episodes' error, exit status non-zero", () => {
  const out = join(dir, "silent");
  const r = spawnSync(process.execPath, ["bin/ooze.mjs", "train", "test/fixtures/topologies/agent-silent.yaml", "--out", out], { encoding: "utf8", timeout: 300_000 });
  const text = `${r.stdout}\n${r.stderr}`;
  expect(r.status, text).not.toBe(0);
  // each round: the step's groups and their refills, every episode failed the same way
  expect(text).toMatch(/round 1 in a row produced no trainable sample: (\d+) of \1 samples failed: "the agent made no model request" \(×\1\)/);
  expect(text).toMatch(/\[AGENTS_UNPRODUCTIVE\] buffer: 2 rounds in a row produced no trainable sample .*"the agent made no model request"/);
  expect(text).not.toMatch(/restart in \d+ ms/);
});

it("fully_async: the same silent agent stops the job too, each empty batch counted as a round", () => {
  const out = join(dir, "silent-async");
  const r = spawnSync(process.execPath, ["bin/ooze.mjs", "train", "test/fixtures/topologies/agent-silent.yaml", "--mode", "fully_async", "--steps", "6", "--out", out], { encoding: "utf8", timeout: 300_000 });
  const text = `${r.stdout}\n${r.stderr}`;
  expect(r.status, text).not.toBe(0);
  expect(text).toMatch(/round 1 in a row produced no trainable sample: (\d+) of \1 samples failed: "the agent made no model request"/);
  expect(text).toMatch(/\[AGENTS_UNPRODUCTIVE\] buffer: 2 rounds in a row produced no trainable sample .*"the agent made no model request"/);
  expect(text).not.toMatch(/restart in \d+ ms/);
});
