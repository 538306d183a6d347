// The SDK referential game's task (examples/agents/referential-task.ts): its secrets come in rounds
// of the eight letters, and its reward matches each sample to a game by what was asked and said —
// the agent plays its games at once, so the gateway records them in the order they finished.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import createReferentialAgentTask, { referentialSecrets } from "../../examples/agents/referential-task.ts";
import type { Transcript } from "../../actors/environment/agent/task.ts";
import type { Sample } from "../../src/sample.ts";

const LETTERS = "ABCDEFGH";
/** A recorded sample of one exchange (only what the reward reads). */
const sample = (policy: string, asked: string, said: string) =>
  ({ policy, metadata: { transcript: [{ role: "user", content: asked }, { role: "assistant", content: said }] } }) as unknown as Sample;
const transcript = (samples: Sample[], games: unknown[]): Transcript => ({ samples, text: [], stdout: `${JSON.stringify({ games })}\n`, stderr: "", exitCode: 0 });

describe("the SDK referential game's task", () => {
  it("draws each secret once a round when games is a multiple of eight", () => {
    const s = referentialSecrets(3, 7, 24);
    for (let r = 0; r < 3; r++) expect([...s.slice(8 * r, 8 * r + 8)].sort()).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(referentialSecrets(3, 7, 24)).toEqual(s);
    expect(referentialSecrets(3, 7, 5)).toHaveLength(5);
  });

  it("rewards every sample as its own game's, in any order the requests finished", () => {
    const task = createReferentialAgentTask({ games: 16 });
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 1000 }),
        fc.array(fc.constantFrom("x", "y", " ", "\uFFFD"), { minLength: 16, maxLength: 16 }),
        fc.array(fc.array(fc.constantFrom("0", "1", " 2", "3"), { minLength: 3, maxLength: 3 }), { minLength: 16, maxLength: 16 }),
        // a sort key per sample (a game's describer sample and its three guesses): the order recorded
        fc.array(fc.integer(), { minLength: 16 * 4, maxLength: 16 * 4 }),
        (index, messages, answers, keys) => {
          const prompt = task.prompt(index, 0);
          const secrets = prompt.data as string[];
          const games = messages.map((message, j) => ({ message, answers: answers[j]! }));
          // the expected (sample, reward) pairs, game by game
          const expected: [Sample, number, boolean | null][] = games.flatMap((g, j) => {
            // a message that reads as the replacement character is no text: its game is lost
            const right = g.answers.map((a) => (g.message !== "\uFFFD" && a.trim() === secrets[j] ? 1 : 0));
            return [
              [sample("describer", LETTERS[Number(secrets[j])]!, g.message), right.reduce((a: number, x) => a + x, 0) / right.length, null] as [Sample, number, null],
              ...g.answers.map((a, k) => [sample("guesser", g.message, a), right[k]!, right[k] === 1] as [Sample, number, boolean]),
            ];
          });
          // recorded in some other order
          const order = expected.map((_, i) => i).sort((a, b) => keys[a]! - keys[b]! || a - b);
          const got = task.reward!({ workdir: "", prompt, transcript: transcript(order.map((i) => expected[i]![0]), games) }) as { samples: { reward: number; success: boolean | null }[] };
          // samples alike in what was asked and said may trade rewards: compare each alike class's rewards
          const classes = new Map<string, { want: string[]; got: string[] }>();
          order.forEach((i, k) => {
            const [s, reward, success] = expected[i]!;
            const key = JSON.stringify([s.policy, s.metadata.transcript]);
            const c = classes.get(key) ?? { want: [], got: [] };
            c.want.push(JSON.stringify([reward, success]));
            c.got.push(JSON.stringify([got.samples[k]!.reward, got.samples[k]!.success]));
            classes.set(key, c);
          });
          for (const c of classes.values()) expect(c.got.sort()).toEqual(c.want.sort());
        },
      ),
      { numRuns: 50 },
    );
  });

  it("names the sample no game made, and the answer no sample made", () => {
    const task = createReferentialAgentTask({ games: 1 });
    const prompt = task.prompt(0, 0);
    const secret = LETTERS[Number((prompt.data as string[])[0])]!;
    const games = [{ message: "q", answers: ["1"] }];
    expect(() => task.reward!({ workdir: "", prompt, transcript: transcript([sample("describer", secret, "q"), sample("guesser", "q", "2")], games) })).toThrow(
      /sample 1 \(guesser: .*"said":"2".*\) is no request of the games/,
    );
    expect(() => task.reward!({ workdir: "", prompt, transcript: transcript([sample("describer", secret, "q")], games) })).toThrow(/1 messages or answers that no sample made/);
  });
});
