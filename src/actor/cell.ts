// One hosted actor: a nact actor that runs its mailbox one message at a time, wrapped so that ooze —
// not nact — owns the state, the restart semantics and the reply/ask bookkeeping. Handler errors
// never reach nact; they go to the cell's supervisor group, which restarts (re-running `init`,
// keeping the mailbox and the ref) or escalates.
import * as nact from "nact";
import { OozeError, TimeoutError, type WireError } from "../errors.ts";
import { SupervisorGroup, type GroupHost, type SupervisedChild } from "../supervisor/group.ts";
import { crashError, resolvePolicy } from "../supervisor/policy.ts";
import type {
  ActorContext,
  ActorDefinition,
  ActorInfo,
  ActorLogger,
  ActorRef,
  ActorStatus,
  AskOptions,
  LifecycleKind,
  SpawnOptions,
} from "./types.ts";

/** Delivery metadata of a message that came from the bus. */
export interface DeliveryMeta {
  messageId: string | null;
  deliveryCount: number;
}

/** What a cell needs from the system that hosts it. */
export interface CellHost {
  readonly name: string;
  readonly nactRoot: nact.Ref<never>;
  readonly defaultAskTimeoutMs: number;
  register(cell: ActorCell<unknown, unknown>): void;
  unregister(cell: ActorCell<unknown, unknown>): void;
  lifecycle(kind: LifecycleKind, actor: string, restarts: number, err: OozeError | null, delayMs: number | null): void;
  logger(path: string): ActorLogger;
  groupEvents(kind: "crashed" | "escalated", child: string, err: OozeError, delayMs: number | null): void;
}

interface Envelope {
  msg: unknown;
  meta: DeliveryMeta;
  settle: ((err: OozeError | null, value: unknown) => void) | null;
  settled: boolean;
}

const NO_META: DeliveryMeta = { messageId: null, deliveryCount: 1 };

/** A live actor. Internal: users hold ActorRefs. */
export class ActorCell<S, M> implements SupervisedChild, GroupHost {
  readonly path: string;
  readonly name: string;
  readonly def: ActorDefinition<S, M>;
  readonly config: Record<string, unknown>;
  readonly ref: ActorRef<M>;
  readonly children: SupervisorGroup;
  status: ActorStatus = "starting";
  restarts = 0;
  crashes = 0;
  processed = 0;
  deadLetters = 0;
  malformed = 0;
  depth = 0;
  lastError: WireError | null = null;
  private state: S | undefined = undefined;
  private initialized = false;
  private generation = 0;
  private gate: Promise<void> | null = null;
  private openGate: () => void = () => {};
  private timer: NodeJS.Timeout | null = null;
  private busy = false;
  private readonly pending = new Set<Envelope>();
  private idleWaiters: (() => void)[] = [];
  private readonly nactRef: nact.Ref<Envelope>;
  private readonly host: CellHost;
  private readonly parent: SupervisorGroup;
  private readonly log: ActorLogger;

  constructor(host: CellHost, parent: SupervisorGroup, def: ActorDefinition<S, M>, opts: SpawnOptions, parentPath: string | null) {
    this.host = host;
    this.parent = parent;
    this.def = def;
    this.name = opts.name ?? def.name;
    this.path = parentPath === null ? this.name : `${parentPath}/${this.name}`;
    this.config = opts.config ?? {};
    this.log = host.logger(this.path);
    if (parent.has(this.name)) {
      throw new OozeError("CONFIG_INVALID", `actor '${this.path}' already exists in system '${host.name}'; give each actor a unique name`);
    }
    this.children = new SupervisorGroup(this.path, resolvePolicy(def.supervision), this, (k, c, e, d) =>
      host.groupEvents(k, c, e, d),
    );
    const self = this;
    this.ref = {
      path: this.path,
      tell: (msg: M) => self.enqueue({ msg, meta: NO_META, settle: null, settled: false }),
      ask: <R>(msg: M, o?: AskOptions) => self.ask(msg, NO_META, o?.timeoutMs) as Promise<R>,
    };
    this.nactRef = nact.spawn(
      host.nactRoot,
      async (_s: undefined, env: Envelope) => {
        await self.process(env);
        return undefined;
      },
      `${this.path.replace(/\//g, "__")}-${Math.random().toString(36).slice(2, 8)}`,
      // Errors never reach nact (process() catches everything); resume keeps the mailbox running if one did.
      { onCrash: (_m, _e, ctx) => ctx.resume },
    ) as nact.Ref<Envelope>;
    parent.add(this.name, this);
    host.register(this as ActorCell<unknown, unknown>);
    this.closeGate();
    void this.runInit(this.generation, false);
  }

