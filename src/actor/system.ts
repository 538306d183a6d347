// The actor system: hosts actors on nact under a root supervisor, named supervisors for
// one_for_all groups, lifecycle events, `ps`-style listing, drain and stop. The root's escalation
// ends the system with an OozeError("ACTOR_ESCALATED") that names the actor, its crashes and the
// last error.
import * as nact from "nact";
import { OozeError } from "../errors.ts";
import { SupervisorGroup, type GroupHost, type SupervisedChild } from "../supervisor/group.ts";
import { resolvePolicy, type SupervisionPolicy } from "../supervisor/policy.ts";
import { ActorCell, type CellHost } from "./cell.ts";
import type {
  ActorDefinition,
  ActorInfo,
  ActorLogger,
  ActorRef,
  EscalationListener,
  LifecycleEvent,
  LifecycleKind,
  SpawnOptions,
} from "./types.ts";

/** Options of `createSystem`. */
export interface SystemOptions {
  /** Name of the system (the job id when remoting: subjects are `ooze.<name>.…`). */
  name: string;
  /** Policy of the root supervisor (top-level actors). */
  supervision?: Partial<SupervisionPolicy>;
  /** Default ask deadline in ms (5000). */
  askTimeoutMs?: number;
  /** Where log lines go (default: stderr; debug lines only with OOZE_DEBUG=1). */
  log?: (line: string) => void;
}

/** A named supervisor: a group of actors under one policy (use it for one_for_all). */
export interface Supervisor {
  readonly path: string;
  spawn<S, M>(def: ActorDefinition<S, M>, opts?: SpawnOptions): ActorRef<M>;
  supervisor(opts: { name: string; supervision?: Partial<SupervisionPolicy> }): Supervisor;
}

/** A running actor system. */
export interface ActorSystem {
  readonly name: string;
  /** Spawns a top-level actor under the root supervisor. */
  spawn<S, M>(def: ActorDefinition<S, M>, opts?: SpawnOptions): ActorRef<M>;
  /** Creates a named supervisor under the root (its children's paths are `name/child`). */
  supervisor(opts: { name: string; supervision?: Partial<SupervisionPolicy> }): Supervisor;
  /** Ref of a local actor by path; throws ACTOR_NOT_FOUND. */
  ref<M>(path: string): ActorRef<M>;
  /** Ref to an actor in any process of the job (needs attachBus from remote.ts); throws CONFIG_INVALID without a bus. */
  remoteRef<M>(path: string): ActorRef<M>;
  /** Every live actor with status, restarts and mailbox depth. */
  list(): ActorInfo[];
  /**
   * Crashes a running local actor as if its handler had thrown (fault injection: ooze/testing's
   * `actor` fault); its supervisor restarts or escalates it. Throws ACTOR_NOT_FOUND for an unknown
   * path; false when the actor is not running (restarting, stopped).
   */
  crash(path: string, reason?: string): boolean;
  /** Subscribes to lifecycle events; returns the unsubscribe function. */
  onEvent(listener: (e: LifecycleEvent) => void): () => void;
  /** Resolves (never rejects) with the root escalation error, if the system ever escalates. */
  readonly escalation: Promise<OozeError>;
  /** The root escalation error, or null while healthy. */
  readonly failure: OozeError | null;
  /** Waits until every mailbox is empty (up to timeoutMs), then stops everything; true if drained. */
  drain(opts?: { timeoutMs?: number }): Promise<boolean>;
  /** Stops every actor (children first) and the nact system. */
  stop(): Promise<void>;
}

/** Internal view used by remoting and durable mailboxes (same package). */
export interface SystemInternals extends ActorSystem {
  readonly defaultAskTimeoutMs: number;
  cell(path: string): ActorCell<unknown, unknown> | null;
  cells(): ActorCell<unknown, unknown>[];
  /** Called when a cell is registered (added) or unregistered; returns the remover. */
  onCells(fn: (cell: ActorCell<unknown, unknown>, added: boolean) => void): () => void;
  setRemote(factory: ((path: string) => ActorRef<unknown>) | null): void;
  /** Adds an extra event sink (the bus publisher); returns its remover. */
  addSink(sink: (e: LifecycleEvent) => void): () => void;
  /** Runs before stop (remoting and durable consumers unsubscribe here). */
  beforeStop(fn: () => Promise<void>): void;
}

