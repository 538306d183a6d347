// Faults as data, and the player that injects them for real: a fault schedule is a list of specs
// (kill a node process, SIGSTOP it and SIGCONT it later, restart the nats-server or one server of a
// cluster, cut a link and heal it, give an engine a fault through its fault proxy, crash one actor
// through the runtime's supervision, make a reward or agent command crash or hang, fill the disk a
// job writes to), each at a time from the start, validated with zod so a malformed spec fails
// naming its field before anything is injected.
import { z } from "zod";
import { OozeError } from "../errors.ts";
import type { NatsServerHandle } from "../transport/nats-server.ts";
import type { CutProxy } from "./cut-proxy.ts";
import type { DiskFiller } from "./disk-full.ts";
import { engineFaultSpec, type EngineFaultProxy } from "./engine-fault-proxy.ts";
import { COMMAND_FAULTS, type FaultyCommand } from "./faulty-command.ts";

const ms = z.number().int().min(0);
const name = z.string().min(1);

/** One fault. `at`: ms from the start of the schedule; `forMs`: how long it lasts before it is undone. */
export const faultSpec = z.discriminatedUnion("kind", [
  /** A signal to a node process (default SIGKILL: a crash); its supervisor is expected to restart it. */
  z.object({ kind: z.literal("kill"), target: name, at: ms, signal: z.enum(["SIGKILL", "SIGTERM", "SIGINT"]).default("SIGKILL") }).strict(),
  /** SIGSTOP a node process, SIGCONT it after forMs (a stalled process: GC pause, swapped out, debugger). */
  z.object({ kind: z.literal("pause"), target: name, at: ms, forMs: ms }).strict(),
  /**
   * The nats-server SIGKILLed and started again (same port, store and token) after downMs; with
   * `server`, that named server of a cluster (the others keep serving; a job under test on a
   * cluster also names `meta-leader`: whichever server leads JetStream's meta group then).
   */
  z.object({ kind: z.literal("nats-restart"), at: ms, downMs: ms.default(0), server: name.optional() }).strict(),
  /**
   * A cut proxy's connections reset and refused for forMs (a network partition of that link; a job
   * under test on a partitionable cluster also names `partition-sN`: server N's routes to the others).
   */
  z.object({ kind: z.literal("cut"), link: name, at: ms, forMs: ms }).strict(),
  /** An engine's fault proxy applies `fault` for forMs, then forwards everything untouched again. */
  z.object({ kind: z.literal("engine"), engine: name, at: ms, forMs: ms, fault: engineFaultSpec }).strict(),
  /** One actor crashed through the runtime, as if its handler threw; its supervisor restarts it. */
  z.object({ kind: z.literal("actor"), target: name, at: ms }).strict(),
  /** A command (reward, agent) that crashes (exits 1 at once) or hangs (never exits) for forMs. */
  z.object({ kind: z.literal("command"), command: name, at: ms, forMs: ms, fault: z.enum(COMMAND_FAULTS) }).strict(),
  /** The filesystem under a named directory filled up (writes fail with ENOSPC) for forMs. */
  z.object({ kind: z.literal("disk-full"), disk: name, at: ms, forMs: ms }).strict(),
]);

/** One fault (see faultSpec). */
export type FaultSpec = z.infer<typeof faultSpec>;

/** The kinds of fault. */
export const FAULT_KINDS = ["kill", "pause", "nats-restart", "cut", "engine", "actor", "command", "disk-full"] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

/** A schedule: `{faults: [...]}` (or just the list). */
export const faultSchedule = z.union([z.array(faultSpec), z.object({ faults: z.array(faultSpec) }).strict().transform((s) => s.faults)]);

/** Validates a schedule; a bad one throws CONFIG_INVALID naming each wrong field (`schedule.faults[2].forMs: …`). */
export function parseFaultSchedule(input: unknown, where = "schedule"): FaultSpec[] {
  const r = faultSchedule.safeParse(input);
  if (r.success) return [...r.data].sort((a, b) => a.at - b.at);
  // The union hides the list's own issues: report those of the form the input has.
  const inner = Array.isArray(input) ? z.array(faultSpec).safeParse(input) : z.object({ faults: z.array(faultSpec) }).strict().safeParse(input);
  const issues = (inner.success ? r.error : inner.error).issues.map((i) => {
    const path = i.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("");
    return `${where}${path}: ${i.message}`;
  });
  throw new OozeError("CONFIG_INVALID", `invalid fault schedule: ${issues.join("; ")}`);
}

