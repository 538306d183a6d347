// SGLang's length limits on a /generate request, as facts of its v0.5.x source: what it refuses
// (TokenizerManager._validate_one_request, then the scheduler's validate_input_length), what it caps
// (the scheduler's max_new_tokens cap, null included), and so the largest max_new_tokens a client
// may send for an input without being refused by any v0.5.x server. `ooze serve` refuses and caps
// with these; the fleet, the rollout and the gateway size their requests with them.
//
// - input_len ≥ context_len → 400 "The input (N tokens) is longer than the model's context length (C tokens)."
// - max_new_tokens as the request sent it (absent or null: not checked) and input_len +
//   max_new_tokens > context_len → 400 "Requested token count exceeds the model's maximum context
//   length of C tokens. …". Releases before SGLang PR #22546 (April 2026) refused at ≥; this server
//   refuses at > (the newer form), clients stay below both.
// - input_len ≥ max_req_input_len, where max_req_len = min(context_len − 1, KV pool − 1) and
//   max_req_input_len = max_req_len − 5 → the scheduler aborts it with status 400 "Input length (N
//   tokens) exceeds the maximum allowed length (M tokens). Use a shorter input or enable
//   --allow-auto-truncate." (non-streamed: a 400; streamed: an abort finish reason with status_code 400).
// - every admitted request's max_new_tokens (default 128; null = 2^30) is capped to max_req_len − input_len − 1.

/** The length limits of one engine. */
export interface LengthLimits {
  /** The model's context length (SGLang's context_len). */
  contextLength: number;
  /** Longest input the scheduler admits, exclusive (SGLang's max_req_input_len, in /server_info). */
  maxReqInputLen: number;
}

/** Inputs between the scheduler's max_req_input_len and max_req_len (SGLang keeps these 5 tokens back). */
const INPUT_MARGIN = 5;

/** An engine's limits from its context length and, when known, its KV pool size in tokens (SGLang's max_total_num_tokens). */
export function limitsOfContext(contextLength: number, kvTokens?: number): LengthLimits {
  const maxReqLen = Math.min(contextLength - 1, kvTokens === undefined ? Infinity : kvTokens - 1);
  return { contextLength, maxReqInputLen: maxReqLen - INPUT_MARGIN };
}

const positiveInt = (v: unknown): number | null => (typeof v === "number" && Number.isSafeInteger(v) && v > 0 ? v : null);

/**
 * An engine's limits from what it reports: /server_info's `max_req_input_len` (SGLang's scheduler
 * info; `ooze serve` reports it too) and the context length (/server_info's `context_length`, or the
 * model config's `max_position_embeddings` in /model_info). null when it reports neither.
 */
export function limitsOfEngine(serverInfo: Record<string, unknown>, contextLength: unknown): LengthLimits | null {
  const context = positiveInt(serverInfo.context_length) ?? positiveInt(contextLength);
  const maxInput = positiveInt(serverInfo.max_req_input_len);
  if (maxInput !== null) return { contextLength: context ?? maxInput + INPUT_MARGIN + 1, maxReqInputLen: maxInput };
  return context === null ? null : limitsOfContext(context);
}

/** The most tokens an admitted request of `inputLen` tokens may generate (the scheduler's cap). */
export function outputCap(limits: LengthLimits, inputLen: number): number {
  return Math.max(0, limits.maxReqInputLen + INPUT_MARGIN - inputLen - 1);
}

/**
 * The largest max_new_tokens to send with an input of `inputLen` tokens that no SGLang v0.5.x
 * refuses (input + max_new_tokens stays below the context length, the input below
 * max_req_input_len); it is also the most the engine would generate. 0: the input itself is refused.
 */
export function sendableMaxNewTokens(limits: LengthLimits, inputLen: number): number {
  return inputLen >= limits.maxReqInputLen ? 0 : outputCap(limits, inputLen);
}

/** A request SGLang refuses for its length: where (tokenizer manager or scheduler) and its message. */
export interface LengthRefusal {
  /** "validate": refused before it runs (a ValueError); "scheduler": aborted with status 400 on admission. */
  stage: "validate" | "scheduler";
  message: string;
}

/** Why SGLang refuses a request of `inputLen` tokens asking for `maxNewTokens` (as sent; null: absent or null, unchecked), or null. */
export function lengthRefusal(limits: LengthLimits, inputLen: number, maxNewTokens: number | null): LengthRefusal | null {
  const c = limits.contextLength;
  if (inputLen >= c) return { stage: "validate", message: `The input (${inputLen} tokens) is longer than the model's context length (${c} tokens).` };
  if (maxNewTokens !== null && inputLen + maxNewTokens > c) {
    return {
      stage: "validate",
      message:
        `Requested token count exceeds the model's maximum context length of ${c} tokens. You requested a total of ${inputLen + maxNewTokens} ` +
        `tokens: ${inputLen} tokens from the input messages and ${maxNewTokens} tokens for the completion. Please reduce the number ` +
        "of tokens in the input messages or the completion to fit within the limit.",
    };
  }
  if (inputLen >= limits.maxReqInputLen) {
    return {
      stage: "scheduler",
      message: `Input length (${inputLen} tokens) exceeds the maximum allowed length (${limits.maxReqInputLen} tokens). Use a shorter input or enable --allow-auto-truncate.`,
    };
  }
  return null;
}
