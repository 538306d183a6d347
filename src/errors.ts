// The one error type of ooze: a literal-union `code`, `retryable`, and `cause`. Foreign failures are
// turned into an OozeError at the boundary where they enter (transport, codec, engine, native), and
// supervisors decide restart or escalate from `code` and `retryable`, never from message text.

/** Every error code ooze raises. Add new codes here, in one place. */
export type ErrorCode =
  | "MALFORMED_MESSAGE" // a frame on the bus that is not valid msgpack or fails its validator
  | "TRANSPORT" // NATS connection, publish, consume or request failure
  | "TIMEOUT" // a deadline passed (ask, request, wait)
  | "NATS_SERVER_MISSING" // the nats-server binary is not installed
  | "NATS_SERVER_FAILED" // the embedded nats-server did not start or died
  | "TOPOLOGY_INVALID" // a topology file failed validation
  | "CONFIG_INVALID" // a configuration value is out of range
  | "ACTOR_CRASHED" // an actor's handler threw
  | "ACTOR_ESCALATED" // a supervisor gave up restarting a child
  | "ACTOR_STOPPED" // a message was sent to a stopped actor
  | "ACTOR_NOT_FOUND" // no actor answers at an address
  | "ENGINE_PROTOCOL" // an inference server's response broke the SGLang contract
  | "ENGINE_UNAVAILABLE" // an inference server cannot be reached or is unhealthy
  | "ENGINE_REJECTED" // an inference server answered 4xx for a request
  | "ENGINE_MISMATCH" // an attached engine serves a different model
  | "NATIVE_ADDON_MISSING" // native/build was not built
  | "NATIVE_FAILED" // a native kernel reported an error
  | "WORKER_DIED" // a trainer worker child process exited
  | "TORCH_SETUP" // the PyTorch worker's Python environment is missing or incomplete
  | "TORCH_FAILED" // the PyTorch trainer worker reported an error
  | "CHECKPOINT_INVALID" // a model directory / safetensors file is malformed
  | "BAD_REQUEST" // an HTTP request to one of ooze's servers is invalid
  | "SANDBOX_UNAVAILABLE" // this machine cannot make the agent sandbox (bwrap missing, namespaces not allowed)
  | "AGENTS_UNPRODUCTIVE" // rounds in a row of agent episodes produced nothing trainable
  | "INTERNAL";

/** Serialized form of an error on the wire: `{code, message, retryable, actor}`. */
export interface WireError {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  actor: string | null;
}

export interface OozeErrorOptions {
  retryable?: boolean;
  cause?: unknown;
  actor?: string | null;
}

/** Base error. Subclasses only fix `code` and a default for `retryable`. */
export class OozeError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly actor: string | null;

  constructor(code: ErrorCode, message: string, options: OozeErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "OozeError";
    this.code = code;
    this.retryable = options.retryable ?? false;
    this.actor = options.actor ?? null;
  }

  toWire(): WireError {
    return { code: this.code, message: this.message, retryable: this.retryable, actor: this.actor };
  }

  static fromWire(w: WireError): OozeError {
    return new OozeError(w.code, w.message, { retryable: w.retryable, actor: w.actor });
  }
}

/** A frame on the bus that is not valid msgpack or fails its message validator. */
export class MalformedMessageError extends OozeError {
  constructor(message: string, options: OozeErrorOptions = {}) {
    super("MALFORMED_MESSAGE", message, { retryable: false, ...options });
    this.name = "MalformedMessageError";
  }
}

/** A NATS failure: connection, publish, consume or request. */
export class TransportError extends OozeError {
  constructor(message: string, options: OozeErrorOptions = {}) {
    super("TRANSPORT", message, { retryable: true, ...options });
    this.name = "TransportError";
  }
}

/** A deadline passed. */
export class TimeoutError extends OozeError {
  constructor(message: string, options: OozeErrorOptions = {}) {
    super("TIMEOUT", message, { retryable: true, ...options });
    this.name = "TimeoutError";
  }
}

/** An inference server's response broke the SGLang contract; names the URL and the field. */
export class EngineProtocolError extends OozeError {
  readonly url: string;
  readonly field: string | null;
  constructor(url: string, field: string | null, message: string, options: OozeErrorOptions = {}) {
    super("ENGINE_PROTOCOL", `${url}: ${field === null ? "" : `field '${field}': `}${message}`, {
      retryable: true,
      ...options,
    });
    this.name = "EngineProtocolError";
    this.url = url;
    this.field = field;
  }
}

/** The native addon is not built; names the path tried, the loader's message, and the fix. */
export class NativeAddonMissingError extends OozeError {
  constructor(message: string, options: OozeErrorOptions = {}) {
    super("NATIVE_ADDON_MISSING", message, { retryable: false, ...options });
    this.name = "NativeAddonMissingError";
  }
}

/** A topology or configuration file failed validation; names file, line and field. */
export class TopologyError extends OozeError {
  constructor(message: string, options: OozeErrorOptions = {}) {
    super("TOPOLOGY_INVALID", message, { retryable: false, ...options });
    this.name = "TopologyError";
  }
}

/** Wraps any thrown value as an OozeError, keeping OozeErrors as they are. */
export function toOozeError(e: unknown, code: ErrorCode = "INTERNAL"): OozeError {
  if (e instanceof OozeError) return e;
  if (e instanceof Error) return new OozeError(code, e.message, { cause: e });
  return new OozeError(code, String(e));
}

/** Turns a nats.js failure into a TransportError / TimeoutError naming what was attempted. */
export function toTransportError(e: unknown, what: string): OozeError {
  if (e instanceof OozeError) return e;
  const err = e instanceof Error ? e : new Error(String(e));
  const cause = (err as { cause?: unknown }).cause;
  if (err.name === "TimeoutError" || (cause instanceof Error && cause.name === "TimeoutError")) {
    return new TimeoutError(`${what}: timed out`, { cause: err });
  }
  return new TransportError(`${what}: ${err.message}`, { cause: err });
}
