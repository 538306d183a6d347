// Anthropic's shapes for the gateway: a message (a thinking block when the model reasoned, text and
// tool_use blocks, stop_reason, usage), the event stream (message_start, ping, content_block_start /
// content_block_delta with thinking_delta and text_delta as the engine samples or input_json_delta /
// content_block_stop, message_delta, message_stop; `error` events), and the model list.
import type { ServerResponse } from "node:http";
import type { GatewayError } from "./errors.ts";
import type { ChatRequest } from "./messages.ts";
import type { TurnChoice, TurnResult } from "./session.ts";
import { TextStreamer, type ReplyDelta } from "./stream-text.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

function stopReason(c: TurnChoice): string {
  if (c.finish === "tool_calls") return "tool_use";
  if (c.finish === "length") return "max_tokens";
  if (c.stopSequence !== null) return "stop_sequence";
  return "end_turn";
}

function blocks(c: TurnChoice): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  // No signature: the block is the policy's own text, not Anthropic's; sent back, it is matched by
  // the turn's text and calls (the sampled ids go back, thinking included).
  if (c.reasoning !== null && c.reasoning !== "") out.push({ type: "thinking", thinking: c.reasoning, signature: "" });
  if (c.content !== "" || c.toolCalls.length === 0) out.push({ type: "text", text: c.content });
  for (const t of c.toolCalls) out.push({ type: "tool_use", id: t.id.replace(/^call_/, "toolu_"), name: t.name, input: JSON.parse(t.arguments) as unknown });
  return out;
}

function usage(r: TurnResult, output: number) {
  return { input_tokens: r.promptTokens - r.cachedTokens, output_tokens: output, cache_read_input_tokens: r.cachedTokens, cache_creation_input_tokens: 0 };
}

/** A non-streamed message. */
export function messageBody(id: string, model: string, r: TurnResult): Record<string, unknown> {
  const c = r.choices[0]!;
  return { id, type: "message", role: "assistant", model, content: blocks(c), stop_reason: stopReason(c), stop_sequence: c.stopSequence, usage: usage(r, c.ids.length) };
}

/**
 * Writes Anthropic's event stream: `start` before generation, `progress` as the engine samples (a
 * thinking block's thinking_delta events, then a text block's text_delta events, at safe points of
 * the detokenisation), then `finish` (the rest of the text, tool_use blocks with input_json_delta,
 * message_delta with stop_reason and usage, message_stop) or `fail`.
 */
export class AnthropicStream {
  private readonly text: TextStreamer;
  private ids: Int32Array = new Int32Array(0);
  private started = false;
  /** The block now open (null: none) and the index the next block gets. */
  private open: "thinking" | "text" | null = null;
  private next = 0;

  constructor(
    private readonly res: ServerResponse,
    private readonly id: string,
    private readonly model: string,
    req: ChatRequest,
    tok: ChatTokenizer,
  ) {
    this.text = new TextStreamer(tok, req.stop, req.output);
  }

  private event(type: string, data: Record<string, unknown>): void {
    this.res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  }

  /** Headers, message_start (input usage follows in message_delta), ping (then whatever was sampled before). */
  start(): void {
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" });
    this.event("message_start", {
      message: { id: this.id, type: "message", role: "assistant", model: this.model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 0, output_tokens: 0 } },
    });
    this.event("ping", {});
    this.started = true;
    this.send(this.text.push(this.ids));
  }

  /** Every id sampled so far: thinking_delta / text_delta events when they complete safe text. */
  progress(ids: Int32Array): void {
    if (this.res.writableEnded || this.res.destroyed) return;
    this.ids = ids;
    if (this.started) this.send(this.text.push(ids));
  }

  /** Opens a block of this type (closing the one open) unless it is the one open. */
  private openBlock(type: "thinking" | "text"): void {
    if (this.open === type) return;
    this.closeBlock();
    this.event("content_block_start", { index: this.next, content_block: type === "thinking" ? { type, thinking: "", signature: "" } : { type, text: "" } });
    this.open = type;
  }

  private closeBlock(): void {
    if (this.open === null) return;
    this.event("content_block_stop", { index: this.next });
    this.open = null;
    this.next++;
  }

  private send(d: ReplyDelta): void {
    if (d.reasoning !== "") {
      this.openBlock("thinking");
      this.event("content_block_delta", { index: this.next, delta: { type: "thinking_delta", thinking: d.reasoning } });
    }
    if (d.content !== "") {
      this.openBlock("text");
      this.event("content_block_delta", { index: this.next, delta: { type: "text_delta", text: d.content } });
    }
  }

  /** The rest of the thinking and text, tool_use blocks, message_delta (stop_reason, usage), message_stop. */
  finish(r: TurnResult): void {
    const c = r.choices[0]!;
    const rest = this.text.finish(c);
    for (const b of blocks(c)) {
      if (b.type === "thinking") {
        // Sent while it was the open block; what is left of it only if no text has begun since.
        if (rest.reasoning !== "" && this.open !== "text") this.send({ reasoning: rest.reasoning, content: "" });
      } else if (b.type === "text") {
        this.openBlock("text");
        if (rest.content !== "") this.event("content_block_delta", { index: this.next, delta: { type: "text_delta", text: rest.content } });
      } else {
        this.closeBlock();
        this.event("content_block_start", { index: this.next, content_block: { type: "tool_use", id: b.id, name: b.name, input: {} } });
        this.event("content_block_delta", { index: this.next, delta: { type: "input_json_delta", partial_json: JSON.stringify(b.input) } });
        this.event("content_block_stop", { index: this.next });
        this.next++;
      }
    }
    this.closeBlock();
    this.event("message_delta", { delta: { stop_reason: stopReason(c), stop_sequence: c.stopSequence }, usage: usage(r, c.ids.length) });
    this.event("message_stop", {});
    this.res.end();
  }

  /** An error after the stream began: an `error` event. */
  fail(e: GatewayError): void {
    this.res.write(`event: error\ndata: ${JSON.stringify(e.anthropic())}\n\n`);
    this.res.end();
  }
}

/** GET /v1/models in Anthropic's shape. */
export function anthropicModelsBody(models: readonly string[], created: number): Record<string, unknown> {
  return {
    data: models.map((id) => ({ type: "model", id, display_name: id, created_at: new Date(created * 1000).toISOString() })),
    has_more: false,
    first_id: models[0] ?? null,
    last_id: models.at(-1) ?? null,
  };
}
