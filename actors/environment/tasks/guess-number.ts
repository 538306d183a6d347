// Built-in multi-turn task: guess a secret number from 1 to `max` (default 16). Prompt "guess 1-16:"
// (after BOS where the tokenizer has one), in the model's tokenizer (TaskContext; the byte tokenizer
// by default). After each guess the environment replies " higher\n", " lower\n" or " correct\n" as
// tokens with loss mask 0, and the model guesses again with the whole conversation as its prompt —
// the prefix cache's best case. With `replies: interval` the reply also names the numbers still
// possible, in the prompt's own form ("guess 1-16:8 higher 9-16:12 lower 9-11:10 correct\n"): the
// model need not remember the whole conversation to guess well, only read the last interval.
// A guess is at most as many tokens as `max` has digits ("8", "08" or "8" then EOS; one digit a
// token, as the byte and Qwen tokenizers have): the turn ends there, so a model learns numbers
// without having to learn to stop. Reward: 1 for the right number, 0.1 less for each extra turn (at
// least 0.5 when found). Not found: 0, or with `shaped` (default) up to 0.3 for the guesses that
// were consistent with the replies so far (in range and inside the interval the replies leave): the
// skill the task is about — reading the feedback — gets credit before a random model ever finds the
// number.
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";
import { byteTaskTokenizer, encodePrompt } from "../task-tokenizer.ts";

interface GuessState {
  secret: number;
  turns: number;
  solved: boolean;
  /** The interval the replies so far leave open. */
  lo: number;
  hi: number;
  /** Guesses inside [lo, hi] when they were made. */
  consistent: number;
}

/** Configuration: `max` secret (2–100, default 16), `maxTurns` (default 6), `shaped` reward (default true). */
export interface GuessConfig {
  max?: number;
  maxTurns?: number;
  shaped?: boolean;
  /**
   * What a shaped reward credits when the number is not found: "consistent" (default): up to 0.3
   * for guesses inside the interval the replies left; "information": up to 0.4 for how far the
   * replies narrowed the interval, log2(max / numbers still possible) / log2(max), so a guess that
   * halves the interval earns more than one that removes a single number.
   */
  credit?: "consistent" | "information";
  /** "direction" (default): " higher\n" / " lower\n"; "interval": " higher 9-16:" / " lower 1-7:". */
  replies?: "direction" | "interval";
  /**
   * Turn-level credit (for algorithm: ppo): each turn reports what it added to the shaped credit
   * (with credit: information, the information its reply gave: 0.4·log2(before / after) / log2(max)
   * of the interval), so GAE sees the good guess when it is made; the episode's reward is unchanged.
   * Default false.
   */
  turnRewards?: boolean;
}

export const createGuessNumberTask: TaskFactory = (config, context) => {
  const tok = context?.tokenizer ?? byteTaskTokenizer();
  const max = Number((config as GuessConfig).max ?? 16);
  const maxTurns = Number((config as GuessConfig).maxTurns ?? 6);
  const shaped = (config as GuessConfig).shaped ?? true;
  const replies = (config as GuessConfig).replies ?? "direction";
  const credit = (config as GuessConfig).credit ?? "consistent";
  const turnRewards = (config as GuessConfig).turnRewards ?? false;
  if (credit !== "consistent" && credit !== "information") throw new RangeError(`guess-number: credit must be "consistent" or "information" (got ${JSON.stringify(credit)})`);
  if (replies !== "direction" && replies !== "interval") throw new RangeError(`guess-number: replies must be "direction" or "interval" (got ${JSON.stringify(replies)})`);
  if (!Number.isInteger(max) || max < 2 || max > 100) throw new RangeError(`guess-number: max must be an integer in [2, 100] (got ${max})`);
  if (!Number.isInteger(maxTurns) || maxTurns < 1) throw new RangeError(`guess-number: maxTurns must be ≥ 1 (got ${maxTurns})`);
  /** The shaped credit of an unfound number so far (see `credit`). */
  const shapedCredit = (st: GuessState): number =>
    credit === "information" ? (0.4 * Math.log2(max / (st.hi - st.lo + 1))) / Math.log2(max) : (0.3 * st.consistent) / maxTurns;
  const task: Task<GuessState> = {
    name: "guess-number",
    maxTurns,
    maxTurnTokens: String(max).length,
    eosId: tok.eos,
    reset(index, seed) {
      const rand = prng(episodeSeed(index, seed));
      const secret = 1 + Math.floor(rand() * max);
      const prompt = `guess 1-${max}:`;
      return { prompt, promptIds: encodePrompt(tok, prompt), state: { secret, turns: 0, solved: false, lo: 1, hi: max, consistent: 0 } };
    },
    step(state, action) {
      const turns = state.turns + 1;
      const guess = Number.parseInt(tok.decode(action).trim(), 10);
      const consistent = state.consistent + (guess >= state.lo && guess <= state.hi ? 1 : 0);
      // the shaped credit this turn added (turn-level credit); a found number's reward comes at the end
      const turnReward = (next: GuessState) => (turnRewards && shaped ? { reward: shapedCredit(next) - shapedCredit(state) } : {});
      if (guess === state.secret) {
        const next = { ...state, turns, consistent, solved: true };
        return { state: next, observation: tok.encode(" correct\n"), done: true, ...turnReward({ ...state, turns, consistent }) };
      }
      const done = turns >= maxTurns;
      const lo = guess < state.secret ? Math.max(state.lo, guess + 1) : state.lo;
      const hi = guess > state.secret ? Math.min(state.hi, guess - 1) : state.hi;
      const word = Number.isNaN(guess) ? " number?" : guess < state.secret ? " higher" : " lower";
      const reply = replies === "interval" ? `${word} ${lo}-${hi}:` : `${word}\n`;
      const next = { ...state, turns, consistent, lo, hi };
      return { state: next, observation: done ? new Int32Array(0) : tok.encode(reply), done, ...turnReward(next) };
    },
    reward(state) {
      if (!state.solved) return shaped ? shapedCredit(state) : 0;
      return Math.max(0.5, 1 - 0.1 * (state.turns - 1));
    },
    success(state) {
      return state.solved;
    },
  };
  return task as Task;
};

export default createGuessNumberTask;
