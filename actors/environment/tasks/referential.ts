// Built-in two-role task: a referential (Lewis signalling) game. The describer sees a secret, one of
// `secrets` (default the 8 letters A–H), and writes a message of at most `messageTokens` tokens
// (default 1); the guesser sees only that message — the describer's sampled ids exactly, never decoded
// and re-encoded — and answers with the secret's answer (`answers`, default the digits 0–7: A → 0,
// B → 1, …, so that the guesser cannot just copy a letter it saw). Both roles are rewarded 1 when the
// answer is right, else 0; chance is 1/8. Nothing fixes what a message means: the two policies have
// to agree on a code by reinforcement alone. Each role is its own context (sample), so the guesser
// never sees the secret; the topology maps the roles to policies (`train.roles`), and the guesser may
// answer each message several times (`contexts`), which gives it a baseline of its own per message.
// Prompts are bare by default (BOS + the secret; BOS + the message): on a small random model the
// words of a longer prompt drown the one token that matters (docs/policies.md).
import { episodeSeed, prng, type Task, type TaskFactory } from "../task.ts";
import { byteTaskTokenizer, type TaskTokenizer } from "../task-tokenizer.ts";

/** The game's roles, in turn order. */
export const REFERENTIAL_ROLES = ["describer", "guesser"] as const;

interface GameState {
  secret: number;
  message: Int32Array | null;
  answer: string | null;
}

/** Configuration of the game. */
export interface ReferentialConfig {
  /** The secrets' names, 2–64 (default A–H). */
  secrets?: string[];
  /** What the guesser must answer for each secret (default the digits 0, 1, …; at most 10 secrets then). */
  answers?: string[];
  /** Most tokens of a message (default 1). */
  messageTokens?: number;
  /** Prompts: bare (BOS + the secret / BOS + the message, the default) or worded ("secret: X\nmessage:" / "message: …\nsecret:"). */
  prompt?: "bare" | "worded";
}

const LETTERS = ["A", "B", "C", "D", "E", "F", "G", "H"];

/** BOS (when the tokenizer has one) followed by each part's ids. */
function withBos(tok: TaskTokenizer, ...parts: ArrayLike<number>[]): Int32Array {
  const n = parts.reduce((a, p) => a + p.length, tok.bos === null ? 0 : 1);
  const out = new Int32Array(n);
  let at = 0;
  if (tok.bos !== null) out[at++] = tok.bos;
  for (const p of parts) out.set(p, at), (at += p.length);
  return out;
}

export const createReferentialTask: TaskFactory = (config, context) => {
  const c = config as ReferentialConfig;
  const tok = context?.tokenizer ?? byteTaskTokenizer();
  const secrets = c.secrets ?? LETTERS;
  if (!Array.isArray(secrets) || secrets.length < 2 || secrets.length > 64 || secrets.some((s) => typeof s !== "string" || s.length === 0))
    throw new RangeError(`referential: secrets must be 2 to 64 non-empty names (got ${JSON.stringify(c.secrets)})`);
  if (new Set(secrets).size !== secrets.length) throw new RangeError("referential: secrets must be distinct");
  if (c.answers === undefined && secrets.length > 10) throw new RangeError(`referential: ${secrets.length} secrets need answers (the default digits cover 10)`);
  const answers = c.answers ?? secrets.map((_, i) => String(i));
  if (!Array.isArray(answers) || answers.length !== secrets.length || answers.some((a) => typeof a !== "string" || a.length === 0) || new Set(answers).size !== answers.length)
    throw new RangeError(`referential: answers must be ${secrets.length} distinct non-empty strings, one per secret (got ${JSON.stringify(c.answers)})`);
  const messageTokens = Number(c.messageTokens ?? 1);
  if (!Number.isInteger(messageTokens) || messageTokens < 1 || messageTokens > 64) throw new RangeError(`referential: messageTokens must be an integer in 1–64 (got ${c.messageTokens})`);
  const worded = (c.prompt ?? "bare") === "worded";
  if (c.prompt !== undefined && c.prompt !== "bare" && c.prompt !== "worded") throw new RangeError(`referential: prompt must be bare or worded (got ${JSON.stringify(c.prompt)})`);
  const answerTokens = Math.max(...answers.map((a) => tok.encode(a).length));
  const [before, after] = worded ? [tok.encode("message: "), tok.encode("\nsecret:")] : [new Int32Array(0), new Int32Array(0)];
  const task: Task<GameState> = {
    name: "referential",
    roles: REFERENTIAL_ROLES,
    maxTurns: 2,
    // one budget for both turns, exactly the longer of the message and the answer: no EOS to learn
    // (a message may end early with one), and no token beyond them that the reward never reads
    maxTurnTokens: Math.max(messageTokens, answerTokens),
    eosId: tok.eos,
    reset(index, seed) {
      const secret = Math.floor(prng(episodeSeed(index, seed))() * secrets.length);
      const prompt = worded ? `secret: ${secrets[secret]}\nmessage:` : secrets[secret]!;
      return { prompt, promptIds: withBos(tok, tok.encode(prompt)), state: { secret, message: null, answer: null } };
    },
    step(state, action) {
      if (state.message === null) {
        // the describer's turn: its ids (at most messageTokens) go to the guesser as they are
        const message = action.slice(0, messageTokens);
        const prompt = worded ? `message: ${tok.decode(message)}\nsecret:` : tok.decode(message);
        return { state: { ...state, message }, observation: new Int32Array(0), done: false, context: { role: "guesser", prompt, promptIds: withBos(tok, before, message, after) } };
      }
      return { state: { ...state, answer: tok.decode(action).trim() }, observation: new Int32Array(0), done: true };
    },
    reward(state) {
      const want = answers[state.secret]!;
      return state.answer !== null && state.answer.slice(0, want.length) === want ? 1 : 0;
    },
    success(state) {
      return task.reward(state) === 1;
    },
  };
  return task;
};