  /** Sends a message with delivery metadata and waits for the handler to finish (reply or crash). */
  ask(msg: M, meta: DeliveryMeta, timeoutMs?: number): Promise<unknown> {
    const t = timeoutMs ?? this.host.defaultAskTimeoutMs;
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | null = null;
      const env: Envelope = {
        msg,
        meta,
        settled: false,
        settle: (err, value) => {
          if (timer) clearTimeout(timer);
          if (err) reject(err);
          else resolve(value);
        },
      };
      if (t > 0 && Number.isFinite(t)) {
        timer = setTimeout(
          () =>
            this.settle(
              env,
              new TimeoutError(`ask to actor '${this.path}' got no reply within ${t} ms; the actor is ${this.status}`, {
                actor: this.path,
              }),
              undefined,
            ),
          t,
        );
      }
      this.enqueue(env);
    });
  }

  /** Fire and forget with delivery metadata (a tell that came from the bus). */
  tellWithMeta(msg: M, meta: DeliveryMeta): void {
    this.enqueue({ msg, meta, settle: null, settled: false });
  }

  /** Snapshot for `ooze ps`. */
  info(): ActorInfo {
    return {
      path: this.path,
      definition: this.def.name,
      status: this.status,
      restarts: this.restarts,
      crashes: this.crashes,
      mailboxDepth: this.depth,
      processed: this.processed,
      deadLetters: this.deadLetters,
      malformed: this.malformed,
      lastError: this.lastError,
    };
  }

  /** Resolves when the mailbox is empty and no handler runs. */
  whenIdle(): Promise<void> {
    if (this.depth === 0 && !this.busy) return Promise.resolve();
    return new Promise((r) => this.idleWaiters.push(r));
  }

  restartAfter(delayMs: number): void {
    if (this.status === "stopped") return;
    this.status = "restarting";
    this.generation++;
    this.closeGate();
    if (this.timer) clearTimeout(this.timer);
    const gen = this.generation;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.restartNow(gen);
    }, delayMs);
  }

  markEscalated(): void {
    if (this.status === "stopped") return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.generation++;
    this.status = "escalated";
    void this.children.stopAll();
    this.rejectPending("escalated");
    this.openGate();
  }

  /**
   * Crashes this actor from outside, as if its handler had thrown `err` (fault injection): its
   * supervisor restarts or escalates it by its policy. False when it is not running.
   */
  crash(err: OozeError): boolean {
    if (this.status !== "running") return false;
    this.noteCrash(err);
    this.parent.childFailed(this, err);
    return true;
  }

  fail(err: OozeError): void {
    // A grandchild's escalation reached this actor's own supervisor group: this actor failed.
    this.noteCrash(err);
    this.parent.childFailed(this, err);
  }

  async stop(): Promise<void> {
    if (this.status === "stopped") return;
    const wasRunning = this.initialized;
    this.status = "stopped";
    this.generation++;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.openGate();
    await this.children.stopAll();
    if (wasRunning) await this.callOnStop();
    this.rejectPending("stopped");
    this.parent.remove(this.name);
    this.host.unregister(this as ActorCell<unknown, unknown>);
    nact.stop(this.nactRef);
    this.depth = 0;
    this.wakeIdle();
    this.host.lifecycle("stopped", this.path, this.restarts, null, null);
  }

  private enqueue(env: Envelope): void {
    if (this.status === "stopped") {
      this.deadLetters++;
      this.settle(env, new OozeError("ACTOR_STOPPED", `actor '${this.path}' is stopped; message not delivered`, { actor: this.path }), undefined);
      return;
    }
    if (env.settle) this.pending.add(env);
    this.depth++;
    nact.dispatch(this.nactRef, env);
  }

  private settle(env: Envelope, err: OozeError | null, value: unknown): void {
    if (env.settled) return;
    env.settled = true;
    this.pending.delete(env);
    env.settle?.(err, value);
  }

  private rejectPending(why: "stopped" | "escalated"): void {
    for (const env of [...this.pending]) {
      if (this.busy && env === this.current) continue;
      this.settle(env, new OozeError("ACTOR_STOPPED", `actor '${this.path}' ${why} before handling the message`, { actor: this.path }), undefined);
    }
  }

  private current: Envelope | null = null;

  private async process(env: Envelope): Promise<void> {
    this.depth = Math.max(0, this.depth - 1);
    while (this.gate) await this.gate;
    if (this.status === "stopped" || this.status === "escalated" || env.settled) {
      if (!env.settled && env.settle === null) this.deadLetters++;
      this.settle(env, new OozeError("ACTOR_STOPPED", `actor '${this.path}' is ${this.status}; message not handled`, { actor: this.path }), undefined);
      this.wakeIdle();
      return;
    }
    this.busy = true;
    this.current = env;
    const gen = this.generation;
    let replied = false;
    let reply: unknown = undefined;
    try {
      const ctx = this.context(env.meta, (v) => {
        if (!replied) {
          replied = true;
          reply = v;
        }
      });
      const next = await this.def.handle(this.state as S, env.msg as M, ctx);
      if (gen === this.generation) this.state = next;
      this.processed++;
      this.settle(env, null, reply);
    } catch (e) {
      const err = crashError(e, this.path);
      this.settle(env, err, undefined);
      if (gen === this.generation && this.status === "running") {
        this.noteCrash(err);
        this.parent.childFailed(this, err);
      }
    } finally {
      this.busy = false;
      this.current = null;
      this.wakeIdle();
    }
  }

  private noteCrash(err: OozeError): void {
    this.crashes++;
    this.lastError = err.toWire();
  }

  private async restartNow(gen: number): Promise<void> {
    if (gen !== this.generation || this.status === "stopped") return;
    await this.children.stopAll();
    this.children.tracker.reset();
    if (this.initialized) await this.callOnStop();
    this.restarts++;
    await this.runInit(gen, true);
  }

  private async runInit(gen: number, restart: boolean): Promise<void> {
    this.initialized = false;
    try {
      const s = await this.def.init(this.context(NO_META, () => {}));
      if (gen !== this.generation || this.status === "stopped") {
        // Stopped or restarted while init ran: nothing will call onStop for this state, so release
        // what init started (consumers, timers, clients) now. Without this a job stopped while an
        // actor was still starting kept that actor's loops alive and its process never exited
        // (found by test/property/job-process-schedules).
        if (this.def.onStop) {
          try {
            await this.def.onStop(s, this.context(NO_META, () => {}));
          } catch (e) {
            this.log.warn(`onStop after an abandoned init threw: ${e instanceof Error ? e.message : String(e)}`);
          }
        }
        return;
      }
      this.state = s;
      this.initialized = true;
      this.status = "running";
      this.host.lifecycle(restart ? "restarted" : "started", this.path, this.restarts, null, null);
      this.openGate();
    } catch (e) {
      if (gen !== this.generation || this.status === "stopped") return;
      const err = crashError(e, this.path);
      this.noteCrash(err);
      this.status = "restarting";
      this.parent.childFailed(this, err);
    }
  }

  private async callOnStop(): Promise<void> {
    if (!this.def.onStop) return;
    try {
      await this.def.onStop(this.state as S, this.context(NO_META, () => {}));
    } catch (e) {
      this.log.warn(`onStop threw: ${e instanceof Error ? e.message : String(e)}`);
    }
  }

  private context(meta: DeliveryMeta, reply: (v: unknown) => void): ActorContext<M> {
    return {
      self: this.ref,
      path: this.path,
      config: this.config,
      messageId: meta.messageId,
      deliveryCount: meta.deliveryCount,
      reply,
      spawn: <S2, M2>(def: ActorDefinition<S2, M2>, opts: SpawnOptions = {}) =>
        new ActorCell<S2, M2>(this.host, this.children, def, opts, this.path).ref,
      log: this.log,
    };
  }

  private closeGate(): void {
    if (this.gate) return;
    this.gate = new Promise((r) => {
      this.openGate = () => {
        this.gate = null;
        r();
      };
    });
  }

  private wakeIdle(): void {
    if (this.depth !== 0 || this.busy) return;
    const w = this.idleWaiters;
    this.idleWaiters = [];
    for (const f of w) f();
  }
}
