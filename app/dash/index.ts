// The dashboard, put together: a hub, the HTTP server, a running job's feed (when a bus and job are
// given) and a run directory's feed (--run DIR, or a directory opened on the page). `ooze dash`,
// `ooze up --dash` and `ooze train --dash` all start it through startDash.
import { askJobFleet } from "../../actors/protocol/fleet-messages.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { OozeError } from "../../src/errors.ts";
import { ExplorerReader } from "./explorer.ts";
import { DashHub } from "./hub.ts";
import { followJob, type JobFeed } from "./job-feed.ts";
import { followRun, type RunFeed } from "./run-feed.ts";
import { startDashServer } from "./server.ts";

export { DashHub } from "./hub.ts";
export { startDashServer } from "./server.ts";

/** Options of startDash. */
export interface DashOptions {
  /** The job to follow live: its bus, id and hosts (node names). */
  job?: { bus: Bus; id: string; hosts: string[] };
  /** A run directory whose metrics.jsonl is shown (and followed). */
  runDir?: string;
  /** The live job's run directory (the trainer's `out`): what the trajectory explorer reads for the job. */
  explorerDir?: string;
  /** Bind address (default 127.0.0.1) and port (default 0: any free one). */
  host?: string;
  port?: number;
  /** Access token (default generated). */
  token?: string;
  /** The job's fleet actor (default "fleet"). */
  fleetActor?: string;
  /** Deadline of an attach or detach, ms (default 60 s). */
  engineTimeoutMs?: number;
  /** Refresh of `ps` and the fleet list, ms (default 2 s). */
  refreshMs?: number;
  log?: (line: string) => void;
}

/** A running dashboard. */
export interface Dash {
  /** The URL to open, token included. */
  readonly url: string;
  readonly port: number;
  readonly token: string;
  readonly hub: DashHub;
  /** Stops the feeds and the server (the bus stays open: it is the caller's). */
  close(): Promise<void>;
}

/** Starts the dashboard. */
export async function startDash(o: DashOptions): Promise<Dash> {
  const hub = new DashHub();
  const fleetActor = o.fleetActor ?? "fleet";
  let run = null as RunFeed | null;
  const openRun = async (dir: string) => {
    run?.stop();
    run = followRun(dir, (r) => hub.setRun({ ...r, metrics: [...r.metrics] }));
    hub.setRun({ ...run.run, metrics: [...run.run.metrics] });
    return { dir: run.run.dir, steps: run.run.metrics.length, error: run.run.error };
  };
  if (o.runDir !== undefined) await openRun(o.runDir);
  const explorer = new ExplorerReader();
  const explorerRun = (source: "run" | "live"): string => {
    const dir = source === "run" ? (run?.run.dir ?? o.explorerDir) : (o.explorerDir ?? run?.run.dir);
    if (dir === undefined) throw new OozeError("ACTOR_NOT_FOUND", "no run directory to explore: open one (the field above the curves, or ooze dash --run DIR)");
    return dir;
  };
  const job = o.job;
  const timeoutMs = o.engineTimeoutMs ?? 60_000;
  let feed: JobFeed | null = null;
  if (job) feed = await followJob({ bus: job.bus, job: job.id, hosts: job.hosts, hub, fleetActor, ...(o.refreshMs !== undefined ? { refreshMs: o.refreshMs } : {}), ...(o.log ? { log: o.log } : {}) });
  try {
    const server = await startDashServer({
      hub,
      ...(o.host !== undefined ? { host: o.host } : {}),
      ...(o.port !== undefined ? { port: o.port } : {}),
      ...(o.token !== undefined ? { token: o.token } : {}),
      actions: {
        attach: job ? (url) => askJobFleet(job.bus, job.id, fleetActor, { op: "attach", url, source: "runtime" }, timeoutMs) : null,
        detach: job ? (url) => askJobFleet(job.bus, job.id, fleetActor, { op: "detach", url }, timeoutMs) : null,
        openRun,
        explorer: {
          table: (source) => explorer.table(explorerRun(source)),
          episode: (source, step, index) => explorer.episode(explorerRun(source), step, index),
        },
      },
    });
    return {
      url: server.url,
      port: server.port,
      token: server.token,
      hub,
      async close() {
        run?.stop();
        await feed?.stop();
        await server.close();
      },
    };
  } catch (e) {
    run?.stop();
    await feed?.stop();
    throw e;
  }
}
