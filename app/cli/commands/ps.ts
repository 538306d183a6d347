// `ooze ps` and `ooze down`: inspect and stop a running job from another terminal, through NATS.
import type { Command } from "commander";
import { findJob, processAlive, recordAuth } from "../job-records.ts";
import { nodeDown, nodeStatus } from "../../../src/topology/node.ts";
import type { ActorInfo } from "../../../src/actor/index.ts";
import { connectBus } from "../../../src/transport/bus.ts";
import { jobNames } from "../../../src/transport/names.ts";

export function register(program: Command) {
  program
    .command("ps")
    .description("list the actors of a running job: state, restarts, mailbox depth")
    .option("--job <name>", "job id (default: the newest running job)")
    .option("--json", "print JSON")
    .action(async (opts: { job?: string; json?: boolean }) => {
      const rec = findJob(opts.job);
      const bus = await connectBus({ url: rec.natsUrl, ...recordAuth(rec), name: "ooze-ps", largeBucket: jobNames(rec.job).objLarge });
      const statuses = await Promise.all(
        rec.hosts.map(async (host): Promise<{ host: string; pid: number; metrics: string | null; actors: ActorInfo[]; failure: string | null } | { host: string; error: string }> => {
          try {
            const s = await nodeStatus(bus, rec.job, host);
            return { host, pid: s.pid, metrics: s.metrics ?? null, actors: s.actors, failure: s.failure?.message ?? null };
          } catch (e) {
            return { host, error: (e as Error).message };
          }
        }),
      );
      await bus.close();
      if (opts.json) {
        console.log(JSON.stringify({ job: rec.job, nodes: statuses }, null, 2));
        return;
      }
      console.log(`job ${rec.job}  (nats ${rec.natsUrl}, started ${rec.startedAt})`);
      const rows = [["HOST", "ACTOR", "STATUS", "RESTARTS", "MAILBOX", "PROCESSED", "MALFORMED"]];
      for (const s of statuses) {
        if ("error" in s) rows.push([s.host, "-", `unreachable: ${s.error}`, "", "", "", ""]);
        else for (const a of s.actors) rows.push([s.host, a.path, a.status, String(a.restarts), String(a.mailboxDepth), String(a.processed), String(a.malformed)]);
      }
      for (const s of statuses) if (!("error" in s) && s.metrics) console.log(`${s.host}: pid ${s.pid}, metrics ${s.metrics}`);
      const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
      for (const r of rows) console.log(r.map((c, i) => c.padEnd(widths[i]!)).join("  ").trimEnd());
    });

  program
    .command("down")
    .description("drain in-flight work and stop a running job")
    .option("--job <name>", "job id (default: the newest running job)")
    .action(async (opts: { job?: string }) => {
      const rec = findJob(opts.job);
      // `ooze up` drains its nodes (local and external) on SIGTERM; tell nodes directly only if it is gone.
      try {
        process.kill(rec.pid, "SIGTERM");
      } catch {
        const bus = await connectBus({ url: rec.natsUrl, ...recordAuth(rec), name: "ooze-down", largeBucket: jobNames(rec.job).objLarge });
        await Promise.allSettled(rec.hosts.map((h) => nodeDown(bus, rec.job, h)));
        await bus.close();
      }
      const deadline = Date.now() + 30_000;
      while (Date.now() < deadline) {
        if (!processAlive(rec.pid)) {
          console.log(`job ${rec.job} stopped`);
          return;
        }
        await new Promise((r) => setTimeout(r, 200));
      }
      console.error(`job ${rec.job}: process ${rec.pid} still running after 30 s`);
      process.exitCode = 1;
    });
}
