// The table of the `ooze` command's subcommands (app/cli/main.ts): which module in commands/
// registers each. test/unit/cli-commands.test.ts checks that every module registers exactly the names
// listed for it.
import type { Command } from "commander";

/** What a module in commands/ exports. */
export type CommandModule = { register: (cmd: Command) => void };
/**
 * The command modules in help's order, each with the commands it registers. Only the module of the
 * command named first on the line is imported: every engine (`ooze serve`), node and job process
 * loads its own command's code, not the dashboard's, the fleet's and every other command's (about
 * 0.3 s of CPU at each start; the suite starts some 500 processes). Help, no command or an unknown
 * one import them all, so the listing and commander's suggestions are whole.
 */
export const COMMANDS: [names: string[], load: () => Promise<CommandModule>][] = [
  [["model"], () => import("./commands/model.ts")],
  [["check"], () => import("./commands/topology.ts")],
  [["up"], () => import("./commands/up.ts")],
  [["node"], () => import("./commands/node.ts")],
  [["ps", "down"], () => import("./commands/ps.ts")],
  [["serve"], () => import("./commands/serve.ts")],
  [["sim-engine"], () => import("./commands/sim-engine.ts")],
  [["engines"], () => import("./commands/engines.ts")],
  [["train"], () => import("./commands/train.ts")],
  [["rollout"], () => import("./commands/rollout.ts")],
  [["fuzz"], () => import("./commands/fuzz.ts")],
  [["dash"], () => import("./commands/dash.ts")],
  [["sft"], () => import("./commands/sft.ts")],
  [["setup"], () => import("./commands/setup.ts")],
];
