// Built-in single-turn task: add two numbers. Prompt "12+34=" (after BOS where the tokenizer has
// one), in the model's tokenizer (TaskContext; the byte tokenizer by default). What the model answers
// depends on `answer` (token budgets assume one digit a token, as the byte and Qwen tokenizers have):
// - "full" (default): the sum, then EOS ("46"). Reward 1 for the exact answer; with `shaped`
//   (default), partial credit for stopping (EOS within the turn's budget), for answering with digits,
//   for the right length and for each correct digit, so a randomly initialised model gets a signal
//   from scratch — stopping included: without credit for it, EOS (rare in a random model) is squeezed
//   out while digits are learned, and the policy collapses onto answers that never end.
// - "padded": the sum zero-padded to digits + 1 places ("046"), exactly that many tokens, no EOS.
//   Reward 1 if exact; with `shaped`, half a point spread over the places that are right.
// - "last-digit": the sum's last digit ("6"), one token: reward 1 if right, else 0.
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";
import { byteTaskTokenizer, encodePrompt } from "../task-tokenizer.ts";

interface AdditionState {
  answer: string;
  response: string;
  /** The model ended its answer (EOS) within the budget. */
  stopped: boolean;
}

/** Configuration: `digits` per operand (1–3, default 2), `shaped` reward (default true), `answer` (see above). */
export interface AdditionConfig {
  digits?: number;
  shaped?: boolean;
  answer?: (typeof ANSWERS)[number];
}

/**
 * Score of an answer against the right one, in [0, 1]. Shaped: 0.1 for stopping, then 0.05 for a
 * leading digit, or 0.1 for all digits + 0.1 for the right length + up to 0.5 for correct digits
 * (aligned from the right; halved when the length is wrong).
 */
export function additionReward(answer: string, response: string, shaped: boolean, stopped = true): number {
  const r = response.trim();
  if (r === answer && stopped) return 1;
  if (!shaped) return 0;
  const stop = stopped ? 0.1 : 0;
  if (!/^\d+$/.test(r)) return stop + (/^\d/.test(r) ? 0.05 : 0);
  let correct = 0;
  // digits aligned from the right (units with units)
  for (let i = 1; i <= answer.length; i++) if (r[r.length - i] === answer[answer.length - i]) correct++;
  const lengthOk = r.length === answer.length;
  return Math.min(0.95, stop + 0.1 + (lengthOk ? 0.1 : 0) + 0.5 * (correct / answer.length) * (lengthOk ? 1 : 0.5));
}

const ANSWERS = ["full", "padded", "last-digit"] as const;

export const createAdditionTask: TaskFactory = (config, context) => {
  const c = config as AdditionConfig;
  const tok = context?.tokenizer ?? byteTaskTokenizer();
  const digits = Number(c.digits ?? 2);
  const shaped = c.shaped ?? true;
  const mode = c.answer ?? "full";
  if (!ANSWERS.includes(mode)) throw new RangeError(`addition: answer must be one of ${ANSWERS.join(", ")} (got ${JSON.stringify(c.answer)})`);
  if (!Number.isInteger(digits) || digits < 1 || digits > 3) throw new RangeError(`addition: digits must be 1, 2 or 3 (got ${digits})`);
  const max = 10 ** digits;
  // fixed-width answers are complete at their budget: no EOS to learn
  const width = mode === "last-digit" ? 1 : mode === "padded" ? digits + 1 : null;
  const task: Task<AdditionState> = {
    name: "addition",
    maxTurns: 1,
    maxTurnTokens: width ?? digits + 3,
    eosId: tok.eos,
    reset(index, seed) {
      const rand = prng(episodeSeed(index, seed));
      const a = Math.floor(rand() * max);
      const b = Math.floor(rand() * max);
      const prompt = `${a}+${b}=`;
      const answer = mode === "last-digit" ? String((a + b) % 10) : mode === "padded" ? String(a + b).padStart(width!, "0") : String(a + b);
      return { prompt, promptIds: encodePrompt(tok, prompt), state: { answer, response: "", stopped: false } };
    },
    step(state, action) {
      // the action excludes EOS: shorter than the budget means the model stopped by itself
      const stopped = width !== null || action.length < task.maxTurnTokens;
      return { state: { ...state, response: tok.decode(action), stopped }, observation: new Int32Array(0), done: true };
    },
    reward(state) {
      if (width === null) return additionReward(state.answer, state.response, shaped, state.stopped);
      if (state.response === state.answer) return 1;
      if (!shaped || width === 1) return 0;
      // partial credit: half a point spread over the answer's digits, each right in its place
      let right = 0;
      for (let i = 0; i < width; i++) if (state.response[i] === state.answer[i]) right++;
      return (0.5 * right) / width;
    },
    success(state) {
      return state.stopped && state.response.trim() === state.answer;
    },
  };
  return task as Task;
};

export default createAdditionTask;
