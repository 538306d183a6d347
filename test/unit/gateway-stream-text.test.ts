// The gateway's incremental detokenisation (src/gateway/stream-text.ts), with the byte tokenizer of
// the embedded models and a byte-level HF BPE (test/fixtures/bpe-tokenizer.ts): fed every prefix of
// random sampled ids, under random reply plans (no calls, Hermes or Llama JSON calls, reasoning
// with the think block opened by the prompt or not, a prefill), the deltas never end inside a UTF-8
// character, never show a possible start of a stop string or of a tool call, and, with the final
// reply, concatenate on each channel to the non-streamed reasoning and content.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { EOS_ID, encodeBytes } from "../../src/engine/tokenizer.ts";
import { parseReply, type ReplyParse } from "../../src/gateway/reply-format.ts";
import { TextStreamer } from "../../src/gateway/stream-text.ts";
import { byteChatTokenizer, hfChatTokenizer, type ChatTokenizer } from "../../src/gateway/tokenizer.ts";
import { BPE_EOS, bpeTokenizerJson } from "../fixtures/bpe-tokenizer.ts";

const runs = Number(process.env.OOZE_PROPERTY_RUNS ?? 200);
const bytes = byteChatTokenizer();
const bpe = hfChatTokenizer(bpeTokenizerJson(), { eos_token: "</s>", bos_token: "<s>" });

const plain: ReplyParse = { toolCalls: null, reasoning: false, thinkingOpen: false, maxCalls: Infinity };
const hermes: ReplyParse = { ...plain, toolCalls: "hermes" };

/** Streams ids one token at a time; returns each channel's deltas (the final piece last) and the final reply. */
function run(tok: ChatTokenizer, ids: number[], stop: string[], parse: ReplyParse, prefill = "") {
  const s = new TextStreamer(tok, stop, { parse, prefill });
  const content: string[] = [];
  const reasoning: string[] = [];
  for (let n = 1; n <= ids.length; n++) {
    const d = s.push(Int32Array.from(ids.slice(0, n)));
    if (d.content !== "") content.push(d.content);
    if (d.reasoning !== "") reasoning.push(d.reasoning);
  }
  let text = tok.decode(ids, true);
  for (const w of stop) {
    const k = text.indexOf(w);
    if (k >= 0) text = text.slice(0, k);
  }
  const final = parseReply(prefill + text, parse);
  const last = s.finish(final);
  return { content, reasoning, last, final };
}

/** Mostly ASCII with multi-byte characters, stop words, think tags and tool calls of both syntaxes mixed in, as byte ids. */
const pieces = fc.array(
  fc.oneof(
    fc.constantFrom("a", "b", " ", "\n", "é", "✓", "😀", "STOP", "<think>", "</think>", "<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>"),
    fc.constantFrom("{", ";", "<|python_tag|>", '{"name": "g", "parameters": {"x": 1}}', "ab", "er"),
    fc.integer({ min: 0, max: 255 }).map((b) => [b]),
  ),
  { maxLength: 40 },
);
const toIds = (ps: (string | number[])[]) => ps.flatMap((p) => (typeof p === "string" ? Array.from(encodeBytes(p)) : p));
const parses: fc.Arbitrary<ReplyParse> = fc.record({
  toolCalls: fc.constantFrom(null, "hermes" as const, "llama3_json" as const),
  reasoning: fc.boolean(),
  thinkingOpen: fc.boolean(),
  maxCalls: fc.constantFrom(1, Infinity),
});
const prefills = fc.constantFrom("", '<tool_call>\n{"name":', "<think>\n\n</think>\n\n", '{"name": "g", "parameters":');

