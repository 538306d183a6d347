// Incremental detokenisation of one streamed choice: turns the cumulative ids an engine has sampled
// so far into reasoning and content deltas, emitted only at safe points — never inside a UTF-8
// sequence (a decode that ends in U+FFFD waits for the next token), never a possible start of a stop
// string, of `<think>` or `</think>`, nothing of the content from where a tool call may start (the
// calls are parsed from the whole turn at the end; reply-format.ts says where for each syntax), and
// no trailing whitespace (a decoder may drop it given the next token; trimmed when a call follows).
// The reply's text is the plan's prefill followed by the sampled text, split as parseReply splits
// the whole turn, so every delta is a prefix-extension of what was emitted on its channel and their
// concatenation is the final reasoning and content.
import { contentBeforeCalls, partialSuffix, splitReasoning, type ReplyPlan } from "./reply-format.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

const REPLACEMENT = "\uFFFD";

function slice(ids: ArrayLike<number>, start: number, end: number): ArrayLike<number> {
  return ids instanceof Int32Array ? ids.subarray(start, end) : Array.from(ids).slice(start, end);
}

/** New text on each channel ("" when none). */
export interface ReplyDelta {
  reasoning: string;
  content: string;
}

/** One choice's text stream: `push(ids)` with every sampled id so far, `finish(reply)` at the end. */
export class TextStreamer {
  /** Decoded sampled text that is final (ends at a token boundary with a whole character). */
  private stable = "";
  /** Ids [0, readOffset) are decoded into `stable`; decoding restarts from prefixOffset (a few tokens back, for decoders whose output depends on the previous token). */
  private prefixOffset = 0;
  private readOffset = 0;
  private emitted = "";
  private emittedReasoning = "";
  /** A stop string or the start of a tool call was seen: nothing more is emitted until finish. */
  private held = false;

  constructor(
    private readonly tok: ChatTokenizer,
    private readonly stop: readonly string[],
    private readonly plan: Pick<ReplyPlan, "parse" | "prefill">,
  ) {}

  /** Content emitted so far. */
  get text(): string {
    return this.emitted;
  }

  /** Reasoning emitted so far. */
  get reasoning(): string {
    return this.emittedReasoning;
  }

  /** Takes every id sampled so far; returns the new safe text of each channel. */
  push(ids: ArrayLike<number>): ReplyDelta {
    if (this.held) return { reasoning: "", content: "" };
    this.decode(ids);
    const v = this.view(this.stable);
    this.held = v.held;
    return { reasoning: this.emitReasoning(v.reasoning), content: this.emitContent(v.content) };
  }

  /** The rest of the turn, given its final reasoning and content (as a non-streamed answer carries them). */
  finish(reply: { reasoning: string | null; content: string }): ReplyDelta {
    this.held = true;
    return { reasoning: this.rest(reply.reasoning ?? "", "emittedReasoning"), content: this.rest(reply.content, "emitted") };
  }

  private rest(final: string, field: "emitted" | "emittedReasoning"): string {
    const sent = this[field];
    // The final text extends what was sent. When the decoder rewrote text already sent (a whole
    // decode that differs from the incremental one, e.g. a tokenizer that cleans up spaces; not seen
    // with byte-level decoders), nothing can be taken back, so the text past the length sent follows.
    const rest = final.slice(sent.length);
    this[field] = sent + rest;
    return rest;
  }

  private decode(ids: ArrayLike<number>): void {
    if (ids.length <= this.readOffset) return;
    const before = this.tok.decode(slice(ids, this.prefixOffset, this.readOffset));
    const now = this.tok.decode(slice(ids, this.prefixOffset, ids.length));
    if (now.endsWith(REPLACEMENT)) return;
    if (now.startsWith(before)) {
      if (now.length <= before.length) return;
      this.stable += now.slice(before.length);
    } else {
      // The decoder rewrote what it had decoded, given the new token (HF's clean-up of spaces before
      // punctuation: " " then " ?" decodes to "?"): take its new reading, unless that takes back
      // text already sent (trailing whitespace is never sent early for this reason; finish() settles the rest).
      const candidate = this.stable.slice(0, Math.max(0, this.stable.length - before.length)) + now;
      const v = this.view(candidate);
      if (!v.content.startsWith(this.emitted) || !v.reasoning.startsWith(this.emittedReasoning)) return;
      this.stable = candidate;
    }
    this.prefixOffset = this.readOffset;
    this.readOffset = ids.length;
  }

  /** The longest reasoning and content that cannot change, given the sampled text so far. */
  private view(sampled: string): { reasoning: string; content: string; held: boolean } {
    let text = sampled;
    let cut = -1;
    for (const s of this.stop) {
      const k = text.indexOf(s);
      if (k >= 0 && (cut < 0 || k < cut)) cut = k;
    }
    if (cut >= 0) text = text.slice(0, cut);
    else text = text.slice(0, text.length - partialSuffix(text, this.stop));
    const split = splitReasoning(this.plan.prefill + text, this.plan.parse, false);
    let content = "";
    let callHeld = false;
    if (split.phase === "content") {
      const c = contentBeforeCalls(split.content, this.plan.parse.toolCalls);
      content = c.text;
      callHeld = c.held;
    }
    // Trailing whitespace waits for the next token: a decoder may drop it (" ?" → "?"), and with
    // tools it is trimmed before a call.
    return { reasoning: (split.reasoning ?? "").trimEnd(), content: content.trimEnd(), held: cut >= 0 || callHeld };
  }

  private emitContent(text: string): string {
    if (text.length <= this.emitted.length || !text.startsWith(this.emitted)) return "";
    const delta = text.slice(this.emitted.length);
    this.emitted = text;
    return delta;
  }

  private emitReasoning(text: string): string {
    if (text.length <= this.emittedReasoning.length || !text.startsWith(this.emittedReasoning)) return "";
    const delta = text.slice(this.emittedReasoning.length);
    this.emittedReasoning = text;
    return delta;
  }
}
