// The gateway's incremental detokenisation (src/gateway/stream-text.ts), with the byte tokenizer of
// the embedded models and a byte-level HF BPE (test/fixtures/bpe-tokenizer.ts): fed every prefix of
// random sampled ids, the deltas never end inside a UTF-8 character, never show a possible start of
// a stop string or of a tool call, and, with the final content, concatenate to the non-streamed text.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { EOS_ID, encodeBytes } from "../../src/engine/tokenizer.ts";
import { parseToolCalls } from "../../src/gateway/template.ts";
import { TextStreamer } from "../../src/gateway/stream-text.ts";
import { byteChatTokenizer, hfChatTokenizer, type ChatTokenizer } from "../../src/gateway/tokenizer.ts";
import { BPE_EOS, bpeTokenizerJson } from "../fixtures/bpe-tokenizer.ts";

const runs = Number(process.env.OOZE_PROPERTY_RUNS ?? 200);
const bytes = byteChatTokenizer();
const bpe = hfChatTokenizer(bpeTokenizerJson(), { eos_token: "</s>", bos_token: "<s>" });

/** Streams ids one token at a time; returns the deltas and the final piece. */
function run(tok: ChatTokenizer, ids: number[], stop: string[], tools: boolean): { deltas: string[]; content: string } {
  const s = new TextStreamer(tok, stop, tools);
  const deltas: string[] = [];
  for (let n = 1; n <= ids.length; n++) {
    const d = s.push(Int32Array.from(ids.slice(0, n)));
    if (d !== "") deltas.push(d);
  }
  let text = tok.decode(ids, true);
  for (const w of stop) {
    const k = text.indexOf(w);
    if (k >= 0) text = text.slice(0, k);
  }
  const content = tools ? parseToolCalls(text).content : text;
  deltas.push(s.finish(content));
  return { deltas, content };
}

/** Mostly ASCII with multi-byte characters, stop words and tool-call blocks mixed in, as byte ids. */
const pieces = fc.array(
  fc.oneof(
    fc.constantFrom("a", "b", "c", " ", "\n", "é", "✓", "😀", "STOP", "<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>", "ab", "er"),
    fc.integer({ min: 0, max: 255 }).map((b) => [b]),
  ),
  { maxLength: 40 },
);
const toIds = (ps: (string | number[])[]) => ps.flatMap((p) => (typeof p === "string" ? Array.from(encodeBytes(p)) : p));

describe("gateway: incremental detokenisation", () => {
  for (const [name, tok, eos] of [
    ["byte tokenizer", bytes, EOS_ID],
    ["byte-level BPE", bpe, BPE_EOS],
  ] as const) {
    it(`${name}: deltas at safe points concatenate to the non-streamed content`, () => {
      fc.assert(
        fc.property(pieces, fc.boolean(), fc.boolean(), fc.boolean(), (ps, withStop, tools, end) => {
          const ids = [...toIds(ps), ...(end ? [eos] : [])];
          const stop = withStop ? ["STOP"] : [];
          const { deltas, content } = run(tok, ids, stop, tools);
          expect(deltas.join("")).toBe(content);
          // What was sent before the end holds no stop string and no tool-call block.
          const streamed = deltas.slice(0, -1).join("");
          if (withStop) expect(streamed).not.toContain("STOP");
          if (tools) expect(streamed).not.toContain("<tool_call>");
        }),
        { numRuns: runs },
      );
    });
  }

  it("holds a split multi-byte character and a possible stop string until they resolve", () => {
    const s = new TextStreamer(bytes, ["STOP"], false);
    const ids = Array.from(encodeBytes("hé ST"));
    const seen = ids.map((_, i) => s.push(Int32Array.from(ids.slice(0, i + 1))));
    // h, then nothing for the lead byte of é, then é, then nothing for " " (trailing whitespace waits
    // for the next token) and for "S", "T".
    expect(seen).toEqual(["h", "", "é", "", "", ""]);
    expect(s.push(Int32Array.from([...ids, ...encodeBytes("ay")]))).toBe(" STay");
    expect(s.text).toBe("hé STay");
  });

  it("with tools, stops at a tool call and holds trailing whitespace", () => {
    const s = new TextStreamer(bytes, [], true);
    const ids = Array.from(encodeBytes("Let me check. <tool"));
    expect(s.push(Int32Array.from(ids))).toBe("Let me check.");
    expect(s.push(Int32Array.from([...ids, ...encodeBytes("_call>{")]))).toBe("");
    const text = 'Let me check. <tool_call>{"name": "f", "arguments": {}}</tool_call>';
    expect(s.finish(parseToolCalls(text).content)).toBe("");
    expect(s.text).toBe("Let me check.");
  });
});
