// Bench-only task with heavy-tailed episode lengths, for `npm run bench -- loop`: prompt i asks for
// k_i model turns, k_i drawn from a discrete Pareto law (P(k ≥ x) = x^-alpha, capped at maxTurns),
// each turn up to `turnTokens` sampled tokens, the environment answering " ok\n" (loss mask 0)
// between turns. Lengths depend on the prompt only (not on the model), so every mode of the loop
// sees the same workload. Reward: the fraction of sampled bytes that are digits (varies within a
// group, so the estimators have a signal).
import { decodeBytes, encodeBytes } from "../../src/engine/tokenizer.ts";
import { episodeSeed, prng, type Task, type TaskFactory } from "../../actors/environment/task.ts";

interface TailState {
  turns: number;
  /** Turns this prompt asks for. */
  want: number;
  digits: number;
  bytes: number;
}

/** Configuration: `alpha` (tail index, default 1.1), `maxTurns` (cap, default 32), `turnTokens` (default 8). */
export interface LongTailConfig {
  alpha?: number;
  maxTurns?: number;
  turnTokens?: number;
}

/** Turns prompt `index` asks for: a discrete Pareto draw, deterministic in index and seed. */
export function turnsOf(index: number, seed: number, alpha: number, maxTurns: number): number {
  const u = prng(episodeSeed(index, seed))();
  return Math.max(1, Math.min(maxTurns, Math.floor(Math.pow(1 - u, -1 / alpha))));
}

const createLongTailTask: TaskFactory = (config) => {
  const c = config as LongTailConfig;
  const alpha = Number(c.alpha ?? 1.1);
  const maxTurns = Number(c.maxTurns ?? 32);
  const turnTokens = Number(c.turnTokens ?? 8);
  if (!(alpha > 0) || !Number.isInteger(maxTurns) || maxTurns < 1 || !Number.isInteger(turnTokens) || turnTokens < 1)
    throw new RangeError(`long-tail: alpha > 0, maxTurns ≥ 1 and turnTokens ≥ 1 (integers) are required (got ${alpha}, ${maxTurns}, ${turnTokens})`);
  const reply = encodeBytes(" ok\n");
  const task: Task<TailState> = {
    name: "long-tail",
    maxTurns,
    maxTurnTokens: turnTokens,
    reset(index, seed) {
      const want = turnsOf(index, seed, alpha, maxTurns);
      const prompt = `write ${want}:`;
      return { prompt, promptIds: encodeBytes(prompt, true), state: { turns: 0, want, digits: 0, bytes: 0 } };
    },
    step(state, action) {
      const text = decodeBytes(action);
      const digits = state.digits + [...text].filter((ch) => ch >= "0" && ch <= "9").length;
      const next = { ...state, turns: state.turns + 1, digits, bytes: state.bytes + action.length };
      const done = next.turns >= state.want;
      return { state: next, observation: done ? new Int32Array(0) : reply, done };
    },
    reward(state) {
      return state.bytes > 0 ? state.digits / state.bytes : 0;
    },
  };
  return task as Task;
};

export default createLongTailTask;
