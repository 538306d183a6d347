// Writes the format warm-up of guess-number on a real-vocabulary model: transcripts of the built-in
// task (topologies/guess-number-qwen3.yaml's taskConfig) in which every guess is drawn uniformly from
// 1..max whatever the replies said, one {"prompt", "completion"} line per turn (the conversation so
// far, then the guess). `ooze sft` on it teaches the answer's form — one number in range — and
// nothing of the strategy: read as a policy it finds the number 37 % of the time on 1-7 in 3 turns,
// as random guessing does; reading the replies is left to RL (docs/experiments/guess-number-qwen3.md).
// Prompt indices start at 1,000,000, away from the ones training draws (0, 1, 2, …).
//   node --import tsx examples/guess-number-qwen3/make-format-data.ts [N] [FILE]
//   (N episodes, default 2,000; FILE default runs/guess-number-qwen3-format.jsonl)
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { loadTopology } from "../../src/topology/load.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { byteTaskTokenizer } from "../../actors/environment/task-tokenizer.ts";
import { createGuessNumberTask } from "../../actors/environment/tasks/guess-number.ts";
import { prng } from "../../actors/environment/task.ts";

const N = Number(process.argv[2] ?? 2000);
if (!Number.isInteger(N) || N < 1) throw new Error(`make-format-data: N must be a positive integer (got '${process.argv[2]}')`);
const out = process.argv[3] ?? "runs/guess-number-qwen3-format.jsonl";
const FIRST = 1_000_000;
const config = trainConfigOf(loadTopology(join(import.meta.dirname, "../../topologies/guess-number-qwen3.yaml"))).train.taskConfig;
const max = Number(config.max ?? 16);
// text only: the byte tokenizer writes and reads the same text that `ooze sft` encodes with the model's
const tok = byteTaskTokenizer();
const task = createGuessNumberTask(config, { tokenizer: tok });
const rand = prng(12345);
const lines: string[] = [];
for (let i = FIRST; i < FIRST + N; i++) {
  const ep = task.reset(i, 0);
  let conversation = ep.prompt;
  let state = ep.state;
  for (let turn = 0; turn < task.maxTurns; turn++) {
    const guess = String(1 + Math.floor(rand() * max));
    lines.push(JSON.stringify({ prompt: conversation, completion: guess }));
    const r = task.step(state, tok.encode(guess));
    if (r.done) break;
    state = r.state;
    conversation += guess + tok.decode(r.observation);
  }
}
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, lines.join("\n") + "\n");
console.log(`make-format-data: ${lines.length} turns of ${N} episodes → ${out}`);
