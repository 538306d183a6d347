// OpenAI's shapes for the gateway: a chat.completion, the chat.completion.chunk stream (role chunk
// first, content, tool_calls, finish_reason, the usage chunk with stream_options.include_usage,
// then `data: [DONE]`), and the model list.
import type { ServerResponse } from "node:http";
import type { GatewayError } from "./errors.ts";
import type { ChatRequest } from "./messages.ts";
import type { TurnChoice, TurnResult } from "./session.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

const utf8 = new TextEncoder();

function finishReason(c: TurnChoice): string {
  return c.finish === "abort" ? "stop" : c.finish;
}

function usage(r: TurnResult) {
  const completion = r.choices.reduce((a, c) => a + c.ids.length, 0);
  return { prompt_tokens: r.promptTokens, completion_tokens: completion, total_tokens: r.promptTokens + completion, prompt_tokens_details: { cached_tokens: r.cachedTokens } };
}

function logprobs(c: TurnChoice, tok: ChatTokenizer) {
  const content = [];
  for (let i = 0; i < c.ids.length; i++) {
    const id = c.ids[i]!;
    if (tok.specialText.has(id)) continue;
    const token = tok.decode([id], false);
    content.push({ token, logprob: c.logprobs[i]!, bytes: Array.from(utf8.encode(token)), top_logprobs: [] });
  }
  return { content, refusal: null };
}

function message(c: TurnChoice) {
  const m: Record<string, unknown> = { role: "assistant", content: c.toolCalls.length > 0 && c.content === "" ? null : c.content, refusal: null };
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
    system_fingerprint: null,
  };
}

/** Writes a chat.completion.chunk stream: `start` before generation, then `finish` or `fail`. */
export class OpenAIStream {
  private readonly created = Math.floor(Date.now() / 1000);

  constructor(
    private readonly res: ServerResponse,
    private readonly id: string,
    private readonly model: string,
    private readonly req: ChatRequest,
    private readonly tok: ChatTokenizer,
  ) {}

  private chunk(choices: unknown[], usage: unknown = undefined): void {
    const c: Record<string, unknown> = { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.model, system_fingerprint: null, choices };
    if (this.req.includeUsage) c.usage = usage ?? null;
    this.res.write(`data: ${JSON.stringify(c)}\n\n`);
  }

  /** Headers and the role chunk of every choice. */
  start(): void {
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" });
    this.chunk(Array.from({ length: this.req.n }, (_, index) => ({ index, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null })));
  }

  /** Content, tool calls, finish reasons, usage, [DONE]. */
  finish(r: TurnResult): void {
    r.choices.forEach((c, index) => {
      if (c.content !== "") this.chunk([{ index, delta: { content: c.content }, logprobs: this.req.logprobs ? logprobs(c, this.tok) : null, finish_reason: null }]);
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
export function modelsBody(model: string, created: number): Record<string, unknown> {
  return { object: "list", data: [{ id: model, object: "model", created, owned_by: "ooze" }] };
}