/** What `nats-restart` does to a server: SIGKILL it, wait for it to exit, start it again. */
export type RestartableServer = {
  kill(signal?: NodeJS.Signals): void | Promise<void>;
  waitExit(): Promise<void>;
  restart(): Promise<void>;
};

/** What a schedule acts on, by the names its specs use. */
export interface FaultTargets {
  /** Node processes: the current pid of each (it changes when a supervisor restarts one), or null when none runs. */
  processes?: Record<string, () => number | null>;
  nats?: NatsServerHandle;
  /** The servers of a NATS cluster by name, for `nats-restart` with `server` (a name may pick its server when the fault comes: the cluster's `metaLeader`). */
  natsServers?: Record<string, RestartableServer>;
  /** Links that can be cut and healed: cut proxies, or anything with cut() and heal() (a test network's host link). */
  links?: Record<string, Pick<CutProxy, "cut" | "heal">>;
  engines?: Record<string, EngineFaultProxy>;
  /** Actors by name: a function that crashes it (e.g. `() => system.crash("rollout")`); false when it was not running. */
  actors?: Record<string, () => boolean | Promise<boolean>>;
  /** Commands wrapped by createFaultyCommand. */
  commands?: Record<string, FaultyCommand>;
  /** Disks (directories on a filesystem that may be filled) by name. */
  disks?: Record<string, DiskFiller>;
}

/** One thing the player did. */
export interface AppliedFault {
  /** ms from the start of the schedule. */
  at: number;
  /** Index of the spec in the (sorted) schedule. */
  index: number;
  action: string;
  ok: boolean;
  error?: string;
}

/** A schedule being played. */
export interface FaultPlayer {
  /** Resolves when every fault has been injected and undone (or the player was stopped). */
  readonly done: Promise<AppliedFault[]>;
  /** What was done so far. */
  applied(): AppliedFault[];
  /** Cancels what has not happened yet and undoes what is in effect (SIGCONT, heal, engine fault off, nats-server started). */
  stop(): Promise<AppliedFault[]>;
}

function known(m: Record<string, unknown> | undefined): string {
  const k = Object.keys(m ?? {});
  return k.length > 0 ? k.join(", ") : "none";
}

/** Checks that every name in the schedule has a target; throws CONFIG_INVALID naming the field otherwise. */
export function checkTargets(schedule: readonly FaultSpec[], t: FaultTargets, where = "schedule"): void {
  schedule.forEach((f, i) => {
    const at = `${where}[${i}]`;
    if ((f.kind === "kill" || f.kind === "pause") && !t.processes?.[f.target])
      throw new OozeError("CONFIG_INVALID", `${at}.target: no process named '${f.target}' (known: ${known(t.processes)})`);
    if (f.kind === "cut" && !t.links?.[f.link]) throw new OozeError("CONFIG_INVALID", `${at}.link: no link named '${f.link}' (known: ${known(t.links)})`);
    if (f.kind === "engine" && !t.engines?.[f.engine]) throw new OozeError("CONFIG_INVALID", `${at}.engine: no engine proxy named '${f.engine}' (known: ${known(t.engines)})`);
    if (f.kind === "nats-restart" && f.server === undefined && !t.nats) throw new OozeError("CONFIG_INVALID", `${at}.kind: 'nats-restart' needs a nats-server handle in the targets`);
    if (f.kind === "nats-restart" && f.server !== undefined && !t.natsServers?.[f.server])
      throw new OozeError("CONFIG_INVALID", `${at}.server: no nats-server named '${f.server}' (known: ${known(t.natsServers)})`);
    if (f.kind === "actor" && !t.actors?.[f.target]) throw new OozeError("CONFIG_INVALID", `${at}.target: no actor named '${f.target}' (known: ${known(t.actors)})`);
    if (f.kind === "command" && !t.commands?.[f.command]) throw new OozeError("CONFIG_INVALID", `${at}.command: no command named '${f.command}' (known: ${known(t.commands)})`);
    if (f.kind === "disk-full" && !t.disks?.[f.disk]) throw new OozeError("CONFIG_INVALID", `${at}.disk: no disk named '${f.disk}' (known: ${known(t.disks)})`);
  });
}

/**
 * Plays a schedule against real targets: each fault at its time from now, each undone after its
 * duration. Targets are checked first (nothing is injected when one is missing).
 */
