// The order test files start in (vitest.config.ts): the slowest first, so that the workers finish
// together instead of one long file running alone at the end. vitest orders by the durations it
// cached from earlier runs, but a fresh clone has none (it then starts the largest files first);
// SLOW_FILES, measured (the files over 10 s in a three-worker run, Nov 29 evening; docs/reliability.md,
// "The suite's wall time"), goes before either. Among them, the files that start PyTorch workers
// (train, torch-worker, worker, torch-python, train-policies) are spread apart: started together
// beside the addon's build in package-install, three of them took 2–3× their time on two cores and
// one case ran past its budget.
import { BaseSequencer, type TestSpecification } from "vitest/node";

/** The slowest test files, slowest first (paths from the repository root). */
export const SLOW_FILES = [
  // its beforeAll (npm pack, npm ci with the addon's build, ~70 s) is not in its test time
  "test/integration/package-install.test.ts",
  "test/integration/train.test.ts",
  "test/property/cluster-schedules.test.ts",
  "test/integration/fuzz-example.test.ts",
  "test/integration/engine-faults.test.ts",
  "test/integration/netns.test.ts",
  "test/native/torch-worker.test.ts",
  "test/property/fleet-schedules.test.ts",
  "test/integration/ppo.test.ts",
  "test/integration/train-actors.test.ts",
  "test/integration/nats-cluster.test.ts",
  "test/integration/fuzz-topologies.test.ts",
  "test/integration/nats-cluster-faults.test.ts",
  "test/integration/engine-faults-train.test.ts",
  "test/native/worker.test.ts",
  "test/property/durable-faults.test.ts",
  "test/property/job-schedules.test.ts",
  "test/integration/fuzz-cli.test.ts",
  "test/property/command-schedules.test.ts",
  "test/integration/dash-browser.test.ts",
  "test/integration/train-agent.test.ts",
  "test/native/torch-python.test.ts",
  "test/integration/train-lora.test.ts",
  "test/integration/fleet-actor.test.ts",
  "test/integration/train-actors-delta.test.ts",
  "test/integration/sim-train.test.ts",
  "test/integration/cli-up.test.ts",
  "test/property/job-process-schedules.test.ts",
  "test/integration/train-policies.test.ts",
  "test/integration/cli-sft.test.ts",
  "test/property/host-schedules.test.ts",
];

/** vitest's own order, with SLOW_FILES moved to the front in their order. */
export class SlowFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (f: TestSpecification) => {
      const i = SLOW_FILES.findIndex((s) => f.moduleId.endsWith(`/${s}`));
      return i < 0 ? SLOW_FILES.length : i;
    };
    const sorted = await super.sort(files);
    return sorted.map((f, i) => ({ f, i, r: rank(f) })).sort((a, b) => a.r - b.r || a.i - b.i).map((x) => x.f);
  }
}
