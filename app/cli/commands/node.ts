// `ooze node --nats URL --topology FILE --host NAME`: runs the actors a topology places on one host.
// `ooze up` starts one per local host; on other machines a person (or a service manager) runs it,
// so one topology spans several processes or hosts. Exits 0 after `down`, 1 after an escalation.
import type { Command } from "commander";
import { resolveKind } from "../../job/kinds.ts";
import { watchParent } from "../parent.ts";
import { loadTopology } from "../../../src/topology/load.ts";
import { startNode } from "../../../src/topology/node.ts";
import { connectBus, resolveNatsUrl, resolveReplicas } from "../../../src/transport/bus.ts";
import { jobNames } from "../../../src/transport/names.ts";
import { OozeError } from "../../../src/errors.ts";

interface NodeOptions {
  nats?: string;
  replicas?: string;
  topology: string;
  host: string;
  job?: string;
  parentPid?: string;
}

export function register(program: Command) {
  program
    .command("node")
    .description("run the actors of one host of a topology (joins a running job over NATS)")
    .requiredOption("--topology <file>", "topology YAML file")
    .requiredOption("--host <name>", "which of the topology's hosts this process is")
    .option("--nats <urls>", "NATS server of the job (nats://token@host:port, or a cluster's servers comma-separated; or OOZE_NATS_URL with OOZE_NATS_TOKEN, or OOZE_NATS_USER and OOZE_NATS_PASSWORD)")
    .option("--replicas <n>", "replicas of the streams, KV buckets and object stores it creates (default 1; 3 with three or more --nats servers)")
    .option("--job <name>", "job id (default: the topology's name)")
    .option("--parent-pid <pid>", "exit when this process is gone (set by ooze up)")
    .action(async (opts: NodeOptions) => {
      // Exit once stopped with the bus closed, not when the event loop empties: a timer a library
      // left armed must not keep a stopped node running (docs/reliability.md, finding 10).
      process.exit(await runNodeCommand(opts));
    });
}

async function runNodeCommand(opts: NodeOptions): Promise<number> {
  const topology = loadTopology(opts.topology);
  const job = opts.job ?? topology.name;
  const target = resolveNatsUrl(opts.nats, process.env, topology.nats);
  if (!target) throw new OozeError("CONFIG_INVALID", "ooze node needs a NATS server: pass --nats nats://TOKEN@HOST:PORT or set OOZE_NATS_URL");
  const log = (line: string) => process.stderr.write(`[${opts.host}] ${line}\n`);
  const replicas = resolveReplicas(target.url, false, opts.replicas, topology.nats.replicas);
  const auth = target.user !== null && target.pass !== null ? { user: target.user, pass: target.pass } : target.token ? { token: target.token } : {};
  // Replies come back under the job's own subjects (names.inbox), all a node's NATS user may subscribe to.
  const bus = await connectBus({ url: target.url, ...auth, name: `ooze-node-${job}-${opts.host}`, largeBucket: jobNames(job).objLarge, inboxPrefix: jobNames(job).inbox, replicas });
  // A call the node's NATS user may not make fails at once; say so here too (with the subject), not only as the caller's error.
  bus.onStatus((s) => {
    if (s.type === "error" && /permissions violation/i.test(s.detail)) log(`NATS refused: ${s.detail}`);
  });
  const node = await startNode({ topology, host: opts.host, job, bus, resolveKind, log });
  log(`running ${node.actors.map((a) => a.path).join(", ") || "no actors"} (pid ${process.pid})${node.metricsUrl ? `; metrics ${node.metricsUrl}` : ""}`);
  const stop = () => void node.stop();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  if (opts.parentPid)
    watchParent(Number(opts.parentPid), () => {
      log(`parent ${opts.parentPid} is gone; stopping`);
      stop();
    });
  const result = await node.stopped;
  await bus.close();
  if (result.error) log(result.error.message);
  return result.reason === "escalated" ? 1 : 0;
}
