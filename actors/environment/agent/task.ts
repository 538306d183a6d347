// The task source of agent environments: a module (train.task) whose default export builds an
// AgentTask from train.taskConfig. It gives each prompt's task text (and files to put in the
// episode's working directory) and, unless the topology names a reward command, the reward, seeing
// the workdir the agent left and the episode's transcript.
import { OozeError } from "../../../src/errors.ts";
import { importTaskFactory } from "../task-loader.ts";
import type { Sample } from "../../../src/sample.ts";

/** One prompt of an agent task. */
export interface AgentPrompt {
  /** The task as text: the agent gets it on stdin, in OOZE_TASK and for `{task}` in its args. */
  task: string;
  /** Files created in the workdir before the agent starts (relative path → content). */
  files?: Record<string, string>;
  /** Anything the reward needs (the expected answer…); never shown to the agent. */
  data?: unknown;
}

/** The episode's record, as the reward sees it. */
export interface Transcript {
  /** The samples the episode's gateway session produced, in order (token-exact). */
  samples: Sample[];
  /** Each sample's tokens decoded (prompt and response), when the rollout has a tokenizer. */
  text: string[];
  /** The agent's stdout and stderr (their tails) and how it ended. */
  stdout: string;
  stderr: string;
  exitCode: number | null;
}

/** What a reward function sees. */
export interface RewardContext {
  /** The agent's working directory, as it left it. */
  workdir: string;
  prompt: AgentPrompt;
  transcript: Transcript;
}

/** One sample's reward and outcome; `success: null` leaves it out of the success rate. */
export interface SampleReward {
  reward: number;
  success?: boolean | null;
}

/**
 * A reward, or a reward and whether the episode reached the goal (success rate); or a reward per
 * sample of the transcript (`samples`, in `transcript.samples` order), for an episode whose samples
 * are separate decisions — a multi-agent program's roles, the `n` choices of one request. Each
 * sample so rewarded is then a trajectory of its own (its own rollout id), and its advantage is
 * taken among its policy's samples of the prompt group that have the same prompt tokens — the rule
 * of a role task's contexts (actors/buffer/groups.ts): the guesses of one message are one group.
 */
export type RewardResult = number | { reward: number; success?: boolean } | { samples: SampleReward[] };

/** An agent task: prompts and (optionally) a reward. */
export interface AgentTask {
  readonly name: string;
  /** The task for prompt number `index` (deterministic in index and seed). */
  prompt(index: number, seed: number): AgentPrompt;
  /** Reward of a finished episode; required unless the topology gives `train.agent.reward`. */
  reward?(ctx: RewardContext): RewardResult | Promise<RewardResult>;
}

/** A module providing an agent task: `export default (config) => AgentTask`. */
export type AgentTaskFactory = (config: Record<string, unknown>) => AgentTask;

/** Loads the agent task module `name` (relative to `baseDir`) and builds it with `config`. */
export async function loadAgentTask(name: string, config: Record<string, unknown>, baseDir: string): Promise<AgentTask> {
  if (!name.includes("/") && !/\.(ts|js|mjs)$/.test(name))
    throw new OozeError("CONFIG_INVALID", `train.task '${name}': with train.agent the task must be a module path like ./my-task.ts whose default export builds an AgentTask`);
  const task = (await importTaskFactory(name, baseDir, "a factory (config) => AgentTask"))(config) as AgentTask;
  if (!task || typeof task.prompt !== "function") throw new OozeError("CONFIG_INVALID", `train.task: ${name}: the task has no prompt(index, seed) function`);
  return task;
}
