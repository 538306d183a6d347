// The order test files start in (vitest.config.ts): the slowest first, so that the workers finish
// together instead of one long file running alone at the end. vitest orders by the durations it
// cached from earlier runs, but a fresh clone has none (it then starts the largest files first);
// SLOW_FILES, measured (docs/reliability.md, "The suite's wall time"), goes before either.
import { BaseSequencer, type TestSpecification } from "vitest/node";

/** The slowest test files, slowest first (paths from the repository root). */
export const SLOW_FILES = [
  "test/integration/package-install.test.ts",
  "test/integration/nats-cluster.test.ts",
  "test/integration/ppo.test.ts",
  "test/native/worker.test.ts",
  "test/native/torch-worker.test.ts",
  "test/integration/engine-faults.test.ts",
  "test/integration/job-under-test.test.ts",
  "test/property/host-schedules.test.ts",
  "test/integration/train.test.ts",
  "test/integration/fuzz-example.test.ts",
  "test/integration/netns.test.ts",
  "test/integration/train-actors.test.ts",
  "test/integration/fleet-actor.test.ts",
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
