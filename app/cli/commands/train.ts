// `ooze train FILE`: runs the RL loop a topology's `train:` section describes as a job of actors on an
// embedded NATS JetStream (../train-job.ts: the fleet's embedded engines and the native trainer
// worker as child processes; rollout, buffer, trainer and weight-sync actors exchanging messages on
// the job's streams), with a progress bar fed by the trainer's step metrics, DIR/metrics.jsonl,
// DIR/reward.svg, checkpoints, and a summary at the end. `--resume DIR` continues from DIR's last
// checkpoint at the same data position. `--mode` picks sync, async (one step off-policy) or
// fully_async (continuous generation, partial rollout, staleness bound).
import type { Command } from "commander";
import { SingleBar } from "cli-progress";
import { OozeError } from "../../../src/errors.ts";
import { loadTopology, withSettings } from "../../../src/topology/load.ts";
import { trainConfigOf } from "../../../actors/protocol/config.ts";
import type { StepMetrics } from "../../../actors/protocol/metrics.ts";

interface TrainOptions {
  out?: string;
  resume?: string;
  steps?: string;
  maxSeconds?: string;
  mode?: string;
  seed?: string;
  trainer?: string;
  quiet?: boolean;
  verbose?: boolean;
  dash?: boolean;
  dashPort?: string;
  nats?: string;
  replicas?: string;
  set?: string[];
}

function num(name: string, v: string, min: number): number {
  const n = Number(v);
  if (!Number.isFinite(n) || n < min) throw new OozeError("CONFIG_INVALID", `--${name} must be a number ≥ ${min} (got '${v}')`);
  return n;
}

