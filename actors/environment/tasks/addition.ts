// Built-in single-turn task: add two numbers. Prompt "<bos>12+34=", the model answers "46" and EOS.
// With `answer: "last-digit"` the model answers only the last digit of the sum ("6"), one token, and
// the turn ends there (no EOS): reward 1 if right, else 0. Reward 1 for the exact answer; with `shaped` (default), partial credit for stopping (EOS within the
// turn's budget), for answering with digits, for the right length and for each correct digit, so a
// randomly initialised model gets a learning signal from scratch — stopping included: without credit
// for it, EOS (rare in a random model) is squeezed out while digits are learned, and the policy
// collapses onto answers that never end.
import { decodeBytes, encodeBytes } from "../../../src/engine/tokenizer.ts";
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";

interface AdditionState {
  answer: string;
  response: string;
  /** The model ended its answer (EOS) within the budget. */
  stopped: boolean;
}

/**
 * Configuration: `digits` per operand (1–3, default 2), `shaped` reward (default true; full answers
 * only), `answer`: "full" (default: the sum, then EOS) or "last-digit" (its last digit, one token).
 */
export interface AdditionConfig {
  digits?: number;
  shaped?: boolean;
  answer?: "full" | "last-digit";
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

export const createAdditionTask: TaskFactory = (config) => {
  const digits = Number((config as AdditionConfig).digits ?? 2);
  const shaped = (config as AdditionConfig).shaped ?? true;
  const lastDigit = ((config as AdditionConfig).answer ?? "full") === "last-digit";
  if (!["full", "last-digit"].includes((config as AdditionConfig).answer ?? "full"))
    throw new RangeError(`addition: answer must be "full" or "last-digit" (got ${JSON.stringify((config as AdditionConfig).answer)})`);
  if (!Number.isInteger(digits) || digits < 1 || digits > 3) throw new RangeError(`addition: digits must be 1, 2 or 3 (got ${digits})`);
  const max = 10 ** digits;
  const task: Task<AdditionState> = {
    name: "addition",
    maxTurns: 1,
    maxTurnTokens: lastDigit ? 1 : digits + 3,
    reset(index, seed) {
      const rand = prng(episodeSeed(index, seed));
      const a = Math.floor(rand() * max);
      const b = Math.floor(rand() * max);
      const prompt = `${a}+${b}=`;
      return { prompt, promptIds: encodeBytes(prompt, true), state: { answer: String(lastDigit ? (a + b) % 10 : a + b), response: "", stopped: false } };
    },
    step(state, action) {
      // the action excludes EOS: shorter than the budget means the model stopped by itself
      // (a last-digit answer is complete at its one-token budget)
      const stopped = lastDigit || action.length < task.maxTurnTokens;
      return { state: { ...state, response: decodeBytes(action), stopped }, observation: new Int32Array(0), done: true };
    },
    reward(state) {
      return additionReward(state.answer, state.response, shaped && !lastDigit, state.stopped);
    },
    success(state) {
      return state.stopped && state.response.trim() === state.answer;
    },
  };
  return task as Task;
};

export default createAdditionTask;