class SystemImpl implements SystemInternals, CellHost, GroupHost {
  readonly name: string;
  readonly path = "";
  readonly nactRoot: nact.Ref<never>;
  readonly defaultAskTimeoutMs: number;
  readonly escalation: Promise<OozeError>;
  failure: OozeError | null = null;
  private resolveEscalation: (e: OozeError) => void = () => {};
  private readonly root: SupervisorGroup;
  private readonly cellMap = new Map<string, ActorCell<unknown, unknown>>();
  private readonly listeners = new Set<(e: LifecycleEvent) => void>();
  private readonly stopHooks: (() => Promise<void>)[] = [];
  private readonly logLine: (line: string) => void;
  private stopped = false;
  private remote: ((path: string) => ActorRef<unknown>) | null = null;
  private readonly cellWatchers = new Set<(cell: ActorCell<unknown, unknown>, added: boolean) => void>();

  constructor(opts: SystemOptions) {
    this.name = opts.name;
    this.defaultAskTimeoutMs = opts.askTimeoutMs ?? 5000;
    this.logLine = opts.log ?? ((l) => process.stderr.write(`${l}\n`));
    this.nactRoot = nact.start(`ooze-${opts.name}-${Math.random().toString(36).slice(2, 8)}`);
    this.root = new SupervisorGroup(`${opts.name}:root`, resolvePolicy(opts.supervision), this, (k, c, e, d) =>
      this.groupEvents(k, c, e, d),
    );
    this.escalation = new Promise((r) => (this.resolveEscalation = r));
  }

  spawn<S, M>(def: ActorDefinition<S, M>, opts: SpawnOptions = {}): ActorRef<M> {
    this.assertLive();
    return new ActorCell<S, M>(this, this.root, def, opts, null).ref;
  }

  supervisor(opts: { name: string; supervision?: Partial<SupervisionPolicy> }): Supervisor {
    this.assertLive();
    return new NamedSupervisor(this, this.root, opts.name, null, resolvePolicy(opts.supervision));
  }

  ref<M>(path: string): ActorRef<M> {
    const c = this.cellMap.get(path);
    if (!c) {
      throw new OozeError("ACTOR_NOT_FOUND", `no actor '${path}' in system '${this.name}'; live actors: ${[...this.cellMap.keys()].join(", ") || "none"}`);
    }
    return c.ref as ActorRef<M>;
  }

  cell(path: string): ActorCell<unknown, unknown> | null {
    return this.cellMap.get(path) ?? null;
  }

  cells(): ActorCell<unknown, unknown>[] {
    return [...this.cellMap.values()];
  }

  onCells(fn: (cell: ActorCell<unknown, unknown>, added: boolean) => void): () => void {
    this.cellWatchers.add(fn);
    return () => this.cellWatchers.delete(fn);
  }

  setRemote(factory: ((path: string) => ActorRef<unknown>) | null): void {
    this.remote = factory;
  }

  remoteRef<M>(path: string): ActorRef<M> {
    if (!this.remote) {
      throw new OozeError("CONFIG_INVALID", `actor system '${this.name}' has no bus; call attachBus(system, bus) before remoteRef('${path}')`);
    }
    return this.remote(path) as ActorRef<M>;
  }

  list(): ActorInfo[] {
    return [...this.cellMap.values()].map((c) => c.info());
  }

  crash(path: string, reason = "crashed by fault injection"): boolean {
    const c = this.cellMap.get(path);
    if (!c) throw new OozeError("ACTOR_NOT_FOUND", `no actor '${path}' in system '${this.name}'; live actors: ${[...this.cellMap.keys()].join(", ") || "none"}`);
    return c.crash(new OozeError("ACTOR_CRASHED", `${path}: ${reason}`, { actor: path, retryable: true }));
  }

