// The dashboard's state and its fan-out: what the page shows (a job's nodes and actors, lifecycle
// events, engines, attach/detach events, step metrics, weight versions, an opened run directory),
// kept in memory as one snapshot, with every change broadcast to the listeners (the server's
// server-sent-event streams) as a small typed update. The feeds (job-feed.ts, run-feed.ts) write
// here; nothing here touches NATS, files or HTTP.

/** One actor as `ooze ps` lists it (src/actor ActorInfo, as plain data). */
export interface DashActor {
  path: string;
  definition: string;
  status: string;
  restarts: number;
  crashes: number;
  mailboxDepth: number;
  processed: number;
  malformed: number;
  lastError: { code: string; message: string } | null;
}

/** One node (host) of the job: its actors, or why it did not answer. */
export interface DashHost {
  host: string;
  pid: number | null;
  actors: DashActor[];
  /** The node's root failure, or why `ps` got no answer. */
  error: string | null;
  /** ms since epoch of the last answer. */
  at: number;
}

/** One lifecycle event (src/actor LifecycleEvent, as plain data). */
export interface DashLifecycle {
  kind: string;
  system: string;
  actor: string;
  at: number;
  restarts: number;
  error: { code: string; message: string } | null;
}

/** One engine of the fleet (src/engine EngineEntry, as plain data). */
export interface DashEngine {
  url: string;
  healthy: boolean;
  inFlight: number;
  weightVersion: string | null;
  source: string;
  lastError: string | null;
  attachedAt: number;
  model: Record<string, unknown> | null;
  /** Requests running and waiting on the engine (its /v1/loads), or null when it did not answer. */
  load: { running: number; waiting: number } | null;
  /** Prompt tokens it served from its prefix cache, as a fraction, since it started (ooze engines' /server_info), or null. */
  cacheHitRate: number | null;
}

/** An attach or detach seen in the engines KV bucket. */
export interface DashEngineEvent {
  at: number;
  kind: "attached" | "detached";
  url: string;
  source: string | null;
}

/** One step's metrics (a metrics.jsonl line: numbers, and arrays of numbers such as staleness_hist). */
export type DashMetrics = Record<string, number | number[]>;

/** One weight version the engines serve (the versions KV record). */
export interface DashVersion {
  version: number;
  step: number;
  at: number;
  sync: { kind: "full" | "delta"; bytes: number; fullBytes: number } | null;
}

/** A run directory opened for its metrics.jsonl. */
export interface DashRun {
  dir: string;
  metrics: DashMetrics[];
  /** A readable reason when the directory or its file is missing or (partly) malformed. */
  error: string | null;
}

/** Everything the page shows. */
export interface DashSnapshot {
  job: { id: string; nats: string } | null;
  /** Why the job's bus could not be reached or read (null while fine). */
  jobError: string | null;
  hosts: Record<string, DashHost>;
  events: DashLifecycle[];
  engines: DashEngine[];
  fleetVersion: string | null;
  /** Why the fleet actor did not answer (no fleet actor in the topology, job stopping). */
  fleetError: string | null;
  engineEvents: DashEngineEvent[];
  metrics: DashMetrics[];
  versions: DashVersion[];
  run: DashRun | null;
}

/** One change, as the page receives it (the SSE event name is `type`). */
export type DashUpdate =
  | { type: "snapshot"; data: DashSnapshot }
  | { type: "job"; data: { job: DashSnapshot["job"]; jobError: string | null } }
  | { type: "host"; data: DashHost }
  | { type: "event"; data: DashLifecycle }
  | { type: "engines"; data: { engines: DashEngine[]; fleetVersion: string | null; fleetError: string | null } }
  | { type: "engine-event"; data: DashEngineEvent }
  | { type: "metrics"; data: DashMetrics }
  | { type: "version"; data: DashVersion }
  | { type: "run"; data: DashRun | null };

const MAX_EVENTS = 200;
const MAX_ENGINE_EVENTS = 100;

/** The dashboard's state with its listeners. */
export class DashHub {
  private readonly state: DashSnapshot = {
    job: null,
    jobError: null,
    hosts: {},
    events: [],
    engines: [],
    fleetVersion: null,
    fleetError: null,
    engineEvents: [],
    metrics: [],
    versions: [],
    run: null,
  };
  private readonly listeners = new Set<(u: DashUpdate) => void>();

  /** The whole state (what a page that connects gets first). */
  snapshot(): DashSnapshot {
    return this.state;
  }

  /** Calls `l` with every later update; returns the unsubscribe function. */
  listen(l: (u: DashUpdate) => void): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }

  private emit(u: DashUpdate): void {
    for (const l of this.listeners) {
      try {
        l(u);
      } catch {
        // one broken stream does not stop the others
      }
    }
  }

  setJob(job: DashSnapshot["job"], jobError: string | null): void {
    if (this.state.job?.id === job?.id && this.state.jobError === jobError) return;
    this.state.job = job;
    this.state.jobError = jobError;
    this.emit({ type: "job", data: { job, jobError } });
  }

  setHost(h: DashHost): void {
    this.state.hosts[h.host] = h;
    this.emit({ type: "host", data: h });
  }

  addEvent(e: DashLifecycle): void {
    push(this.state.events, e, MAX_EVENTS);
    this.emit({ type: "event", data: e });
  }

  setEngines(engines: DashEngine[], fleetVersion: string | null, fleetError: string | null): void {
    this.state.engines = engines;
    this.state.fleetVersion = fleetVersion;
    this.state.fleetError = fleetError;
    this.emit({ type: "engines", data: { engines, fleetVersion, fleetError } });
  }

  addEngineEvent(e: DashEngineEvent): void {
    push(this.state.engineEvents, e, MAX_ENGINE_EVENTS);
    this.emit({ type: "engine-event", data: e });
  }

  /** Adds a step's metrics (a step seen again, e.g. after a reconnect, replaces the earlier record). */
  addMetrics(m: DashMetrics): void {
    const step = m.step;
    const i = this.state.metrics.findIndex((x) => x.step === step);
    if (i >= 0) this.state.metrics[i] = m;
    else this.state.metrics.push(m);
    this.emit({ type: "metrics", data: m });
  }

  /** Adds a version record (one already seen is ignored: versions only move forward). */
  addVersion(v: DashVersion): void {
    if (this.state.versions.some((x) => x.version === v.version && x.step === v.step)) return;
    this.state.versions.push(v);
    this.emit({ type: "version", data: v });
  }

  setRun(run: DashRun | null): void {
    this.state.run = run;
    this.emit({ type: "run", data: run });
  }
}

function push<T>(xs: T[], x: T, max: number): void {
  xs.push(x);
  if (xs.length > max) xs.splice(0, xs.length - max);
}
