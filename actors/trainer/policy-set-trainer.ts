// Several policies trained in one trainer actor, in turn: one PolicyTrainer per policy, each its own
// worker (the base and that policy's LoRA adapter, or a full policy's own whole model, starting from
// the base). A step splits the batch by each sample's policy and trains each policy on its own
// samples (a policy without samples in the batch keeps its weights, saved as the new version); every
// policy's versions advance together, as the job's weight version. Version N is one directory
// holding each policy's directory (weightsRoot/vN/POLICY: a PEFT adapter directory, or a model
// directory), which the weight sync moves as one and the engines load policy by policy, each under
// its name.
import { join } from "node:path";
import { OozeError } from "../../src/errors.ts";
import type { PolicySpec } from "../protocol/policies.ts";
import type { TrainSample } from "../protocol/messages.ts";
import { mergeMetrics, PolicyTrainer, V0_POLICIES, type PolicyTrainerConfig, type TrainStepResult } from "./policy-trainer.ts";
import type { StepTrainer } from "./sim-trainer.ts";

/** The policies' trainers, stepping together. */
export class PolicySetTrainer implements StepTrainer {
  private constructor(
    private readonly trainers: ReadonlyMap<string, PolicyTrainer>,
    private readonly weightsRoot: string,
    private current: { dir: string; version: number },
  ) {}

  /**
   * One trainer per policy (a LoRA adapter over the base at `modelDir`, or a full policy starting as
   * a copy of it), or, resuming, each from its subdirectory of a version directory `modelDir` this
   * class wrote.
   */
  static async start(opts: {
    modelDir: string; version: number; weightsRoot: string; config: PolicyTrainerConfig; policies: readonly PolicySpec[]; resumed: boolean;
    onRestart?: (reason: string, pid: number | null) => void; log?: (line: string) => void;
  }): Promise<PolicySetTrainer> {
    const trainers = new Map<string, PolicyTrainer>();
    try {
      for (const [i, p] of opts.policies.entries()) {
        const from = opts.resumed ? join(opts.modelDir, p.name) : opts.modelDir;
        trainers.set(p.name, await PolicyTrainer.start({
          modelDir: from, version: opts.version, weightsRoot: opts.weightsRoot,
          // each adapter from its own seed: two roles do not start as one
          config: { ...opts.config, lora: p.lora, policy: p.name, subdir: p.name, seed: (opts.config.seed ?? 0) + i },
          fresh: !opts.resumed,
          ...(opts.onRestart ? { onRestart: opts.onRestart } : {}), ...(opts.log ? { log: opts.log } : {}),
        }));
      }
    } catch (e) {
      for (const t of trainers.values()) await t.close();
      throw e;
    }
    // A fresh start saved each policy's weights as version 0 under weightsRoot/v0-policies/POLICY.
    const dir = opts.resumed ? opts.modelDir : join(opts.weightsRoot, V0_POLICIES);
    return new PolicySetTrainer(trainers, opts.weightsRoot, { dir, version: opts.version });
  }

  get pid(): number | null {
    return [...this.trainers.values()][0]?.pid ?? null;
  }

  get restarts(): number {
    return [...this.trainers.values()].reduce((n, t) => n + t.restarts, 0);
  }

  get version(): number {
    return this.current.version;
  }

  get modelDir(): string {
    return this.current.dir;
  }

  lrAt(version: number): number {
    return [...this.trainers.values()][0]!.lrAt(version);
  }

  /** Trains each policy on its samples of the batch (in turn) and makes the next version of all. */
  async step(samples: readonly TrainSample[]): Promise<TrainStepResult> {
    const by = new Map<string, TrainSample[]>();
    for (const s of samples) {
      const t = s.policy === undefined ? undefined : this.trainers.get(s.policy);
      if (!t) throw new OozeError("CONFIG_INVALID", `sample ${s.index} names policy '${s.policy ?? "(none)"}', not one of ${[...this.trainers.keys()].join(", ")}`);
      const list = by.get(s.policy!);
      if (list) list.push(s);
      else by.set(s.policy!, [s]);
    }
    const results: TrainStepResult[] = [];
    const policies: Record<string, TrainStepResult["metrics"]> = {};
    let restarts = 0;
    for (const [name, t] of this.trainers) {
      const mine = by.get(name) ?? [];
      if (mine.length > 0) {
        const r = await t.step(mine);
        results.push(r);
        policies[name] = r.metrics;
        restarts += r.restarts;
      } else await t.advance();
    }
    const version = this.current.version + 1;
    this.current = { dir: join(this.weightsRoot, `v${version}`), version };
    const first = results[0];
    if (!first) throw new OozeError("INTERNAL", "a step of several policies got no samples of any");
    return { ...first, metrics: mergeMetrics(results.map((r) => r.metrics)), modelDir: this.current.dir, version, restarts, policies };
  }

  /** Saves every policy's current weights to dir/POLICY. */
  async saveTo(dir: string): Promise<void> {
    for (const [name, t] of this.trainers) await t.saveTo(join(dir, name));
  }

  async close(): Promise<void> {
    for (const t of this.trainers.values()) await t.close();
  }
}
