// The referential game as two agents on the `openai` SDK, end to end: `ooze train`'s job (a real
// nats-server, embedded engine, trainer workers) runs topologies/agent-referential-openai.yaml for
// two small steps — examples/agents/referential-openai.mjs in its sandbox per episode, through the
// gateway, two games an episode played at once. Each game gives one describer sample and eight guesser
// samples (the `n` choices of one request), each guess rewarded on its own and the describer with
// their mean;
// both policies train, and each sample's tokens were sampled with its own policy's adapter of the
// version that made them.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { batchRegistry } from "../../actors/protocol/messages.ts";
import { readJsonl, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { scanStream } from "../../actors/protocol/streams.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { decodeBytes, encodeBytes } from "../../src/engine/tokenizer.ts";
import { loadTopology } from "../../src/topology/load.ts";
import { jobNames } from "../../src/transport/names.ts";
import type { Sample } from "../../src/sample.ts";
import { rolloutLogprobGap, useNats } from "../harness/index.ts";

const nats = useNats();
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const STEPS = 2, PROMPTS = 2, EPISODES = 2, GAMES = 2, GUESSES = 8;
const response = (s: Sample) => s.tokens.subarray(s.tokens.length - s.responseLength);
const promptOf = (s: Sample) => s.tokens.subarray(0, s.tokens.length - s.responseLength);

describe("the referential game on the openai SDK through the gateway", () => {
  it("trains the describer and the guesser, each guess rewarded on its own", async () => {
    const out = mkdtempSync(join(tmpdir(), "ooze-train-agent-policies-"));
    dirs.push(out);
    const job = `train-agent-policies-${process.pid}`;
    const topology = loadTopology("topologies/agent-referential-openai.yaml");
    const { train, engines } = trainConfigOf(topology);
    Object.assign(train, { steps: STEPS, promptsPerStep: PROMPTS, samplesPerPrompt: EPISODES, checkpointEvery: 50, taskConfig: { games: GAMES } });
    const summary = await runTrainJob({ topology, train, engines, out, job, verbose: false, nats: { url: nats.server.url, token: nats.server.token } });
    expect(summary.steps).toBe(STEPS);
    // both policies got samples and trained at every step
    for (const m of readJsonl<StepMetrics>(join(out, "metrics.jsonl"))) {
      expect([m.policy_describer_samples, m.policy_guesser_samples]).toEqual([PROMPTS * EPISODES * GAMES, PROMPTS * EPISODES * GAMES * GUESSES]);
      for (const p of ["describer", "guesser"]) expect(typeof m[`policy_${p}_loss`]).toBe("number");
      expect(m.failed).toBe(0);
    }

    const bus = await nats.connect();
    const last = (await scanStream(bus, jobNames(job).streamBatches, batchRegistry)).find((b) => b.body.step === STEPS)!.body.samples;
    const describers = last.filter((s) => s.policy === "describer");
    expect(describers).toHaveLength(PROMPTS * EPISODES * GAMES);
    // an episode's samples (rollout ids rN, rN.1, rN.2, …): its games' describer samples and guesses,
    // in the order the agent's requests finished (it plays its games at once)
    const episodes = new Map<string, Sample[]>();
    for (const s of last) episodes.set(s.rolloutId.split(".")[0]!, [...(episodes.get(s.rolloutId.split(".")[0]!) ?? []), s]);
    expect(episodes.size).toBe(PROMPTS * EPISODES);
    for (const samples of episodes.values()) {
      samples.sort((a, b) => a.index - b.index);
      expect(samples.map((s, k) => [s.index - samples[0]!.index, s.metadata.context])).toEqual(Array.from({ length: GAMES * (1 + GUESSES) }, (_, k) => [k, k]));
      const ds = samples.filter((s) => s.policy === "describer"), gs = samples.filter((s) => s.policy === "guesser");
      expect([ds.length, gs.length]).toEqual([GAMES, GAMES * GUESSES]);
      // each message's guesses: the guesser sees the message as the gateway renders it, never the
      // secret's prompt, and each guess is right only for a secret that message was written for
      const byMessage = new Map<string, { wants: string[]; describers: Sample[]; guesses: Sample[] }>();
      for (const d of ds) {
        const secret = decodeBytes(promptOf(d)).match(/<\|user\|>([A-H])\n/)![1]!;
        const message = decodeBytes(response(d));
        const m = byMessage.get(message) ?? { wants: [], describers: [], guesses: [] };
        m.wants.push(String("ABCDEFGH".indexOf(secret)));
        m.describers.push(d);
        byMessage.set(message, m);
        expect(d.metadata.success).toBeNull();
      }
      for (const g of gs) {
        const message = [...byMessage.keys()].find((m) => Array.from(promptOf(g)).join() === [256, ...encodeBytes(`<|user|>${m}\n<|assistant|>`)].join());
        expect(message).toBeDefined();
        const m = byMessage.get(message!)!;
        m.guesses.push(g);
        expect(g.metadata.success).toBe(g.reward === 1);
        if (g.reward === 1) expect(m.wants).toContain(decodeBytes(response(g)).trim());
      }
      for (const m of byMessage.values()) {
        expect(m.guesses).toHaveLength(m.describers.length * GUESSES);
        // a describer's reward is the mean of its own game's guesses
        const guessed = m.guesses.reduce((a, g) => a + g.reward!, 0), described = m.describers.reduce((a, d) => a + d.reward! * GUESSES, 0);
        expect(described).toBeCloseTo(guessed, 9);
        // with one game behind the message, every guess is checked against that game's secret
        if (m.describers.length === 1) for (const g of m.guesses) expect(g.reward).toBe(decodeBytes(response(g)).trim() === m.wants[0] ? 1 : 0);
      }
    }
    // version 1 sampled the last step: each role's tokens are its own adapter's, not the other's
    expect(last.every((s) => s.weightVersions.every((w) => w.version === "1"))).toBe(true);
    const v1 = join(out, "weights", "v1");
    expect(await rolloutLogprobGap(join(v1, "describer"), describers)).toBeLessThan(1e-4);
    expect(await rolloutLogprobGap(join(v1, "guesser"), last.filter((s) => s.policy === "guesser"))).toBeLessThan(1e-4);
    expect(await rolloutLogprobGap(join(v1, "guesser"), describers)).toBeGreaterThan(1e-3);
  });
});