  onEvent(listener: (e: LifecycleEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  addSink(sink: (e: LifecycleEvent) => void): () => void {
    return this.onEvent(sink);
  }

  beforeStop(fn: () => Promise<void>): void {
    this.stopHooks.push(fn);
  }

  async drain(opts: { timeoutMs?: number } = {}): Promise<boolean> {
    const t = opts.timeoutMs ?? 10_000;
    let timer: NodeJS.Timeout | null = null;
    const deadline = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), t)));
    const idle = (async () => {
      // Handlers may tell other actors: loop until a full pass finds everything idle.
      for (;;) {
        const busy = [...this.cellMap.values()].filter((c) => c.depth > 0 || c.info().status === "restarting");
        if (busy.length === 0) break;
        // A restart is waited for on the timer, not on whenIdle: an actor restarting with an empty
        // mailbox is idle at once, and racing that made this loop a chain of microtasks that starved
        // the timers and I/O the restart itself waits on, leaving a 20 ms timer behind each pass: a
        // job's process went from 50 MB to out of memory in 30 s (docs/reliability.md, finding 19).
        const restarting = busy.some((c) => c.info().status === "restarting");
        const tick = new Promise((r) => setTimeout(r, 20));
        await (restarting ? tick : Promise.race([Promise.all(busy.map((c) => c.whenIdle())), tick]));
      }
      for (const c of this.cellMap.values()) await c.whenIdle();
      return true;
    })();
    const drained = await Promise.race([idle, deadline]);
    if (timer) clearTimeout(timer);
    await this.stop();
    return drained;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const h of this.stopHooks.splice(0).reverse()) {
      try {
        await h();
      } catch (e) {
        this.logLine(`[${this.name}] stop hook failed: ${e instanceof Error ? e.message : String(e)}`);
      }
    }
    await this.root.stopAll();
    nact.stop(this.nactRoot);
  }

  // CellHost
  register(cell: ActorCell<unknown, unknown>): void {
    this.cellMap.set(cell.path, cell);
    for (const w of this.cellWatchers) w(cell, true);
  }

  unregister(cell: ActorCell<unknown, unknown>): void {
    if (this.cellMap.get(cell.path) !== cell) return;
    this.cellMap.delete(cell.path);
    for (const w of this.cellWatchers) w(cell, false);
  }

  lifecycle(kind: LifecycleKind, actor: string, restarts: number, err: OozeError | null, delayMs: number | null): void {
    const e: LifecycleEvent = { kind, system: this.name, actor, at: Date.now(), restarts, error: err ? err.toWire() : null, delayMs };
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch (x) {
        this.logLine(`[${this.name}] event listener threw: ${x instanceof Error ? x.message : String(x)}`);
      }
    }
  }

  groupEvents(kind: "crashed" | "escalated", child: string, err: OozeError, delayMs: number | null): void {
    const c = this.cellMap.get(child);
    this.lifecycle(kind, child, c ? c.restarts : 0, err, delayMs);
    if (kind === "crashed") {
      this.logger(child).warn(`crashed: [${err.code}] ${err.message}${delayMs === null ? "" : `; restart in ${Math.round(delayMs)} ms`}`);
    }
  }

  logger(path: string): ActorLogger {
    const line = (lvl: string) => (m: string) => this.logLine(`[${this.name}/${path}] ${lvl} ${m}`);
    return {
      debug: process.env.OOZE_DEBUG ? line("debug") : () => {},
      info: line("info"),
      warn: line("warn"),
      error: line("error"),
    };
  }

  // GroupHost of the root: the end of escalation.
  fail(err: OozeError): void {
    if (this.failure) return;
    this.failure = err;
    this.logLine(`[${this.name}] ESCALATED: ${err.message}`);
    for (const c of this.cellMap.values()) c.markEscalated();
    this.resolveEscalation(err);
  }

  private assertLive(): void {
    if (this.stopped) throw new OozeError("ACTOR_STOPPED", `actor system '${this.name}' is stopped; create a new one`);
  }
}

/** A supervisor node inside the tree: a child of its parent group, the host of its own group. */
class NamedSupervisor implements Supervisor, SupervisedChild, GroupHost {
  readonly path: string;
  private readonly group: SupervisorGroup;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly sys: SystemImpl,
    private readonly parent: SupervisorGroup,
    private readonly name: string,
    parentPath: string | null,
    policy: SupervisionPolicy,
  ) {
    this.path = parentPath === null ? name : `${parentPath}/${name}`;
    if (parent.has(name)) throw new OozeError("CONFIG_INVALID", `supervisor '${this.path}' already exists; give it a unique name`);
    this.group = new SupervisorGroup(this.path, policy, this, (k, c, e, d) => sys.groupEvents(k, c, e, d));
    parent.add(name, this);
  }

  spawn<S, M>(def: ActorDefinition<S, M>, opts: SpawnOptions = {}): ActorRef<M> {
    return new ActorCell<S, M>(this.sys, this.group, def, opts, this.path).ref;
  }

  supervisor(opts: { name: string; supervision?: Partial<SupervisionPolicy> }): Supervisor {
    return new NamedSupervisor(this.sys, this.group, opts.name, this.path, resolvePolicy(opts.supervision));
  }

  restartAfter(delayMs: number): void {
    if (this.timer) clearTimeout(this.timer);
    for (const c of this.group.children) c.markEscalated();
    this.timer = setTimeout(() => {
      this.timer = null;
      this.group.tracker.reset();
      for (const c of this.group.children) c.restartAfter(0);
    }, delayMs);
  }

  markEscalated(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    for (const c of this.group.children) c.markEscalated();
  }

  fail(err: OozeError): void {
    this.parent.childFailed(this, err);
  }

  async stop(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.parent.remove(this.name);
    await this.group.stopAll();
  }
}

/** Starts an actor system. */
export function createSystem(opts: SystemOptions): ActorSystem {
  return new SystemImpl(opts);
}

/** Internal: the system behind a public handle (remoting and durable mailboxes use it). */
export function internals(system: ActorSystem): SystemInternals {
  if (!(system instanceof SystemImpl)) throw new OozeError("INTERNAL", "not an ooze ActorSystem created by createSystem()");
  return system;
}
