// OpenAI's shapes for the gateway: a chat.completion (with `reasoning_content` when the model
// reasoned, as OpenAI-compatible servers return it), the chat.completion.chunk stream (role chunk
// first, reasoning_content and content deltas as the engine samples, then tool_calls,
// finish_reason, the usage chunk with stream_options.include_usage, then `data: [DONE]`), and the
// model list.
import type { ServerResponse } from "node:http";
import type { GatewayError } from "./errors.ts";
import type { ChatRequest } from "./messages.ts";
import type { TurnChoice, TurnResult } from "./session.ts";
import { TextStreamer, type ReplyDelta } from "./stream-text.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

const utf8 = new TextEncoder();

function finishReason(c: TurnChoice): string {
  return c.finish === "abort" ? "stop" : c.finish;
}

function usage(r: TurnResult) {
  const completion = r.choices.reduce((a, c) => a + c.ids.length, 0);
  return { prompt_tokens: r.promptTokens, completion_tokens: completion, total_tokens: r.promptTokens + completion, prompt_tokens_details: { cached_tokens: r.cachedTokens } };
}

/** OpenAI logprob entries of ids [start, end) (special tokens left out). */
function logprobEntries(ids: Int32Array, lps: Float32Array, start: number, end: number, tok: ChatTokenizer) {
  const content = [];
  for (let i = start; i < end; i++) {
    const id = ids[i]!;
    if (tok.specialText.has(id)) continue;
    const token = tok.decode([id], false);
    content.push({ token, logprob: lps[i]!, bytes: Array.from(utf8.encode(token)), top_logprobs: [] });
  }
  return { content, refusal: null };
}

function logprobs(c: TurnChoice, tok: ChatTokenizer) {
  return logprobEntries(c.ids, c.logprobs, 0, c.ids.length, tok);
}

function message(c: TurnChoice) {
  const m: Record<string, unknown> = { role: "assistant", content: c.toolCalls.length > 0 && c.content === "" ? null : c.content, refusal: null };
  if (c.reasoning !== null && c.reasoning !== "") m.reasoning_content = c.reasoning;
  if (c.toolCalls.length > 0) m.tool_calls = c.toolCalls.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } }));
  return m;
}

/** A non-streamed chat.completion. */
export function completionBody(id: string, model: string, req: ChatRequest, r: TurnResult, tok: ChatTokenizer): Record<string, unknown> {
  return {
    id,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model,
    choices: r.choices.map((c, index) => ({ index, message: message(c), logprobs: req.logprobs ? logprobs(c, tok) : null, finish_reason: finishReason(c) })),
    usage: usage(r),
    // The policy's weight version that sampled the answer.
    system_fingerprint: r.weightVersion,
  };
}

/** One choice of a stream: its text so far and how many of its tokens' logprobs were sent. */
interface StreamedChoice {
  text: TextStreamer;
  ids: Int32Array;
  logprobs: Float32Array;
  lpSent: number;
}

/**
 * Writes a chat.completion.chunk stream: `start` before generation, `progress` as the engine samples
 * (content deltas at safe points of the detokenisation, with their tokens' logprobs), then `finish`
 * (the rest of the content, tool calls, finish reasons, usage) or `fail`.
 */
export class OpenAIStream {
  private readonly created = Math.floor(Date.now() / 1000);
  private readonly choices: StreamedChoice[];
  private started = false;
  private fingerprint: string | null = null;

  constructor(
    private readonly res: ServerResponse,
    private readonly id: string,
    private readonly model: string,
    private readonly req: ChatRequest,
    private readonly tok: ChatTokenizer,
  ) {
    this.choices = Array.from({ length: req.n }, () => ({ text: new TextStreamer(tok, req.stop, req.output), ids: new Int32Array(0), logprobs: new Float32Array(0), lpSent: 0 }));
  }

  private chunk(choices: unknown[], usage: unknown = undefined): void {
    const c: Record<string, unknown> = { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.model, system_fingerprint: this.fingerprint, choices };
    if (this.req.includeUsage) c.usage = usage ?? null;
    this.res.write(`data: ${JSON.stringify(c)}\n\n`);
  }

  /** Headers and the role chunk of every choice (then whatever was sampled before). */
  start(): void {
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" });
    this.chunk(Array.from({ length: this.req.n }, (_, index) => ({ index, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null })));
    this.started = true;
    this.choices.forEach((c, k) => this.send(k, c.text.push(c.ids)));
  }

  /** Every id choice `k` has sampled so far: a content chunk when they complete safe text. */
  progress(k: number, ids: Int32Array, logprobs: Float32Array): void {
    const c = this.choices[k];
    if (!c || this.res.writableEnded || this.res.destroyed) return;
    c.ids = ids;
    c.logprobs = logprobs;
    if (this.started) this.send(k, c.text.push(ids));
  }

  private send(k: number, d: ReplyDelta, final = false): void {
    const c = this.choices[k]!;
    const lp = this.req.logprobs && c.lpSent < c.ids.length;
    if (d.reasoning === "" && d.content === "" && !(final && lp)) return;
    const entries = lp ? logprobEntries(c.ids, c.logprobs, c.lpSent, c.ids.length, this.tok) : null;
    c.lpSent = c.ids.length;
    const delta: Record<string, string> = {};
    if (d.reasoning !== "") delta.reasoning_content = d.reasoning;
    if (d.content !== "") delta.content = d.content;
    this.chunk([{ index: k, delta, logprobs: entries, finish_reason: null }]);
  }

  /** The rest of the content, tool calls, finish reasons, usage, [DONE]. */
  finish(r: TurnResult): void {
    this.fingerprint = r.weightVersion;
    r.choices.forEach((c, index) => {
      const s = this.choices[index]!;
      s.ids = c.ids;
      s.logprobs = c.logprobs;
      this.send(index, s.text.finish(c), true);
      c.toolCalls.forEach((t, k) =>
        this.chunk([{ index, delta: { tool_calls: [{ index: k, id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } }] }, logprobs: null, finish_reason: null }]),
      );
      this.chunk([{ index, delta: {}, logprobs: null, finish_reason: finishReason(c) }]);
    });
    if (this.req.includeUsage) this.chunk([], usage(r));
    this.res.end("data: [DONE]\n\n");
  }

  /** An error after the stream began: an error event, then [DONE]. */
  fail(e: GatewayError): void {
    this.res.write(`data: ${JSON.stringify(e.openai())}\n\n`);
    this.res.end("data: [DONE]\n\n");
  }
}

/** GET /v1/models. */
export function modelsBody(models: readonly string[], created: number): Record<string, unknown> {
  return { object: "list", data: models.map((id) => ({ id, object: "model", created, owned_by: "ooze" })) };
}
