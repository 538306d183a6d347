// `ooze dash [--job ID] [--port N] [--run DIR]`: the dashboard of a running job (found like `ooze ps`
// finds it, or through --nats) and/or of a run directory, on 127.0.0.1 with a generated token; it
// prints the URL to open (token included) and runs until Ctrl-C. `dashFromTopology` is what
// `ooze up --dash` and `ooze train --dash` (or `dash: true` in the topology) use.
import { dirname, resolve } from "node:path";
import type { Command } from "commander";
import { startDash, type Dash } from "../../dash/index.ts";
import { OozeError } from "../../../src/errors.ts";
import { loadTopology } from "../../../src/topology/load.ts";
import type { Topology } from "../../../src/topology/schema.ts";
import { connectBus, resolveNatsUrl, type Bus } from "../../../src/transport/bus.ts";
import { jobNames } from "../../../src/transport/names.ts";
import { findJob, listJobs, recordAuth } from "../job-records.ts";

/** The port `ooze dash` tries first when none is given (any free one when it is taken). */
export const DEFAULT_DASH_PORT = 8787;

interface DashOptions {
  job?: string;
  nats?: string;
  hosts?: string;
  port?: string;
  host?: string;
  run?: string;
  fleetActor: string;
}

function portOf(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535) throw new OozeError("CONFIG_INVALID", `--port must be an integer from 0 to 65535 (got '${v}')`);
  return n;
}

/**
 * Starts a dashboard on `port` if given, else on DEFAULT_DASH_PORT or, when that is taken, any free
 * port; prints its URL with `say`.
 */
export async function startDashAt(o: Omit<Parameters<typeof startDash>[0], "port"> & { port?: number | undefined }, say: (line: string) => void): Promise<Dash> {
  const { port, ...rest } = o;
  let dash: Dash;
  try {
    dash = await startDash({ ...rest, port: port ?? DEFAULT_DASH_PORT });
  } catch (e) {
    if (port !== undefined || !(e instanceof OozeError && e.code === "CONFIG_INVALID")) throw e;
    dash = await startDash({ ...rest, port: 0 });
  }
  say(`dashboard: ${dash.url}`);
  return dash;
}

/**
 * The run directory of a topology's trainer actor (its config's `out`, relative to the topology
 * file, `{job}` filled in): where the trajectory explorer reads a live job's episodes; undefined
 * without a trainer.
 */
export function trainerOutOf(topology: Topology, job: string): string | undefined {
  const trainer = topology.actors.find((a) => a.kind === "train.trainer");
  const out = trainer?.config.out;
  if (typeof out !== "string") return undefined;
  return resolve(topology.file ? dirname(topology.file) : process.cwd(), out.replaceAll("{job}", job));
}

/**
 * The dashboard a topology asks for (`dash:` in it, or --dash / --dash-port on the command line), for
 * `ooze up` and `ooze train`; null when none is asked for.
 */
export async function dashFromTopology(
  topology: Topology,
  flags: { dash?: boolean; dashPort?: string },
  job: { bus: Bus; id: string; hosts: string[] },
  extra: { runDir?: string; explorerDir?: string; log?: (line: string) => void },
  say: (line: string) => void,
): Promise<Dash | null> {
  const spec = topology.dash;
  const wanted = flags.dash === true || flags.dashPort !== undefined || spec === true || (typeof spec === "object" && spec !== null);
  if (!wanted) return null;
  const fromSpec = typeof spec === "object" && spec !== null ? spec : {};
  const port = flags.dashPort !== undefined ? portOf(flags.dashPort) : fromSpec.port;
  const explorerDir = extra.explorerDir ?? trainerOutOf(topology, job.id);
  return startDashAt(
    {
      job, ...(fromSpec.host !== undefined ? { host: fromSpec.host } : {}), port, ...(extra.runDir !== undefined ? { runDir: extra.runDir } : {}),
      ...(explorerDir !== undefined ? { explorerDir } : {}), ...(extra.log ? { log: extra.log } : {}),
    },
    say,
  );
}

export function register(program: Command) {
  program
    .command("dash")
    .description("a dashboard of a running job (actors, engines, learning curves, weight sync) and/or of a run directory, in a browser")
    .option("--job <name>", "job id (default: the newest running job)")
    .option("--nats <url>", "reach the job through this NATS server (nats://token@host:port) instead of its job record; needs --job and --hosts")
    .option("--hosts <names>", "with --nats: the job's hosts (node names), comma-separated", "main")
    .option("--port <n>", `port to listen on (default ${DEFAULT_DASH_PORT}, or any free one when it is taken)`)
    .option("--host <addr>", "address to listen on", "127.0.0.1")
    .option("--run <dir>", "a run directory whose metrics.jsonl to show (also after its job ended)")
    .option("--fleet-actor <name>", "name of the job's fleet actor", "fleet")
    .action(async (opts: DashOptions) => {
      const say = (line: string) => console.log(`ooze ${line}`);
      const target = resolveNatsUrl(opts.nats);
      let rec: { job: string; natsUrl: string; token: string | null; user?: string | null; password?: string | null; hosts: string[]; topology?: string | null } | null = null;
      if (target) {
        if (opts.job === undefined) throw new OozeError("CONFIG_INVALID", "ooze dash: --nats (or OOZE_NATS_URL) needs --job NAME");
        rec = { job: opts.job, natsUrl: target.url, token: target.token, user: target.user, password: target.pass, hosts: (opts.hosts ?? "main").split(",").map((h) => h.trim()).filter(Boolean) };
      } else if (opts.job !== undefined || opts.run === undefined) {
        if (opts.job === undefined && opts.run === undefined && listJobs().length === 0)
          throw new OozeError("ACTOR_NOT_FOUND", "ooze dash: no running ooze job found; start one with 'ooze up FILE', or pass --run DIR to show a run directory");
        rec = findJob(opts.job);
      } else if (listJobs().length > 0) rec = findJob();
      let bus: Bus | null = null;
      if (rec) {
        bus = await connectBus({ url: rec.natsUrl, ...recordAuth(rec), name: "ooze-dash", largeBucket: jobNames(rec.job).objLarge });
        say(`dash: job ${rec.job} (nats ${rec.natsUrl}, hosts ${rec.hosts.join(", ")})`);
      }
      const dash = await startDashAt(
        {
          host: opts.host ?? "127.0.0.1",
          port: opts.port !== undefined ? portOf(opts.port) : undefined,
          fleetActor: opts.fleetActor,
          ...(rec && bus ? { job: { bus, id: rec.job, hosts: rec.hosts } } : {}),
          ...(opts.run !== undefined ? { runDir: opts.run } : {}),
          ...explorerDirOf(rec),
          log: (l) => console.error(`ooze ${l}`),
        },
        say,
      );
      await new Promise<void>((resolve) => {
        process.once("SIGINT", resolve);
        process.once("SIGTERM", resolve);
      });
      await dash.close();
      await bus?.close();
    });
}

/** The live job's run directory for the explorer: its trainer's `out`, from the topology its job record names. */
function explorerDirOf(rec: { job: string; topology?: string | null } | null): { explorerDir?: string } {
  if (!rec?.topology) return {};
  try {
    const dir = trainerOutOf(loadTopology(rec.topology), rec.job);
    return dir !== undefined ? { explorerDir: dir } : {};
  } catch {
    return {}; // the topology file moved or changed: the explorer reads opened run directories only
  }
}
