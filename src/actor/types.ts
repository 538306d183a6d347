// The typed actor interface of ooze: actor definitions, refs, the handler context, lifecycle events and
// the per-actor status that `ooze ps` shows. nact, which runs the mailboxes, never appears here.
import type { ZodType } from "zod";
import type { OozeError, WireError } from "../errors.ts";
import type { SupervisionPolicy } from "../supervisor/policy.ts";

/** Lifecycle state of one actor. */
export type ActorStatus = "starting" | "running" | "restarting" | "stopped" | "escalated";

/** Per-call options of `ask`. */
export interface AskOptions {
  /** Deadline in ms; when it passes the ask rejects with TimeoutError. Default 5000. */
  timeoutMs?: number;
  /**
   * The message may be handled twice (handling it again changes nothing). An ask to a remote actor
   * is then sent again when the connection is lost and comes back while it waits: the request or
   * its reply may have been lost with the connection. Other asks wait out their deadline (the reply
   * may still come). Local asks ignore it.
   */
  idempotent?: boolean;
}

/** Address of an actor, local or remote. Refs stay valid across restarts of the actor. */
export interface ActorRef<Msg> {
  /** Path of the actor: its name, or `parent/child` for children. */
  readonly path: string;
  /** Fire and forget. Never throws; a message to a stopped actor is counted as a dead letter. */
  tell(msg: Msg): void;
  /** Sends and waits for the handler's `ctx.reply(...)` (undefined when it does not reply). */
  ask<Reply = unknown>(msg: Msg, opts?: AskOptions): Promise<Reply>;
}

/** Logger handed to handlers; lines go to the system's log sink (stderr by default). */
export interface ActorLogger {
  debug(msg: string): void;
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

/** Options of a child (or top-level) spawn. */
export interface SpawnOptions {
  /** Unique among its siblings; defaults to the definition's name. */
  name?: string;
  /** Free-form configuration handed to init/handle as `ctx.config` (the topology's `config`). */
  config?: Record<string, unknown>;
}

/** What a handler can do besides returning the next state. */
export interface ActorContext<Msg> {
  readonly self: ActorRef<Msg>;
  /** Path of this actor (`name` or `parent/child`). */
  readonly path: string;
  readonly config: Record<string, unknown>;
  /** Id of the current message when it came from the bus (stable across redeliveries), else null. */
  readonly messageId: string | null;
  /** Redelivery count of a durable message (1 = first delivery), else 1. */
  readonly deliveryCount: number;
  /** Answers the current ask; ignored for a tell or after the first reply. */
  reply(value: unknown): void;
  /** Spawns a child supervised by this actor (stopped when this actor restarts or stops). */
  spawn<S, M>(def: ActorDefinition<S, M>, opts?: SpawnOptions): ActorRef<M>;
  readonly log: ActorLogger;
}

/** An actor: its name, its state's initialiser, its message handler. */
export interface ActorDefinition<State, Msg> {
  readonly name: string;
  /** Builds the state at start and at every restart. May be async; a throw counts as a crash. */
  init(ctx: ActorContext<Msg>): State | Promise<State>;
  /** Handles one message; returns the next state. A throw is a crash handled by the supervisor. */
  handle(state: State, msg: Msg, ctx: ActorContext<Msg>): State | Promise<State>;
  /** Called with the last state when the actor stops or before it restarts. Errors are logged. */
  onStop?(state: State, ctx: ActorContext<Msg>): void | Promise<void>;
  /** Validator of messages arriving from the bus (decoded and checked once at the edge). */
  readonly messages?: ZodType<Msg>;
  /** Policy for the children this actor spawns. */
  readonly supervision?: Partial<SupervisionPolicy>;
}

/** Lifecycle event kinds, as published on `names.events(actor, kind)`. */
export type LifecycleKind = "started" | "crashed" | "restarted" | "escalated" | "stopped";

/** One lifecycle event. */
export interface LifecycleEvent {
  kind: LifecycleKind;
  system: string;
  actor: string;
  /** ms since epoch */
  at: number;
  restarts: number;
  error: WireError | null;
  /** For crashed: the backoff before the restart; null when it escalates. */
  delayMs: number | null;
}

/** What `ooze ps` shows about one actor. */
export interface ActorInfo {
  path: string;
  definition: string;
  status: ActorStatus;
  restarts: number;
  crashes: number;
  /** Messages waiting in the mailbox (local; durable backlog is in JetStream). */
  mailboxDepth: number;
  processed: number;
  deadLetters: number;
  /** Frames from the bus that failed to decode or validate (dead-lettered, never handled). */
  malformed: number;
  lastError: WireError | null;
}

/** Called once when the root supervisor gives up. */
export type EscalationListener = (err: OozeError) => void;
