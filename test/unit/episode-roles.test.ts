// Rewards per role (Task.roleReward): in a task of two roles that are not rewarded alike — a proposer
// rewarded for the problems its solver fails, the solver for solving them — each context's sample
// carries its own role's reward (the mean over the branches through it); without roleReward every
// context carries the episode's reward, as before.
import { describe, expect, it } from "vitest";
import type { Task } from "../../actors/environment/task.ts";
import { runEpisode, type EpisodeSpec } from "../../actors/rollout/episode.ts";
import type { Generator } from "../../actors/rollout/generator.ts";

interface Duel {
  /** The solver's answer, once it has played. */
  answer: number | null;
}

const SOLVED = 7;

/** The proposer plays one turn, then the solver answers in a context of its own; 7 solves it. */
function duel(perRole: boolean): Task<Duel> {
  return {
    name: "duel",
    maxTurns: 2,
    maxTurnTokens: 1,
    roles: ["proposer", "solver"],
    reset: () => ({ prompt: "propose:", promptIds: Int32Array.of(1, 2), state: { answer: null } }),
    step: (state, action) =>
      state.answer === null && action[0] !== SOLVED && action[0] !== 3
        ? { state, observation: new Int32Array(0), done: false, context: { role: "solver", prompt: "solve:", promptIds: Int32Array.of(4, 5) } }
        : { state: { answer: action[0] ?? -1 }, observation: new Int32Array(0), done: true },
    reward: (s) => (s.answer === SOLVED ? 1 : 0),
    ...(perRole ? { roleReward: (s: Duel, role: string) => (role === "solver" ? Number(s.answer === SOLVED) : Number(s.answer !== SOLVED)) } : {}),
  };
}

/**
 * Stands in for the engines (the rollout's Generator): the proposer's context samples token 9, the
 * solver's first branch (session r0.1) the solving 7, its other two (r0.2, r0.3) a wrong 3.
 */
const gen: Generator = {
  generate: async (req) => {
    const token = req.sessionId === "r0" ? 9 : req.sessionId === "r0.1" ? SOLVED : 3;
    return { outputIds: Int32Array.of(token), logprobs: new Float32Array(1), status: "completed", weightVersions: [{ start: 0, end: 1, version: "0" }] };
  },
  takeCacheStats: () => ({ promptTokens: 0, cachedTokens: 0 }),
};

const spec: EpisodeSpec = {
  index: 0, groupIndex: 0, seed: 1, temperature: 1, samplingSeed: 1,
  roles: new Map([["proposer", { policy: "proposer", lora: null }], ["solver", { policy: "solver", lora: null, contexts: 3 }]]),
};

describe("rewards per role", () => {
  it("each context's sample carries its role's reward, the mean over the branches through it", async () => {
    const samples = await runEpisode(duel(true), gen, spec);
    expect(samples.map((s) => s.metadata.role)).toEqual(["proposer", "solver", "solver", "solver"]);
    expect(samples.slice(1).map((s) => s.tokens.at(-1))).toEqual([SOLVED, 3, 3]);
    // the proposer's one context saw all three branches: the solver failed two of them
    expect(samples.map((s) => s.reward)).toEqual([2 / 3, 1, 0, 0]);
  });

  it("without roleReward, every context carries the episode's reward", async () => {
    const samples = await runEpisode(duel(false), gen, spec);
    expect(samples.map((s) => s.reward)).toEqual([1 / 3, 1, 0, 0]);
  });
});
