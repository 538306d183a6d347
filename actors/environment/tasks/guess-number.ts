// Built-in multi-turn task: guess a secret number from 1 to `max` (default 16). After each guess the
// environment replies " higher\n", " lower\n" or " correct\n" as tokens with loss mask 0, and the
// model guesses again with the whole conversation as its prompt — the prefix cache's best case.
// Reward: 1 for the right number, less for each extra turn; 0 if never found.
import { decodeBytes, encodeBytes } from "../../../src/engine/tokenizer.ts";
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";

interface GuessState {
  secret: number;
  turns: number;
  solved: boolean;
}

/** Configuration: `max` secret (2–100, default 16), `maxTurns` (default 6). */
export interface GuessConfig {
  max?: number;
  maxTurns?: number;
}

export const createGuessNumberTask: TaskFactory = (config) => {
  const max = Number((config as GuessConfig).max ?? 16);
  const maxTurns = Number((config as GuessConfig).maxTurns ?? 6);
  if (!Number.isInteger(max) || max < 2 || max > 100) throw new RangeError(`guess-number: max must be an integer in [2, 100] (got ${max})`);
  if (!Number.isInteger(maxTurns) || maxTurns < 1) throw new RangeError(`guess-number: maxTurns must be ≥ 1 (got ${maxTurns})`);
  const task: Task<GuessState> = {
    name: "guess-number",
    maxTurns,
    maxTurnTokens: 4,
    reset(index, seed) {
      const rand = prng(episodeSeed(index, seed));
      const secret = 1 + Math.floor(rand() * max);
      const prompt = `guess 1-${max}:`;
      return { prompt, promptIds: encodeBytes(prompt, true), state: { secret, turns: 0, solved: false } };
    },
    step(state, action) {
      const turns = state.turns + 1;
      const guess = Number.parseInt(decodeBytes(action).trim(), 10);
      if (guess === state.secret) return { state: { ...state, turns, solved: true }, observation: encodeBytes(" correct\n"), done: true };
      const done = turns >= maxTurns;
      const reply = Number.isNaN(guess) ? " number?\n" : guess < state.secret ? " higher\n" : " lower\n";
      return { state: { ...state, turns }, observation: done ? new Int32Array(0) : encodeBytes(reply), done };
    },
    reward(state) {
      if (!state.solved) return 0;
      return Math.max(0.1, 1 - 0.1 * (state.turns - 1));
    },
    success(state) {
      return state.solved;
    },
  };
  return task as Task;
};

export default createGuessNumberTask;
