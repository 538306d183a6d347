// Incremental detokenisation of one streamed choice: turns the cumulative ids an engine has sampled
// so far into text deltas, emitted only at safe points — never inside a UTF-8 sequence (a decode
// that ends in U+FFFD waits for the next token), never a possible start of a stop string, and, when
// tools are offered, nothing from the first `<tool_call>` on (the calls are parsed from the whole
// turn at the end), and no trailing whitespace (a decoder may drop it given the next token; trimmed
// when a call follows). Every delta is a
// prefix-extension of what was emitted, so their concatenation is the final content.
import type { ChatTokenizer } from "./tokenizer.ts";

const TOOL_OPEN = "<tool_call>";
const REPLACEMENT = "\uFFFD";

function slice(ids: ArrayLike<number>, start: number, end: number): ArrayLike<number> {
  return ids instanceof Int32Array ? ids.subarray(start, end) : Array.from(ids).slice(start, end);
}

/** Length of the longest suffix of `text` that is a proper prefix of one of `words`. */
function partialSuffix(text: string, words: readonly string[]): number {
  let best = 0;
  for (const w of words) {
    for (let k = Math.min(w.length - 1, text.length); k > best; k--) {
      if (text.endsWith(w.slice(0, k))) {
        best = k;
        break;
      }
    }
  }
  return best;
}

/** One choice's text stream: `push(ids)` with every sampled id so far, `finish(content)` at the end. */
export class TextStreamer {
  /** Decoded text that is final (ends at a token boundary with a whole character). */
  private stable = "";
  /** Ids [0, readOffset) are decoded into `stable`; decoding restarts from prefixOffset (a few tokens back, for decoders whose output depends on the previous token). */
  private prefixOffset = 0;
  private readOffset = 0;
  private emitted = "";
  /** A tool call or stop string was seen: nothing more is emitted until finish. */
  private held = false;

  constructor(
    private readonly tok: ChatTokenizer,
    private readonly stop: readonly string[],
    private readonly tools: boolean,
  ) {}

  /** Text emitted so far. */
  get text(): string {
    return this.emitted;
  }

  /** Takes every id sampled so far; returns the new safe text ("" when none). */
  push(ids: ArrayLike<number>): string {
    if (this.held) return "";
    this.decode(ids);
    return this.emit(this.safe());
  }

  /** The rest of the turn, given its final content (as a non-streamed answer would carry it). */
  finish(content: string): string {
    this.held = true;
    if (content.startsWith(this.emitted)) return this.emit(content);
    // The decoder rewrote text already sent (a whole decode that differs from the incremental one,
    // e.g. a tokenizer that cleans up spaces; not seen with byte-level decoders): nothing can be
    // taken back, so the content past the length sent follows.
    const rest = content.slice(this.emitted.length);
    this.emitted += rest;
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
      const base = this.stable.slice(0, Math.max(0, this.stable.length - before.length));
      if (!(base + now).startsWith(this.emitted)) return;
      this.stable = base + now;
    }
    this.prefixOffset = this.readOffset;
    this.readOffset = ids.length;
  }

  /** The longest prefix of the stable text that cannot change. */
  private safe(): string {
    let text = this.stable;
    let cut = -1;
    for (const s of this.stop) {
      const k = text.indexOf(s);
      if (k >= 0 && (cut < 0 || k < cut)) cut = k;
    }
    if (this.tools) {
      const k = text.indexOf(TOOL_OPEN);
      if (k >= 0 && (cut < 0 || k < cut)) cut = k;
    }
    if (cut >= 0) {
      this.held = true;
      text = text.slice(0, cut);
    } else text = text.slice(0, text.length - partialSuffix(text, this.tools ? [...this.stop, TOOL_OPEN] : this.stop));
    // Trailing whitespace waits for the next token: a decoder may drop it (" ?" → "?"), and with
    // tools it is trimmed before a call.
    return text.trimEnd();
  }

  private emit(text: string): string {
    if (text.length <= this.emitted.length || !text.startsWith(this.emitted)) return "";
    const delta = text.slice(this.emitted.length);
    this.emitted = text;
    return delta;
  }
}
