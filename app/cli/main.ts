// The `ooze` command line. Each command lives in app/cli/commands/ and registers itself here; the
// native addon is imported inside the actions that need it, so other commands work without it.
import { Command } from "commander";
import { OozeError } from "../../src/errors.ts";
import { COMMANDS } from "./command-table.ts";

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

// only the named command's module (app/cli/command-table.ts); all of them for help, none or an unknown name
const named = COMMANDS.find(([names]) => names.includes(process.argv[2] ?? ""));
for (const m of await Promise.all((named ? [named] : COMMANDS).map(([, load]) => load()))) m.register(program);

try {
  await program.parseAsync(process.argv);
} catch (e) {
  reportAndExit(e);
}

