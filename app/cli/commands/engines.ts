// `ooze engines attach|detach|list`: changes and shows a running job's engine fleet from another
// terminal, by asking the job's fleet actor over NATS.
import type { Command } from "commander";
import type { EngineEntry } from "../../../src/engine/fleet/fleet.ts";
import { OozeError } from "../../../src/errors.ts";
import { connectBus, resolveNatsUrl } from "../../../src/transport/bus.ts";
import { jobNames } from "../../../src/transport/names.ts";
import { askJobFleet, type FleetMsg } from "../../../actors/protocol/fleet-messages.ts";
import { findJob, recordAuth } from "../job-records.ts";

interface EnginesOptions {
  job?: string;
  nats?: string;
  actor: string;
  json?: boolean;
  timeout: string;
}

/** Asks the fleet actor of a running job; clear errors when there is no job or no fleet actor. */
async function ask(opts: EnginesOptions, msg: FleetMsg) {
  const target = resolveNatsUrl(opts.nats);
  let rec: { job: string; natsUrl: string; token: string | null; user?: string | null; password?: string | null };
  if (target) {
    if (opts.job === undefined) throw new OozeError("CONFIG_INVALID", "ooze engines: --nats (or OOZE_NATS_URL) needs --job NAME");
    rec = { job: opts.job, natsUrl: target.url, token: target.token, user: target.user, password: target.pass };
  } else rec = findJob(opts.job);
  const bus = await connectBus({ url: rec.natsUrl, ...recordAuth(rec), name: "ooze-engines", largeBucket: jobNames(rec.job).objLarge });
  try {
    return { job: rec.job, reply: await askJobFleet(bus, rec.job, opts.actor, msg, Number(opts.timeout) * 1000) };
  } finally {
    await bus.close().catch(() => {});
  }
}

function printEngines(job: string, engines: EngineEntry[], version: string | null): void {
  console.log(`job ${job}: ${engines.length} engines${version ? `, fleet weight version ${version}` : ""}`);
  const rows = [["URL", "HEALTHY", "IN-FLIGHT", "VERSION", "SOURCE", "LAST ERROR"]];
  for (const e of engines) rows.push([e.url, e.healthy ? "yes" : "no", String(e.inFlight), e.weightVersion ?? "-", e.source, e.lastError ?? ""]);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const r of rows) console.log(r.map((c, i) => c.padEnd(widths[i]!)).join("  ").trimEnd());
}

export function register(program: Command) {
  const engines = program.command("engines").description("attach, detach and list the inference engines of a running job");
  const common = (c: Command) =>
    c
      .option("--job <name>", "job id (default: the newest running job)")
      .option("--nats <url>", "reach the job through this NATS server (nats://token@host:port) instead of its job record")
      .option("--actor <name>", "name of the fleet actor", "fleet")
      .option("--timeout <seconds>", "deadline of the request", "60")
      .option("--json", "print JSON");

  common(engines.command("attach").argument("<url>", "engine URL, e.g. http://10.0.0.5:30000").description("attach an SGLang-compatible engine to the job's fleet")).action(
    async (url: string, opts: EnginesOptions) => {
      const { job, reply } = await ask(opts, { op: "attach", url, source: "runtime" });
      if (opts.json) return console.log(JSON.stringify(reply, null, 2));
      const e = reply.engine!;
      console.log(`attached ${e.url} to job ${job} (${e.healthy ? "healthy" : "not healthy yet"}, weight version ${e.weightVersion ?? "unknown"})`);
    },
  );
  common(engines.command("detach").argument("<url>", "engine URL").description("detach an engine; its in-flight requests move to other engines")).action(
    async (url: string, opts: EnginesOptions) => {
      const { job, reply } = await ask(opts, { op: "detach", url });
      if (opts.json) return console.log(JSON.stringify(reply, null, 2));
      console.log(`detached ${url} from job ${job}; ${reply.engines.length} engines left`);
    },
  );
  common(engines.command("list").description("list the job's engines: health, load, weight version")).action(async (opts: EnginesOptions) => {
    const { job, reply } = await ask(opts, { op: "list" });
    if (opts.json) return console.log(JSON.stringify(reply, null, 2));
    printEngines(job, reply.engines, reply.weightVersion);
  });
}
