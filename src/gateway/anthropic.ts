// Anthropic's shapes for the gateway: a message (text and tool_use blocks, stop_reason, usage), the
// event stream (message_start, ping, content_block_start / content_block_delta with text_delta or
// input_json_delta / content_block_stop, message_delta, message_stop; `error` events), and the
// model list.
import type { ServerResponse } from "node:http";
import type { GatewayError } from "./errors.ts";
import type { TurnChoice, TurnResult } from "./session.ts";

function stopReason(c: TurnChoice): string {
  if (c.finish === "tool_calls") return "tool_use";
  if (c.finish === "length") return "max_tokens";
  if (c.stopSequence !== null) return "stop_sequence";
  return "end_turn";
}

function blocks(c: TurnChoice): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
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

/** Writes Anthropic's event stream: `start` before generation, then `finish` or `fail`. */
export class AnthropicStream {
  constructor(
    private readonly res: ServerResponse,
    private readonly id: string,
    private readonly model: string,
  ) {}

  private event(type: string, data: Record<string, unknown>): void {
    this.res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  }

  /** Headers, message_start (input usage follows in message_delta), ping. */
  start(): void {
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" });
    this.event("message_start", {
      message: { id: this.id, type: "message", role: "assistant", model: this.model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 0, output_tokens: 0 } },
    });
    this.event("ping", {});
  }

  /** Content blocks, message_delta (stop_reason, usage), message_stop. */
  finish(r: TurnResult): void {
    const c = r.choices[0]!;
    blocks(c).forEach((b, index) => {
      if (b.type === "text") {
        this.event("content_block_start", { index, content_block: { type: "text", text: "" } });
        if (b.text !== "") this.event("content_block_delta", { index, delta: { type: "text_delta", text: b.text } });
      } else {
        this.event("content_block_start", { index, content_block: { type: "tool_use", id: b.id, name: b.name, input: {} } });
        this.event("content_block_delta", { index, delta: { type: "input_json_delta", partial_json: JSON.stringify(b.input) } });
      }
      this.event("content_block_stop", { index });
    });
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
export function anthropicModelsBody(model: string, created: number): Record<string, unknown> {
  return {
    data: [{ type: "model", id: model, display_name: model, created_at: new Date(created * 1000).toISOString() }],
    has_more: false,
    first_id: model,
    last_id: model,
  };
}
