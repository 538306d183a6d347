// Property: token-in/token-out under the chat API, with trajectory merging and splitting, for a
// tokenizer whose decode → encode is not the identity (a byte-level BPE built here with
// @huggingface/tokenizers: sampled [a][b][c] decodes to "abc", which encodes to one token) and an
// HF-style ChatML template. fast-check generates agent schedules over several conversations
// (continue, compact, edit the last answer, start a sub-agent; answers with tool calls echoed back
// with tool results) against the gateway over a real socket; the engine is the recording fake
// SGLang server answering random ids. Invariants: each
// segment's trained tokens are exactly what the engine sampled for its requests (each sampled turn
// trained once), loss masks are 1 exactly there, each request sent its segment's whole history,
// extending requests stay in one segment and rewrites open a new one.
import fc from "fast-check";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { Gateway, hfChatTokenizer } from "../../src/gateway/index.ts";
import { BPE_EOS as EOS, bpeTokenizerJson, CHATML } from "../fixtures/bpe-tokenizer.ts";
import { sampleProblem } from "../../src/sample.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 12);


let fake: HostileSglang;
let fleet: Fleet;
let gw: Gateway;
const tok = hfChatTokenizer(bpeTokenizerJson(), { bos_token: "<s>", eos_token: "</s>" });

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
  gw = await Gateway.start({ fleet, tokenizer: tok, chatTemplate: CHATML, contextLength: 1 << 16 });
});

afterAll(async () => {
  await gw?.close();
  await fleet?.close();
  await fake?.close();
});

/** An agent step: on conversation `c` (mod the number open). */
type Op = { kind: "new" } | { kind: "continue" | "tool" | "compact" | "edit"; c: number };
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.constant<Op>({ kind: "new" }),
  fc.record({ kind: fc.constantFrom("continue" as const, "tool" as const, "continue" as const, "compact" as const, "edit" as const), c: fc.nat(7) }),
);
/** Sampled ids: bytes that merge when re-encoded (a, b, c, space, t, e, r), a lone UTF-8 lead byte, digits. */
/** A tool call written by the model after them, sometimes. */
const outputArb = fc.record({
  ids: fc.array(fc.constantFrom(97, 98, 99, 32, 116, 101, 114, 0xc3, 48, 49), { minLength: 1, maxLength: 12 }),
  call: fc.option(fc.nat(99), { nil: null }),
  stop: fc.boolean(),
});
const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { x: { type: "number" } } } } }];

describe("gateway TITO (property)", () => {
  it("trains exactly the sampled ids, one segment per unbroken conversation, for a tokenizer whose decode→encode is not the identity", async () => {
    expect(tok.encode(tok.decode([97, 98, 99]))).toEqual([257]); // the premise: not the identity
    await fc.assert(
      fc.asyncProperty(fc.array(fc.tuple(opArb, outputArb), { minLength: 1, maxLength: 10 }), async (steps) => {
        const s = gw.openSession({ episodeId: "prop", groupIndex: 0 });
        const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
        const convs: { history: OpenAI.Chat.Completions.ChatCompletionMessageParam[]; segment: number }[] = [];
        let segments = 0;
        const expected: { segment: number; output: number[]; rendered: string }[] = [];
        const first = fake.count("/generate");
        const sampledText = new Map<object, string>();
        for (const [k, [op, out]] of steps.entries()) {
          const sampled = out.call === null ? out.ids : [...out.ids, ...tok.encode(`<tool_call>{"name": "f", "arguments": {"x": ${out.call}}}</tool_call>`)];
          const ids = out.stop ? [...sampled, EOS] : sampled;
          let conv = op.kind === "new" || convs.length === 0 ? null : convs[op.c % convs.length]!;
          if (conv === null) {
            conv = { history: [{ role: "user", content: `task ${k}` }], segment: segments++ };
            convs.push(conv);
          } else if (op.kind === "compact") {
            conv.history = [{ role: "system", content: `summary before ${k}` }, { role: "user", content: `go on ${k}` }];
            conv.segment = segments++;
          } else if (op.kind === "edit") {
            // The agent rewrites its last answer (dropping its tool calls and their results).
            const at = conv.history.findLastIndex((m) => m.role === "assistant");
            const last = conv.history[at]!;
            conv.history.splice(at, conv.history.length - at, { role: "assistant", content: `${String(last.content)} (edited)` });
            conv.history.push({ role: "user", content: `next ${k}` });
            conv.segment = segments++;
          } else conv.history.push({ role: "user", content: op.kind === "tool" ? `tool output ${k}` : `next ${k}` });
          fake.script("/generate", { kind: "tokens", ids, finish: out.stop ? "stop" : "length" });
          // An echoed answer renders as the sampled text (tool-call block included); others as their content.
          const rendered = conv.history.map((m) => `<s>${m.role}\n${sampledText.get(m) ?? String(m.content)}</s>\n`).join("") + "<s>assistant\n";
          const r = await ai.chat.completions.create({ model: "m", messages: conv.history, max_tokens: ids.length, tools });
          const answer = r.choices[0]!.message;
          expect(answer.tool_calls?.length ?? 0, `request ${k}: the call is parsed`).toBe(out.call === null ? 0 : 1);
          const echoed: OpenAI.Chat.Completions.ChatCompletionMessageParam = { role: "assistant", content: answer.content, ...(answer.tool_calls ? { tool_calls: answer.tool_calls } : {}) };
          sampledText.set(echoed, tok.decode(ids, true));
          conv.history.push(echoed);
          for (const c of answer.tool_calls ?? []) conv.history.push({ role: "tool", tool_call_id: c.id, content: `result ${k}` });
          expected.push({ segment: conv.segment, output: ids, rendered });
        }
        const rep = gw.closeSession(s.id);
        const sent = fake.seen.filter((x) => x.path === "/generate").slice(first).map((x) => (x.body as { input_ids: number[] }).input_ids);
        expect(sent).toHaveLength(steps.length);
        // What each request sent reads as the template's rendering of the conversation it carried
        // (the sampled ids inside it already hold their end-of-turn token: none doubled, none lost).
        sent.forEach((ids, k) => expect(tok.decode(ids, false), `request ${k}`).toBe(expected[k]!.rendered));
        expect(rep.samples.map((x) => x.index)).toEqual([...Array(segments).keys()]);
        rep.samples.forEach((smp, i) => {
          expect(sampleProblem(smp)).toBeNull();
          const mine = expected.filter((e) => e.segment === i);
          const resp = Array.from(smp.tokens.subarray(smp.tokens.length - smp.responseLength));
          // Loss mask 1 exactly on the sampled ids, in order, each once.
          const trained = resp.filter((_, j) => smp.lossMask[j] === 1);
          expect(trained, `segment ${i}`).toEqual(mine.flatMap((e) => e.output));
          expect(smp.lossMask.reduce((a, b) => a + b, 0)).toBe(mine.reduce((a, e) => a + e.output.length, 0));
          // Each request of the segment sent a prefix of it: its history, as ids.
          expected.forEach((e, k) => {
            if (e.segment !== i) return;
            const upto = [...sent[k]!, ...e.output];
            expect(Array.from(smp.tokens.subarray(0, upto.length)), `request ${k} in segment ${i}`).toEqual(upto);
          });
        });
      }),
      { numRuns: RUNS },
    );
  });
});
