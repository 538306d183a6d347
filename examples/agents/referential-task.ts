// Agent task of the referential game played by two agents on the openai SDK
// (examples/agents/referential-openai.mjs, topologies/agent-referential-openai.yaml): prompt i is a
// list of `games` secret letters A–H (taskConfig.games, default 8: then each of the eight letters
// once, in an order drawn from the prompt's seed), one per line on the agent's stdin; every episode
// of prompt i plays the same list. The agent prints {games: [{message, answers}]}, the guesser's
// answers to the describer's message of each game. Each guess is rewarded on its own — 1 when it is
// its game's secret's digit (A → 0 … H → 7), else 0 — and the describer's message gets the mean of
// its guesses, as in the built-in game (actors/environment/tasks/referential.ts). Rewards are per
// sample: the gateway records each game's describer request and each of the guesser's `n` choices
// as samples of their own, in order. The buffer groups a policy's samples of one prompt group by
// their prompt tokens: a secret's messages across the group's episodes, a message's guesses.
import type { AgentTask, SampleReward } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";

const LETTERS = ["A", "B", "C", "D", "E", "F", "G", "H"];

/** The secrets of prompt `index` (each 0–7): a permutation of the eight when games = 8, else `games` independent draws. */
export function referentialSecrets(index: number, seed: number, games: number): number[] {
  const rand = prng(episodeSeed(index, seed));
  if (games !== LETTERS.length) return Array.from({ length: games }, () => Math.floor(rand() * LETTERS.length));
  const order = LETTERS.map((_, k) => k);
  for (let k = order.length - 1; k > 0; k--) {
    const j = Math.floor(rand() * (k + 1));
    [order[k], order[j]] = [order[j]!, order[k]!];
  }
  return order;
}

/** The reply a sample's request got (its recorded transcript's last assistant message). */
function reply(metadata: Record<string, unknown>): string {
  const t = metadata.transcript as { role: string; content: string }[] | undefined;
  const last = t?.at(-1);
  return last?.role === "assistant" ? last.content.trim() : "";
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
      if (!Array.isArray(out.games) || out.games.length !== wanted.length || !out.games.every((g) => Array.isArray(g.answers)))
        throw new Error(`expected {games: [{message, answers}]} with ${wanted.length} games; the agent printed: ${transcript.stdout.slice(-200)}`);
      // the samples are each game's describer sample and then its guesser samples, in order
      const samples: SampleReward[] = [];
      let at = 0;
      out.games.forEach((g, j) => {
        const answers = g.answers as unknown[];
        const described = transcript.samples[at];
        const guesses = transcript.samples.slice(at + 1, at + 1 + answers.length);
        if (described?.policy !== "describer" || guesses.length !== answers.length || guesses.some((s) => s.policy !== "guesser"))
          throw new Error(`game ${j}: expected a describer sample and then one guesser sample per answer (${answers.length}) at sample ${at}`);
        // each guesser sample must be the answer printed in its place
        const right = guesses.map((s, k) => {
          if (reply(s.metadata) !== answers[k]) throw new Error(`game ${j}: answer ${k} (${JSON.stringify(answers[k])}) is not guesser sample ${k}'s reply (${JSON.stringify(reply(s.metadata))})`);
          return answers[k] === wanted[j] ? 1 : 0;
        });
        // the describer's message has a success rate, not one outcome: left out of success_rate
        samples.push({ reward: right.reduce((a: number, x) => a + x, 0) / right.length, success: null });
        for (const r of right) samples.push({ reward: r, success: r === 1 });
        at += 1 + answers.length;
      });
      if (at !== transcript.samples.length) throw new Error(`the episode has ${transcript.samples.length} samples; its ${wanted.length} games account for ${at}`);
      return { samples };
    },
  };
}