export function register(program: Command) {
  program
    .command("train")
    .description("train a policy with RL as the topology's train: section says; writes metrics.jsonl, reward.svg and checkpoints to --out")
    .argument("<file>", "topology YAML file with a train: section")
    .option("--out <dir>", "run directory (metrics, checkpoints); default runs/<topology name>")
    .option("--resume <dir>", "continue the run in DIR from its last checkpoint")
    .option("--steps <n>", "override train.steps")
    .option("--max-seconds <s>", "override train.maxSeconds (stop after this much wall time)")
    .option("--mode <mode>", "override train.mode (sync | async | fully_async)")
    .option("--seed <n>", "override train.seed (prompts, sampling and the model's initialisation)")
    .option("--trainer <backend>", "override train.trainer.backend (native | torch: the PyTorch worker, set up on first use)")
    .option("--set <field=value>", "override any field of train: or engines: (repeatable; value as YAML), e.g. --set train.lr=0.001 --set 'train.policies.describer={full: true}'", (v: string, prev: string[] = []) => [...prev, v])
    .option("--quiet", "no progress bar or per-step lines")
    .option("--verbose", "every actor's log lines (default: warnings and errors)")
    .option("--dash", "serve the dashboard (app/dash) while the job runs; its URL is printed")
    .option("--dash-port <n>", "port of the dashboard (implies --dash)")
    .option("--nats <urls>", "run on this NATS server or cluster (nats://token@host:port[,nats://host2:port…]) instead of an embedded one")
    .option("--replicas <n>", "replicas of the job's streams, KV buckets and object stores (default 1; 3 with three or more --nats servers)")
    .action(async (file: string, opts: TrainOptions) => {
      // --trainer is one more setting, applied first, so that --set train.trainer.device=… (valid
      // with backend torch only) is checked against it
      if (opts.trainer !== undefined && opts.trainer !== "native" && opts.trainer !== "torch")
        throw new OozeError("CONFIG_INVALID", `--trainer must be native or torch (got '${opts.trainer}')`);
      const sets = [...(opts.trainer !== undefined ? [`train.trainer.backend=${opts.trainer}`] : []), ...(opts.set ?? [])];
      const topo = withSettings(loadTopology(file), sets);
      const { train, engines } = trainConfigOf(topo);
      if (opts.steps !== undefined) train.steps = num("steps", opts.steps, 1);
      if (opts.maxSeconds !== undefined) train.maxSeconds = num("max-seconds", opts.maxSeconds, 0);
      if (opts.seed !== undefined) {
        train.seed = num("seed", opts.seed, 0);
        if (!Number.isInteger(train.seed)) throw new OozeError("CONFIG_INVALID", `--seed must be an integer ≥ 0 (got '${opts.seed}')`);
      }
      if (opts.mode !== undefined) {
        if (opts.mode !== "sync" && opts.mode !== "async" && opts.mode !== "fully_async")
          throw new OozeError("CONFIG_INVALID", `--mode must be sync, async or fully_async (got '${opts.mode}')`);
        train.mode = opts.mode;
      }
      if (opts.resume && opts.out && opts.resume !== opts.out) throw new OozeError("CONFIG_INVALID", "give either --out or --resume (the run directory), not both");
      const out = opts.resume ?? opts.out ?? `runs/${topo.name}`;
      const { runTrainJob } = await import("../../job/train-job.ts");
      const { resolveNatsUrl, resolveReplicas } = await import("../../../src/transport/bus.ts");
      const target = resolveNatsUrl(opts.nats, process.env, topo.nats);
      const nats = target ? { url: target.url, token: target.token, replicas: resolveReplicas(target.url, false, opts.replicas, topo.nats.replicas) } : undefined;
      // the embedded server is one server: refuses replicas above 1
      if (!target) resolveReplicas("nats://127.0.0.1", true, opts.replicas, topo.nats.replicas);
      const stop = new AbortController();
      const onSignal = () => {
        if (stop.signal.aborted) process.exit(130);
        stop.abort();
        process.stderr.write("\n[ooze] stopping after this step (checkpoint and summary follow); Ctrl-C again to quit at once\n");
      };
      process.on("SIGINT", onSignal);
      process.on("SIGTERM", onSignal);
      const tty = process.stderr.isTTY && !opts.quiet;
      const bar = tty
        ? new SingleBar({ format: "step {value}/{total} |{bar}| reward {reward} | success {success} | {sps} samples/s | {secs}s", hideCursor: true, stream: process.stderr })
        : null;
      const say = (line: string) => {
        if (!opts.quiet) process.stderr.write(`${bar ? "\n" : ""}[ooze] ${line}\n`);
      };
      const summary = await runTrainJob({
        topology: topo,
        train,
        engines,
        out,
        resume: opts.resume !== undefined,
        signal: stop.signal,
        log: say,
        verbose: opts.verbose === true,
        onBus: async (job) => {
          const { dashFromTopology } = await import("./dash.ts");
          return dashFromTopology(topo, opts, job, { log: say, explorerDir: out }, (l) => process.stderr.write(`[ooze] ${l}\n`));
        },
        ...(nats ? { nats } : {}),
        onStart: ({ job, hosts, step }) => {
          say(`${topo.name}: task ${train.task}, ${train.mode} mode, job ${job} (${hosts.length} node${hosts.length > 1 ? "s" : ""}), run dir ${out}`);
          bar?.start(train.steps, step, { reward: "-", success: "-", sps: "-", secs: "0" });
        },
        onStep: (m: StepMetrics) => {
          const vals = { reward: m.reward_mean.toFixed(3), success: m.success_rate.toFixed(2), sps: m.samples_per_s.toFixed(1), secs: m.seconds.toFixed(0) };
          if (bar) bar.update(m.step, vals);
          else if (!opts.quiet)
            process.stderr.write(`[ooze] step ${m.step}/${train.steps} reward ${vals.reward} success ${vals.success} ${vals.sps} samples/s loss ${m.loss.toFixed(4)} entropy ${m.entropy.toFixed(3)}${train.mode === "fully_async" ? ` staleness ${m.staleness_max} partial ${m.partial_samples}` : ""} ${vals.secs}s\n`);
        },
      });
      bar?.stop();
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
      const f = (x: number | null) => (x === null ? "-" : x.toFixed(3));
      console.log(
        [
          `ooze train: ${summary.steps} steps, ${summary.samples} samples in ${summary.seconds.toFixed(1)} s (${(summary.samples / Math.max(1e-9, summary.seconds)).toFixed(1)} samples/s)`,
          `  reward: first ${f(summary.rewardFirst)}, last ${f(summary.rewardLast)}, mean of last 5 steps ${f(summary.rewardTail)} (success rate ${f(summary.successTail)})`,
          `  weight version ${summary.weightVersion}, trainer restarts ${summary.trainerRestarts}`,
          `  metrics ${summary.metricsPath}`,
          `  chart   ${summary.svgPath}`,
          `  checkpoint ${summary.checkpoint ?? "-"}  (continue with: ooze train ${file} --resume ${out})`,
        ].join("\n"),
      );
      // The job is over and its processes stopped: a clean run's event loop is empty by now and it
      // exits at once; one a library left armed (nats.js consumer timers, reliability finding 10)
      // leaves after 2 s, saying what was left, instead of never.
      setTimeout(() => {
        process.stderr.write(`[ooze] train: exiting with ${process.getActiveResourcesInfo().join(", ")} still open\n`);
        process.exit(0);
      }, 2_000).unref();
    });
}
