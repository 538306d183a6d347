// Agent task of the referential game played by two agents on the openai SDK
// (examples/agents/referential-openai.mjs, topologies/agent-referential-openai.yaml): prompt i is a
// secret letter A–H (the agent gets it on stdin); the agent prints {message, answers}, the guesser's
// answers to the describer's message. Each guess is rewarded on its own — 1 when it is the secret's
// digit (A → 0 … H → 7), else 0 — and the describer's message gets the mean of its guesses, as in the
// built-in game (actors/environment/tasks/referential.ts). Rewards are per sample: the gateway records
// the describer's request and each of the guesser's `n` choices as samples of their own, in order.
import type { AgentTask, SampleReward } from "../../actors/environment/agent/task.ts";
import { episodeSeed, prng } from "../../actors/environment/task.ts";

const LETTERS = ["A", "B", "C", "D", "E", "F", "G", "H"];

/** The secret of prompt `index` (0–7), drawn as the built-in game draws it. */
export function referentialSecret(index: number, seed: number): number {
  return Math.floor(prng(episodeSeed(index, seed))() * LETTERS.length);
}

/** The reply a sample's request got (its recorded transcript's last assistant message). */
function reply(metadata: Record<string, unknown>): string {
  const t = metadata.transcript as { role: string; content: string }[] | undefined;
  const last = t?.at(-1);
  return last?.role === "assistant" ? last.content.trim() : "";
}

export default function createReferentialAgentTask(): AgentTask {
  return {
    name: "referential-agents",
    prompt(index, seed) {
      const secret = referentialSecret(index, seed);
      return { task: LETTERS[secret]!, data: String(secret) };
    },
    reward({ prompt, transcript }) {
      const out = JSON.parse(transcript.stdout.trim().split("\n").at(-1) ?? "") as { message?: unknown; answers?: unknown };
      if (!Array.isArray(out.answers)) throw new Error(`the agent printed no answers: ${transcript.stdout.slice(-200)}`);
      const answers = out.answers as unknown[];
      const guesses = transcript.samples.filter((s) => s.policy === "guesser");
      const described = transcript.samples.filter((s) => s.policy === "describer");
      if (described.length !== 1 || guesses.length !== answers.length)
        throw new Error(`expected one describer sample and one guesser sample per answer; got ${described.length} and ${guesses.length} for ${answers.length} answers`);
      // the guesser's samples are its choices in order; each must be the answer printed in its place
      const right = guesses.map((s, k) => {
        if (reply(s.metadata) !== answers[k]) throw new Error(`answer ${k} (${JSON.stringify(answers[k])}) is not guesser sample ${k}'s reply (${JSON.stringify(reply(s.metadata))})`);
        return answers[k] === prompt.data ? 1 : 0;
      });
      const mean = right.reduce((a: number, x) => a + x, 0) / right.length;
      let k = 0;
      const samples: SampleReward[] = transcript.samples.map((s) =>
        // the describer's message has a success rate, not one outcome: left out of success_rate
        s.policy === "describer" ? { reward: mean, success: null } : { reward: right[k]!, success: right[k++] === 1 },
      );
      return { samples };
    },
  };
}
