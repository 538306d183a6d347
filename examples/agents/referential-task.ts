// Agent task of the referential game played by two agents on the openai SDK
// (examples/agents/referential-openai.mjs, topologies/agent-referential-openai.yaml): prompt i is a
// list of `games` secret letters A–H (taskConfig.games, default 8; a multiple of 8 plays each
// letter games/8 times, each round of eight in an order drawn from the prompt's seed), one per line
// on the agent's stdin; every episode of prompt i plays the same list. The agent prints {games: [{message, answers}]}, the guesser's
// answers to the describer's message of each game. Each guess is rewarded on its own — 1 when it is
// its game's secret's digit (A → 0 … H → 7), else 0 — and the describer's message gets the mean of
// its guesses, as in the built-in game (actors/environment/tasks/referential.ts); a message that is
// not text (it reads as U+FFFD, the replacement character) loses the game. Rewards are per
// sample: the gateway records each game's describer request and each of the guesser's `n` choices
// as samples of their own, matched to their games by what was asked and said. The buffer groups a policy's samples of one prompt group by
// their prompt tokens: a secret's messages across the group's episodes, a message's guesses.
import type { AgentTask, SampleReward } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";

const LETTERS = ["A", "B", "C", "D", "E", "F", "G", "H"];
/**
 * What a token that is not text on its own reads as: the replacement character. A byte-level
 * model's tokens 128–255 are each a piece of a UTF-8 character, so as one-token messages all 128 of
 * them read alike, and the describer's half of its choices that the guesser cannot tell apart was
 * a sink the game stalled in (docs/experiments/referential-game-sdk.md).
 */
const UNREADABLE = "\uFFFD";

/** The secrets of prompt `index` (each 0–7): when games is a multiple of 8, that many rounds of the eight, each round in an order of its own; else `games` independent draws. */
export function referentialSecrets(index: number, seed: number, games: number): number[] {
  const rand = prng(episodeSeed(index, seed));
  if (games % LETTERS.length !== 0) return Array.from({ length: games }, () => Math.floor(rand() * LETTERS.length));
  const secrets: number[] = [];
  for (let round = 0; round < games / LETTERS.length; round++) {
    const order = LETTERS.map((_, k) => k);
    for (let k = order.length - 1; k > 0; k--) {
      const j = Math.floor(rand() * (k + 1));
      [order[k], order[j]] = [order[j]!, order[k]!];
    }
    secrets.push(...order);
  }
  return secrets;
}

/** A sample's request's user message and the reply it got (its recorded transcript's first and last entries), exactly as written. */
function exchange(metadata: Record<string, unknown>): { asked: string; said: string } | null {
  const t = metadata.transcript as { role: string; content: string | null }[] | undefined;
  const first = t?.[0], last = t?.at(-1);
  if (t?.length !== 2 || first?.role !== "user" || last?.role !== "assistant") return null;
  return { asked: first.content ?? "", said: last.content ?? "" };
}

export default function createReferentialAgentTask(config: Record<string, unknown> = {}): AgentTask {
  const games = config.games ?? 8;
  if (!Number.isInteger(games) || (games as number) < 1) throw new Error(`taskConfig.games: expected a whole number ≥ 1, got ${JSON.stringify(games)}`);
  return {
    name: "referential-agents",
    prompt(index, seed) {
      const secrets = referentialSecrets(index, seed, games as number);
      return { task: secrets.map((s) => `${LETTERS[s]}\n`).join(""), data: secrets.map(String) };
    },
    reward({ prompt, transcript }) {
      const wanted = prompt.data as string[];
      const out = JSON.parse(transcript.stdout.trim().split("\n").at(-1) ?? "") as { games?: { message?: unknown; answers?: unknown }[] };
      if (!Array.isArray(out.games) || out.games.length !== wanted.length || !out.games.every((g) => typeof g.message === "string" && Array.isArray(g.answers) && g.answers.every((a) => typeof a === "string")))
        throw new Error(`expected {games: [{message, answers}]} with ${wanted.length} games; the agent printed: ${transcript.stdout.slice(-200)}`);
      // The agent plays its games at once, so the gateway records their requests in the order they
      // finished: each sample is matched to a game by what was asked and said. Samples alike in both
      // are alike in their tokens too (one token each), so which of them gets which game's reward
      // does not matter.
      const rewards = new Map<string, number[]>();
      const owe = (policy: string, asked: string, said: string, reward: number) => {
        const key = JSON.stringify([policy, asked, said]);
        rewards.get(key)?.push(reward) ?? rewards.set(key, [reward]);
      };
      (out.games as { message: string; answers: string[] }[]).forEach(({ message, answers }, j) => {
        // a message that is not text loses the game: every guess of it scores 0
        const readable = !message.includes(UNREADABLE);
        const right = answers.map((a) => (readable && a.trim() === wanted[j] ? 1 : 0));
        // the describer's message has a success rate, not one outcome: left out of success_rate
        owe("describer", LETTERS[Number(wanted[j])]!, message, answers.length === 0 ? 0 : right.reduce((a: number, x) => a + x, 0) / right.length);
        answers.forEach((a, k) => owe("guesser", message, a, right[k]!));
      });
      const samples: SampleReward[] = transcript.samples.map((s, i) => {
        const x = exchange(s.metadata);
        const reward = x ? rewards.get(JSON.stringify([s.policy, x.asked, x.said]))?.shift() : undefined;
        if (reward === undefined)
          throw new Error(`sample ${i} (${s.policy}: ${JSON.stringify(x)}) is no request of the games the agent printed (a describer's secret and message, or a guesser's message and answer)`);
        return s.policy === "describer" ? { reward, success: null } : { reward, success: reward === 1 };
      });
      const unmatched = [...rewards.values()].reduce((a, r) => a + r.length, 0);
      if (unmatched > 0) throw new Error(`the agent printed ${unmatched} messages or answers that no sample made`);
      return { samples };
    },
  };
}
