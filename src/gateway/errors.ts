// The gateway's API error: an OozeError that knows its HTTP status and how OpenAI and Anthropic each
// spell it on the wire (OpenAI `{error:{message,type,param,code}}`, Anthropic
// `{type:"error",error:{type,message}}`).
import { OozeError, type ErrorCode } from "../errors.ts";

/** What went wrong, independent of the API dialect. */
export type GatewayErrorKind =
  | "invalid_request" // malformed JSON, a field of the wrong type or out of range (400)
  | "authentication" // missing or wrong API key (401)
  | "not_found" // unknown session or path (404)
  | "model_not_found" // a model this gateway does not serve (404)
  | "method" // wrong HTTP method (405)
  | "too_large" // request body over the limit (413)
  | "context_length" // prompt + max tokens beyond the model's context (400)
  | "limit" // the session's maxTurns / maxTokens is spent (400)
  | "engine" // no engine could serve the request (503)
  | "internal"; // a bug (500)

const STATUS: Record<GatewayErrorKind, number> = {
  invalid_request: 400,
  authentication: 401,
  not_found: 404,
  model_not_found: 404,
  method: 405,
  too_large: 413,
  context_length: 400,
  limit: 400,
  engine: 503,
  internal: 500,
};

const OPENAI_TYPE: Record<GatewayErrorKind, string> = {
  invalid_request: "invalid_request_error",
  authentication: "invalid_request_error",
  not_found: "invalid_request_error",
  model_not_found: "invalid_request_error",
  method: "invalid_request_error",
  too_large: "invalid_request_error",
  context_length: "invalid_request_error",
  limit: "invalid_request_error",
  engine: "server_error",
  internal: "server_error",
};

const OPENAI_CODE: Record<GatewayErrorKind, string | null> = {
  invalid_request: null,
  authentication: "invalid_api_key",
  not_found: "not_found",
  model_not_found: "model_not_found",
  method: "method_not_allowed",
  too_large: "request_too_large",
  context_length: "context_length_exceeded",
  limit: "session_limit_exceeded",
  engine: "engine_unavailable",
  internal: null,
};

const ANTHROPIC_TYPE: Record<GatewayErrorKind, string> = {
  invalid_request: "invalid_request_error",
  authentication: "authentication_error",
  not_found: "not_found_error",
  model_not_found: "not_found_error",
  method: "invalid_request_error",
  too_large: "request_too_large",
  context_length: "invalid_request_error",
  limit: "invalid_request_error",
  engine: "overloaded_error",
  internal: "api_error",
};

/** An error answered to an agent; `param` names the offending field (OpenAI's `param`). */
export class GatewayError extends OozeError {
  readonly kind: GatewayErrorKind;
  readonly status: number;
  readonly param: string | null;

  constructor(kind: GatewayErrorKind, message: string, param: string | null = null, options: { cause?: unknown } = {}) {
    const code: ErrorCode = kind === "engine" ? "ENGINE_UNAVAILABLE" : kind === "internal" ? "INTERNAL" : "BAD_REQUEST";
    super(code, message, { retryable: kind === "engine", ...options });
    this.name = "GatewayError";
    this.kind = kind;
    this.status = kind === "engine" ? 503 : STATUS[kind];
    this.param = param;
  }

  /** OpenAI's error body. */
  openai(): { error: { message: string; type: string; param: string | null; code: string | null } } {
    return { error: { message: this.message, type: OPENAI_TYPE[this.kind], param: this.param, code: OPENAI_CODE[this.kind] } };
  }

  /** Anthropic's error body. */
  anthropic(): { type: "error"; error: { type: string; message: string } } {
    return { type: "error", error: { type: ANTHROPIC_TYPE[this.kind], message: this.message } };
  }
}

/** A field of the wrong type or out of range: names the field path and what was expected. */
export function invalid(param: string, expected: string, got?: unknown): GatewayError {
  const shown = got === undefined ? "" : ` (got ${describe(got)})`;
  return new GatewayError("invalid_request", `'${param}' must be ${expected}${shown}`, param);
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "string") return v.length > 40 ? `a string "${v.slice(0, 40)}…"` : `"${v}"`;
  if (typeof v === "object") return "an object";
  return `${typeof v} ${String(v)}`;
}
