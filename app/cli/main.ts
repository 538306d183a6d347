// The `ooze` command line. Each command lives in app/cli/commands/ and registers itself here; the
// native addon is imported inside the actions that need it, so other commands work without it.
import { Command } from "commander";
import { OozeError } from "../../src/errors.ts";

/** Exit code of a failure that a restart cannot cure (bad topology, bad config): EX_CONFIG. */
export const EXIT_NOT_RETRYABLE = 78;

/**
 * Prints an error a person can act on, without a stack for expected errors, and exits: 1, or
 * EXIT_NOT_RETRYABLE for a non-retryable OozeError, so a supervising `ooze up` does not restart it.
 */
export function reportAndExit(e: unknown): never {
  if (e instanceof OozeError) {
    console.error(`ooze: ${e.message}`);
    if (process.env.OOZE_DEBUG) console.error(e.stack);
    process.exit(e.retryable ? 1 : EXIT_NOT_RETRYABLE);
  }
  console.error(e);
  process.exit(1);
}

const program = new Command();
program
  .name("ooze")
  .description("An actor runtime for agentic RL of language models, over NATS JetStream.")
  .showHelpAfterError();

/** Imports a command module and registers its commands. */
function lazy(load: () => Promise<{ register: (cmd: Command) => void }>) {
  return load().then((m) => m.register(program));
}

await Promise.all([
  lazy(() => import("./commands/model.ts")),
  lazy(() => import("./commands/topology.ts")),
  lazy(() => import("./commands/up.ts")),
  lazy(() => import("./commands/node.ts")),
  lazy(() => import("./commands/ps.ts")),
  lazy(() => import("./commands/serve.ts")),
  lazy(() => import("./commands/sim-engine.ts")),
  lazy(() => import("./commands/engines.ts")),
  lazy(() => import("./commands/train.ts")),
  lazy(() => import("./commands/rollout.ts")),
  lazy(() => import("./commands/fuzz.ts")),
  lazy(() => import("./commands/dash.ts")),
  lazy(() => import("./commands/sft.ts")),
  lazy(() => import("./commands/setup.ts")),
]);

try {
  await program.parseAsync(process.argv);
} catch (e) {
  reportAndExit(e);
}

