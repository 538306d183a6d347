// The built-in tasks by name, for topologies that say `task: addition` instead of a module path.
import type { TaskFactory } from "../task.ts";
import { createAdditionTask } from "./addition.ts";
import { createGuessNumberTask } from "./guess-number.ts";
import { createReferentialTask } from "./referential.ts";

export const BUILTIN_TASKS: Readonly<Record<string, TaskFactory>> = {
  addition: createAdditionTask,
  "guess-number": createGuessNumberTask,
  referential: createReferentialTask,
};
