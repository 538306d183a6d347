// Built-in two-role task: a referential (Lewis signalling) game. The describer sees a secret, one of
// `secrets` names (default the 8 letters A–H), and writes a message of at most `messageTokens`
// tokens; the guesser sees only that message — the describer's sampled ids exactly, between its own
// prompt's text, never decoded and re-encoded — and names the secret. Both roles are rewarded 1 when
// the guess is right (the first `answerChars` characters of the guesser's turn, default 1: the
// secret's first letter), else 0; chance is 1/secrets. Nothing fixes what a message means: the two
// policies have to agree on a code by reinforcement alone. Each role is its own context (sample), so
// the guesser never sees the secret; the topology maps the roles to policies (`train.roles`).
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";
import { byteTaskTokenizer, encodePrompt } from "../task-tokenizer.ts";

/** The game's roles, in turn order. */
export const REFERENTIAL_ROLES = ["describer", "guesser"] as const;

interface GameState {
  secret: string;
  message: Int32Array | null;
  guess: string | null;
}

/** Configuration: the secrets' names (2–64), the message's and the guess's token budgets. */
export interface ReferentialConfig {
  secrets?: string[];
  messageTokens?: number;
  guessTokens?: number;
  /** Leading characters of the guess compared with the secret's (default: 1 when the secrets' first letters differ, else their length). */
  answerChars?: number;
}

const LETTERS = ["A", "B", "C", "D", "E", "F", "G", "H"];

export const createReferentialTask: TaskFactory = (config, context) => {
  const c = config as ReferentialConfig;
  const tok = context?.tokenizer ?? byteTaskTokenizer();
  const secrets = c.secrets ?? LETTERS;
  if (!Array.isArray(secrets) || secrets.length < 2 || secrets.length > 64 || secrets.some((s) => typeof s !== "string" || s.length === 0))
    throw new RangeError(`referential: secrets must be 2 to 64 non-empty names (got ${JSON.stringify(c.secrets)})`);
  if (new Set(secrets).size !== secrets.length) throw new RangeError("referential: secrets must be distinct");
  const messageTokens = Number(c.messageTokens ?? 2), guessTokens = Number(c.guessTokens ?? 2);
  for (const [k, v] of [["messageTokens", messageTokens], ["guessTokens", guessTokens]] as const)
    if (!Number.isInteger(v) || v < 1 || v > 64) throw new RangeError(`referential: ${k} must be an integer in 1–64 (got ${v})`);
  const firstLetters = new Set(secrets.map((s) => s[0]));
  const chars = Number(c.answerChars ?? (firstLetters.size === secrets.length ? 1 : Math.max(...secrets.map((s) => s.length))));
  const key = (s: string) => s.slice(0, chars);
  if (new Set(secrets.map(key)).size !== secrets.length) throw new RangeError(`referential: the secrets' first ${chars} characters must differ (answerChars)`);
  const before = tok.encode("message: "), after = tok.encode("\nsecret:");
  const task: Task<GameState> = {
    name: "referential",
    roles: REFERENTIAL_ROLES,
    maxTurns: 2,
    maxTurnTokens: Math.max(messageTokens, guessTokens) + 1,
    eosId: tok.eos,
    reset(index, seed) {
      const secret = secrets[Math.floor(prng(episodeSeed(index, seed))() * secrets.length)]!;
      const prompt = `secret: ${secret}\nmessage:`;
      return { prompt, promptIds: encodePrompt(tok, prompt), state: { secret, message: null, guess: null } };
    },
    step(state, action) {
      if (state.message === null) {
        // the describer's turn: its ids (at most messageTokens) go to the guesser as they are
        const message = action.slice(0, messageTokens);
        const ids = new Int32Array(before.length + message.length + after.length + (tok.bos === null ? 0 : 1));
        let at = 0;
        if (tok.bos !== null) ids[at++] = tok.bos;
        ids.set(before, at), ids.set(message, at + before.length), ids.set(after, at + before.length + message.length);
        const prompt = `message: ${tok.decode(message)}\nsecret:`;
        return { state: { ...state, message }, observation: new Int32Array(0), done: false, context: { role: "guesser", prompt, promptIds: ids } };
      }
      return { state: { ...state, guess: tok.decode(action.slice(0, guessTokens)).trim() }, observation: new Int32Array(0), done: true };
    },
    reward(state) {
      return state.guess !== null && key(state.guess) === key(state.secret) ? 1 : 0;
    },
    success(state) {
      return task.reward(state) === 1;
    },
  };
  return task;
};
