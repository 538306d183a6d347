// A supervisor: a group of children under one restart policy (one_for_one or one_for_all). On a
// child's crash it asks its RestartTracker whether to restart (after a backoff) or to escalate to
// its host — the actor, named supervisor or system that owns the group.
import type { OozeError } from "../errors.ts";
import { escalationError, RestartTracker, type PolicyClock, type SupervisionPolicy, REAL_CLOCK } from "./policy.ts";

/** What a supervisor needs from a child (an actor cell or a nested supervisor). */
export interface SupervisedChild {
  readonly path: string;
  /** Stops processing now, restarts with fresh state after `delayMs`. Repeated calls re-arm the timer. */
  restartAfter(delayMs: number): void;
  /** Stops processing because its supervisor gave up; a later restartAfter revives it. */
  markEscalated(): void;
  /** Final stop. */
  stop(): Promise<void>;
}

/** The owner of a group: receives the group's escalation. */
export interface GroupHost {
  readonly path: string;
  fail(err: OozeError): void;
}

/** Event sink of a group: "crashed" with the restart delay (null when escalating), "escalated". */
export type GroupEventSink = (kind: "crashed" | "escalated", child: string, err: OozeError, delayMs: number | null) => void;

/** One supervisor: its children, policy and restart window. */
export class SupervisorGroup {
  readonly path: string;
  readonly policy: SupervisionPolicy;
  readonly tracker: RestartTracker;
  private readonly host: GroupHost;
  private readonly emit: GroupEventSink;
  private readonly kids = new Map<string, SupervisedChild>();

  constructor(path: string, policy: SupervisionPolicy, host: GroupHost, emit: GroupEventSink, clock: PolicyClock = REAL_CLOCK) {
    this.path = path;
    this.policy = policy;
    this.host = host;
    this.emit = emit;
    this.tracker = new RestartTracker(policy, clock);
  }

  /** Children in spawn order. */
  get children(): SupervisedChild[] {
    return [...this.kids.values()];
  }

  has(name: string): boolean {
    return this.kids.has(name);
  }

  add(name: string, child: SupervisedChild): void {
    this.kids.set(name, child);
  }

  remove(name: string): void {
    this.kids.delete(name);
  }

  /** A child crashed with `err`: restart it (or all, for one_for_all) after a backoff, or escalate. */
  childFailed(child: SupervisedChild, err: OozeError): void {
    const d = this.tracker.onCrash(err);
    if (d.kind === "restart") {
      this.emit("crashed", child.path, err, d.delayMs);
      const targets = this.policy.strategy === "one_for_all" ? this.children : [child];
      for (const c of targets) c.restartAfter(d.delayMs);
      return;
    }
    this.emit("crashed", child.path, err, null);
    for (const c of this.children) c.markEscalated();
    const e = escalationError(this.path, child.path, d, this.policy, err);
    this.emit("escalated", child.path, e, null);
    this.host.fail(e);
  }

  /** Stops every child (final) and forgets them. */
  async stopAll(): Promise<void> {
    const all = [...this.kids.values()].reverse();
    this.kids.clear();
    for (const c of all) await c.stop();
  }
}