describe("gateway: incremental detokenisation", () => {
  for (const [name, tok, eos] of [
    ["byte tokenizer", bytes, EOS_ID],
    ["byte-level BPE", bpe, BPE_EOS],
  ] as const) {
    it(`${name}: deltas at safe points concatenate to the non-streamed reasoning and content`, () => {
      fc.assert(
        fc.property(pieces, fc.boolean(), parses, prefills, fc.boolean(), (ps, withStop, parse, prefill, end) => {
          const ids = [...toIds(ps), ...(end ? [eos] : [])];
          const stop = withStop ? ["STOP"] : [];
          const { content, reasoning, last, final } = run(tok, ids, stop, parse, prefill);
          expect([...content, last.content].join("")).toBe(final.content);
          expect([...reasoning, last.reasoning].join("")).toBe(final.reasoning ?? "");
          // What was sent before the end holds no stop string and no tool-call block.
          const streamed = content.join("");
          if (withStop) expect(streamed + reasoning.join("")).not.toContain("STOP");
          if (parse.toolCalls === "hermes") expect(streamed).not.toContain("<tool_call>");
          if (parse.toolCalls === "llama3_json") expect(streamed.trimStart().startsWith("{")).toBe(false);
          if (parse.reasoning) expect(reasoning.join("")).not.toContain("</think>");
        }),
        { numRuns: runs },
      );
    });
  }

  it("holds a split multi-byte character and a possible stop string until they resolve", () => {
    const s = new TextStreamer(bytes, ["STOP"], { parse: plain, prefill: "" });
    const ids = Array.from(encodeBytes("hé ST"));
    const seen = ids.map((_, i) => s.push(Int32Array.from(ids.slice(0, i + 1))).content);
    // h, then nothing for the lead byte of é, then é, then nothing for " " (trailing whitespace waits
    // for the next token) and for "S", "T".
    expect(seen).toEqual(["h", "", "é", "", "", ""]);
    expect(s.push(Int32Array.from([...ids, ...encodeBytes("ay")])).content).toBe(" STay");
    expect(s.text).toBe("hé STay");
  });

  it("with tools, stops at a tool call and holds trailing whitespace", () => {
    const s = new TextStreamer(bytes, [], { parse: hermes, prefill: "" });
    const ids = Array.from(encodeBytes("Let me check. <tool"));
    expect(s.push(Int32Array.from(ids)).content).toBe("Let me check.");
    expect(s.push(Int32Array.from([...ids, ...encodeBytes("_call>{")])).content).toBe("");
    const text = 'Let me check. <tool_call>{"name": "f", "arguments": {}}</tool_call>';
    expect(s.finish(parseReply(text, hermes)).content).toBe("");
    expect(s.text).toBe("Let me check.");
  });

  it("streams a think block as reasoning, holds a possible </think>, then the answer as content", () => {
    const parse: ReplyParse = { ...plain, reasoning: true };
    const s = new TextStreamer(bytes, [], { parse, prefill: "" });
    const push = (t: string) => s.push(Int32Array.from(encodeBytes(t)));
    expect(push("<thi")).toEqual({ reasoning: "", content: "" }); // could still open a think block
    expect(push("<think>\nLet me see")).toEqual({ reasoning: "Let me see", content: "" });
    expect(push("<think>\nLet me see.\n</thi")).toEqual({ reasoning: ".", content: "" });
    expect(push("<think>\nLet me see.\n</think>\n\nIt is 4")).toEqual({ reasoning: "", content: "It is 4" });
    const final = parseReply("<think>\nLet me see.\n</think>\n\nIt is 4.", parse);
    expect(final).toEqual({ reasoning: "Let me see.", content: "It is 4.", toolCalls: [] });
    expect(s.finish(final)).toEqual({ reasoning: "", content: "." });
    // The prompt opened the block: the reply starts inside it.
    const open = new TextStreamer(bytes, [], { parse: { ...parse, thinkingOpen: true }, prefill: "" });
    expect(open.push(Int32Array.from(encodeBytes("Hmm, two and two")))).toEqual({ reasoning: "Hmm, two and two", content: "" });
  });

  it("holds a Llama JSON reply whole, and streams one that cannot be a call", () => {
    const parse: ReplyParse = { ...plain, toolCalls: "llama3_json" };
    const call = new TextStreamer(bytes, [], { parse, prefill: "" });
    expect(call.push(Int32Array.from(encodeBytes('{"name": "g", "param')))).toEqual({ reasoning: "", content: "" });
    const text = new TextStreamer(bytes, [], { parse, prefill: "" });
    expect(text.push(Int32Array.from(encodeBytes("The answer is {x}")))).toEqual({ reasoning: "", content: "The answer is {x}" });
  });
});