export function playFaults(schedule: readonly FaultSpec[], t: FaultTargets, opts: { log?: (line: string) => void } = {}): FaultPlayer {
  checkTargets(schedule, t);
  const t0 = Date.now();
  const log: AppliedFault[] = [];
  const timers = new Set<NodeJS.Timeout>();
  const undo = new Map<number, () => Promise<void>>();
  const pending = new Set<Promise<void>>();
  let stopped = false;
  let finish!: () => void;
  const allDone = new Promise<void>((r) => (finish = r));
  let open = schedule.length;
  const settle = () => {
    if (--open === 0) finish();
  };
  if (open === 0) finish();

  const act = async (index: number, action: string, fn: () => void | Promise<void>) => {
    const entry: AppliedFault = { at: Date.now() - t0, index, action, ok: true };
    try {
      await fn();
    } catch (e) {
      entry.ok = false;
      entry.error = e instanceof Error ? e.message : String(e);
    }
    log.push(entry);
    opts.log?.(`fault ${index} at ${entry.at} ms: ${action}${entry.ok ? "" : ` failed: ${entry.error}`}`);
  };
  const later = (ms: number, fn: () => Promise<void>) => {
    if (stopped) return; // stop() undoes what is in effect itself
    const timer = setTimeout(() => {
      timers.delete(timer);
      const p = fn().finally(() => pending.delete(p));
      pending.add(p);
    }, ms);
    timers.add(timer);
  };
  const signal = (target: string, sig: NodeJS.Signals) => {
    const pid = t.processes![target]!();
    if (pid === null) throw new OozeError("ACTOR_NOT_FOUND", `process '${target}' is not running`);
    process.kill(pid, sig);
  };

  type Step = [action: string, fn: () => void | Promise<void>];
  /** Injects a fault and undoes it `ms` later (or at stop()). */
  const lasting = async (i: number, ms: number, on: Step, off: Step) => {
    await act(i, ...on);
    const undoIt = () => act(i, ...off);
    undo.set(i, undoIt);
    later(ms, async () => {
      if (undo.delete(i)) await undoIt();
      settle();
    });
  };

  schedule.forEach((f, i) => {
    later(f.at, async () => {
      if (stopped) return settle();
      switch (f.kind) {
        case "kill":
          await act(i, `${f.signal} ${f.target}`, () => signal(f.target, f.signal));
          return settle();
        case "pause": {
          const pid = t.processes![f.target]!();
          return lasting(i, f.forMs, [`SIGSTOP ${f.target}`, () => signal(f.target, "SIGSTOP")], [`SIGCONT ${f.target}`, () => void (pid !== null && process.kill(pid, "SIGCONT"))]);
        }
        case "nats-restart": {
          const nats = f.server !== undefined ? t.natsServers![f.server]! : t.nats!;
          const which = f.server !== undefined ? `nats-server ${f.server}` : "nats-server";
          const crash = async () => {
            await nats.kill("SIGKILL");
            await nats.waitExit();
          };
          return lasting(i, f.downMs, [`SIGKILL ${which}`, crash], [`restart ${which}`, () => nats.restart()]);
        }
        case "actor":
          await act(i, `crash actor ${f.target}`, async () => {
            if (!(await t.actors![f.target]!())) throw new OozeError("ACTOR_NOT_FOUND", `actor '${f.target}' was not running`);
          });
          return settle();
        case "command": {
          const cmd = t.commands![f.command]!;
          return lasting(i, f.forMs, [`command ${f.command}: ${f.fault}`, () => cmd.setFault(f.fault)], [`command ${f.command}: fault off`, () => cmd.setFault(null)]);
        }
        case "disk-full": {
          const disk = t.disks![f.disk]!;
          return lasting(i, f.forMs, [`fill disk ${f.disk}`, () => disk.fill()], [`free disk ${f.disk}`, () => disk.free()]);
        }
        case "cut": {
          const link = t.links![f.link]!;
          return lasting(i, f.forMs, [`cut ${f.link}`, () => link.cut()], [`heal ${f.link}`, () => link.heal()]);
        }
        case "engine": {
          const proxy = t.engines![f.engine]!;
          return lasting(i, f.forMs, [`engine ${f.engine}: ${f.fault.kind ?? "none"}`, () => proxy.setFault(f.fault)], [`engine ${f.engine}: fault off`, () => proxy.setFault({ kind: null })]);
        }
      }
    });
  });

  const done = allDone.then(async () => {
    await Promise.all([...pending]);
    return [...log];
  });
  return {
    done,
    applied: () => [...log],
    async stop() {
      stopped = true;
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      await Promise.all([...pending]);
      for (const [i, fn] of [...undo]) {
        undo.delete(i);
        await fn();
      }
      finish();
      return [...log];
    },
  };
}
