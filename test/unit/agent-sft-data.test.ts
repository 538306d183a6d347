// The agent examples' warm-up data (examples/agents/make-sft-data.ts, run as a real child process):
// every copy drill is a window of its transcript exactly as `ooze sft` trains it — the prompt a
// run of whole lines of the rendering just before an assistant turn, the completion that turn as
// the model samples it — so drills follow the chat template instead of restating its markers.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { chatRenderer } from "../../actors/trainer/sft.ts";
import { BuiltinChatTemplate, byteChatTokenizer } from "../../src/gateway/index.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-sft-data-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const lines = (f: string) =>
  readFileSync(join(dir, f), "utf8")
    .split("\n")
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as Record<string, unknown>);

describe("agent examples: warm-up data", () => {
  it("cuts each drill from its transcript's rendering: whole lines before an assistant turn, then the turn as sampled", () => {
    const r = spawnSync(process.execPath, ["--import", "tsx", "examples/agents/make-sft-data.ts", "8", dir], { encoding: "utf8" });
    expect(r.status, r.stderr).toBe(0);
    const tok = byteChatTokenizer();
    const render = chatRenderer(tok, new BuiltinChatTemplate(tok));
    // each transcript as trained: its text, and where its assistant turns start and end
    const trained = [...lines("calculator.jsonl"), ...lines("coding.jsonl")].map((t) => {
      let text = "";
      const turns: { start: number; end: number }[] = [];
      for (const p of render(t.messages as object[], t.tools as object[], "test")) {
        const piece = tok.decode(p.ids, false);
        if (p.train) turns.push({ start: text.length, end: text.length + piece.length - "<eos>".length });
        text += piece;
      }
      return { text, turns };
    });
    const drills = lines("drills.jsonl");
    // every fourth prompt is drilled: two calculator turns and one coding turn each
    expect(drills.length).toBe(2 * 2 + 2);
    for (const d of drills) {
      const [prompt, completion] = [String(d.prompt), String(d.completion)];
      const found = trained.some(({ text, turns }) =>
        turns.some((t) => text.slice(t.start, t.end) === completion && text.slice(0, t.start).endsWith(prompt) && (t.start === prompt.length || text[t.start - prompt.length - 1] === "\n")),
      );
      expect(found, JSON.stringify(d)).toBe(true);
    }
  });
});
