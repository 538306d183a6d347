// One end-to-end agent episode per SDK: the calculator example agents (official `openai` and
// `@anthropic-ai/sdk` packages, unmodified child processes) run by the agent rollout hook against
// the gateway over a real engine server child process (the SGLang-compatible server `ooze serve`
// runs, tiny preset). Their samples are token-exact trajectories (the rendered prompt with mask 0,
// the engine's sampled ids with mask 1 and their logprobs), numbered in the episode's index range.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAgentRollout } from "../../actors/environment/agent/rollout-hook.ts";
import { trainSchema } from "../../actors/protocol/config.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { decodeBytes } from "../../src/engine/tokenizer.ts";
import { sampleProblem } from "../../src/sample.ts";
import { spawnEngine, type EngineProcess } from "../fixtures/engine-process.ts";

const examples = resolve(import.meta.dirname, "../../examples/agents");
const dir = mkdtempSync(join(tmpdir(), "ooze-agent-e2e-"));
let engine: EngineProcess;
let fleet: Fleet;

beforeAll(async () => {
  await initModelDir("tiny", join(dir, "model"), 1);
  engine = await spawnEngine(join(dir, "model"));
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 30_000 });
  await fleet.attach(engine.url);
});
afterAll(async () => {
  await fleet?.close();
  await engine?.kill("SIGTERM");
  rmSync(dir, { recursive: true, force: true });
});

describe.each([["calculator-openai.mjs"], ["calculator-anthropic.mjs"]])("agent %s through the gateway", (script) => {
  it("runs two episodes of a group and returns their token-exact samples in the episodes' index ranges", async () => {
    const train = trainSchema.parse({
      preset: "tiny", task: "./calculator-task.ts", samplesPerPrompt: 2, temperature: 1,
      agent: { command: process.execPath, args: [join(examples, script)], maxSegments: 3, timeoutS: 60, maxTurns: 4, maxTokens: 200 },
    });
    const agents = await startAgentRollout({ ...train, agent: train.agent! }, examples, fleet);
    try {
      const samples = await agents.group({ groupIndex: 4, firstSample: 30, samples: 6 });
      const byEpisode = new Map<string, number[]>();
      for (const s of samples) byEpisode.set(s.rolloutId, [...(byEpisode.get(s.rolloutId) ?? []), s.index]);
      expect([...byEpisode.keys()].sort()).toEqual(["r30", "r33"]);
      for (const [id, idx] of byEpisode) expect(idx, id).toEqual(idx.map((_, k) => Number(id.slice(1)) + k));
      for (const s of samples) {
        expect(["completed", "truncated"], JSON.stringify(s.metadata)).toContain(s.status); // an untrained model may run out of max_tokens
        expect(sampleProblem(s)).toBeNull();
        expect(s.groupIndex).toBe(4);
        expect(s.reward).toBeGreaterThanOrEqual(0);
        expect(s.reward).toBeLessThanOrEqual(1);
        const prompt = decodeBytes(s.tokens.subarray(0, s.tokens.length - s.responseLength), false);
        expect(prompt).toContain("<|user|>"); // the chat template rendered the agent's messages
        expect(prompt).toContain("calc");     // with its tool
        expect(s.lossMask.includes(1)).toBe(true);
        for (let i = 0; i < s.responseLength; i++) if (s.lossMask[i] === 1) expect(s.rolloutLogprobs[i]).toBeLessThan(0);
        expect(s.metadata.requests).toBeGreaterThanOrEqual(1);
      }
    } finally {
      await agents.close();
    }
  });
});
