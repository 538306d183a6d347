// Finds the task a topology names: a built-in one (addition, guess-number) or a module path relative
// to the topology file whose default export is a TaskFactory, and gives it the model's tokenizer.
import { isAbsolute, resolve } from "node:path";
import type { Task, TaskFactory } from "./task.ts";
import { taskTokenizerFor, type TaskTokenizer } from "./task-tokenizer.ts";
import { EOS_ID } from "../../src/engine/tokenizer.ts";
import { BUILTIN_TASKS } from "./tasks/index.ts";
import { OozeError } from "../../src/errors.ts";
import { importUserModule } from "../../src/user-module.ts";

/** Where the task's tokenizer comes from: the topology's `train.model` (relative to `baseDir`); unset: a preset's byte tokenizer. */
export interface LoadTaskOptions {
  model?: string | undefined;
}

/**
 * Builds the task `name` with `config` and the model's tokenizer (`taskTokenizerFor`); module paths
 * and `model` resolve against `baseDir`. A task that leaves `eosId` unset gets the tokenizer's.
 */
export async function loadTask(name: string, config: Record<string, unknown>, baseDir: string, opts: LoadTaskOptions = {}): Promise<Task> {
  const builtin = BUILTIN_TASKS[name];
  if (!builtin && !name.includes("/") && !/\.(ts|js|mjs)$/.test(name))
    throw new OozeError("CONFIG_INVALID", `train.task '${name}' is neither a built-in task (${Object.keys(BUILTIN_TASKS).join(", ")}) nor a module path like ./my-task.ts`);
  const modelDir = opts.model === undefined ? null : isAbsolute(opts.model) ? opts.model : resolve(baseDir, opts.model);
  const tokenizer = await taskTokenizerFor(modelDir);
  const factory = builtin ?? ((await importTaskFactory(name, baseDir, "a task factory (config, {tokenizer}) => Task")) as TaskFactory);
  return withEos(factory(config, { tokenizer }), tokenizer);
}

/** `task`, or a view of it that ends turns on the tokenizer's EOS when the task does not say and that is not the byte EOS. */
function withEos(task: Task, tokenizer: TaskTokenizer): Task {
  if (task.eosId !== undefined || tokenizer.eos === EOS_ID) return task;
  const { success, roles, roleReward } = task;
  return {
    get name() { return task.name; },
    get maxTurns() { return task.maxTurns; },
    get maxTurnTokens() { return task.maxTurnTokens; },
    eosId: tokenizer.eos,
    reset: (index, seed) => task.reset(index, seed),
    step: (state, action) => task.step(state, action),
    reward: (state) => task.reward(state),
    ...(success ? { success: (state: unknown) => success.call(task, state) } : {}),
    ...(roles ? { roles } : {}),
    ...(roleReward ? { roleReward: (state: unknown, role: string) => roleReward.call(task, state, role) } : {}),
  };
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
