// Finds the task a topology names: a built-in one (addition, guess-number) or a module path relative
// to the topology file whose default export is a TaskFactory.
import { isAbsolute, resolve } from "node:path";
import type { Task, TaskFactory } from "./task.ts";
import { BUILTIN_TASKS } from "./tasks/index.ts";
import { OozeError } from "../../src/errors.ts";
import { importUserModule } from "../../src/user-module.ts";

/** Builds the task `name` with `config`; module paths resolve against `baseDir`. */
export async function loadTask(name: string, config: Record<string, unknown>, baseDir: string): Promise<Task> {
  const builtin = BUILTIN_TASKS[name];
  if (builtin) return builtin(config);
  if (!name.includes("/") && !/\.(ts|js|mjs)$/.test(name))
    throw new OozeError("CONFIG_INVALID", `train.task '${name}' is neither a built-in task (${Object.keys(BUILTIN_TASKS).join(", ")}) nor a module path like ./my-task.ts`);
  return ((await importTaskFactory(name, baseDir, "a task factory (config) => Task")) as TaskFactory)(config);
}

/** The default export (a function) of the task module `name`, relative to `baseDir`; errors name train.task and the path. */
export async function importTaskFactory(name: string, baseDir: string, what: string): Promise<(config: Record<string, unknown>) => unknown> {
  const path = isAbsolute(name) ? name : resolve(baseDir, name);
  let mod: { default?: unknown };
  try {
    mod = (await importUserModule(path)) as { default?: unknown };
  } catch (e) {
    throw new OozeError("CONFIG_INVALID", `train.task: cannot load ${path}: ${(e as Error).message}`, { cause: e });
  }
  if (typeof mod.default !== "function") throw new OozeError("CONFIG_INVALID", `train.task: ${path} must export default ${what}`);
  return mod.default as (config: Record<string, unknown>) => unknown;
}
