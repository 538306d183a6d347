// A user's own environment for `ooze fuzz` to test: a timed addition quiz ("12+34=", reward 1 for
// the exact sum) whose grading service closes each prompt's round `roundMs` after it opened. With
// taskConfig `bug: true` it carries a bug a real user could write: the round opens at the prompt's
// first reset in a map the task object shares between episodes, is measured with the wall clock,
// and is never reopened — so an episode that is slow (a stalled engine, a retry after backoff) or
// that runs again after a failure is answered after the round closed and throws. Without faults every episode answers in
// milliseconds and the bug never shows; `ooze fuzz` finds it (see README.md beside this file).
// Without the bug the round is counted in the model's tokens (maxTurnTokens), never on the clock.
import { decodeBytes, encodeBytes } from "../../src/engine/tokenizer.ts";
import { episodeSeed, prng, type Task, type TaskFactory } from "../../actors/environment/task.ts";

interface QuizState {
  index: number;
  answer: string;
  response: string;
}

/** taskConfig: `bug` (default false; OOZE_EXAMPLE_BUG=1 turns it on too), `roundMs` (the round's length on the clock with the bug, default 2000). */
export interface QuizConfig {
  bug?: boolean;
  roundMs?: number;
}

const createQuizTask: TaskFactory = (config) => {
  const c = config as QuizConfig;
  const bug = c.bug === true || process.env.OOZE_EXAMPLE_BUG === "1";
  const roundMs = Number(c.roundMs ?? 2000);
  if (!(roundMs > 0)) throw new RangeError(`quiz: roundMs must be a positive number of ms (got ${JSON.stringify(c.roundMs)})`);
  /** With the bug: when each prompt's round opened (ms since the epoch), shared by every episode of the job. */
  const roundOpened = new Map<number, number>();
  const task: Task<QuizState> = {
    name: "timed-quiz",
    maxTurns: 1,
    maxTurnTokens: 3,
    reset(index, seed) {
      const rand = prng(episodeSeed(index, seed));
      const a = Math.floor(rand() * 10);
      const b = Math.floor(rand() * 10);
      const prompt = `${a}+${b}=`;
      if (bug && !roundOpened.has(index)) roundOpened.set(index, Date.now()); // the bug: wall clock, once per prompt
      return { prompt, promptIds: encodeBytes(prompt, true), state: { index, answer: String(a + b), response: "" } };
    },
    step(state, action) {
      if (bug) {
        const late = Date.now() - roundOpened.get(state.index)!;
        if (late > roundMs) throw new Error(`quiz: round of prompt ${state.index} closed ${late - roundMs} ms ago`);
      }
      // Without the bug the round's limit is the turn's token budget: the engine stops the model there.
      return { state: { ...state, response: decodeBytes(action) }, observation: new Int32Array(0), done: true };
    },
    reward(state) {
      return state.response.trim() === state.answer ? 1 : 0;
    },
  };
  return task as Task;
};

export default createQuizTask;
