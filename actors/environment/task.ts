// The task plugin interface hosted by the environment actor: reset, step, reward, and optional
// tools. A task sees the model's sampled tokens (it may decode them to read the action) and answers
// with observation tokens; it never rewrites the model's tokens (token-in, token-out).
import { mulberry32 } from "../../src/random.ts";
import type { TaskTokenizer } from "./task-tokenizer.ts";

/** What a task answers after the model's turn. */
export interface StepResult<S> {
  state: S;
  /** Tokens of the environment's reply, appended with loss mask 0; empty when done. */
  observation: Int32Array;
  done: boolean;
  /**
   * The next model turn starts a new context (a new sample): `promptIds` is all it sees, played by
   * `role` (one of the task's `roles`, each mapped to a policy by the topology's `train.roles`). A
   * role's context never shows what another role saw: the describer of a referential game sees the
   * secret, the guesser only the message. `observation` is ignored when set.
   */
  context?: { role: string; prompt: string; promptIds: Int32Array };
  /**
   * Optional reward for this turn (turn-level credit): recorded on the sample at the turn's last
   * model token (metadata.turnRewards) and discounted through GAE by algorithm: ppo. It is a part of
   * the episode's reward given early, not an extra: `reward(state)` stays the episode's total, and
   * GAE puts what the turns did not give at the end. Group estimators use the total only.
   */
  reward?: number;
}

/** A task: one instance per episode. */
export interface Task<S = unknown> {
  readonly name: string;
  /** Most model turns in one episode (1 for single-turn tasks). */
  readonly maxTurns: number;
  /**
   * A task played by several roles: their names, the first being the role of reset's prompt. Each
   * episode then yields one sample per context (StepResult.context), at most one per role, and the
   * topology's `train.roles` maps each role to the policy that plays and learns it. Absent: one role.
   */
  readonly roles?: readonly string[];
  /** Most tokens the model may sample in one turn. */
  readonly maxTurnTokens: number;
  /**
   * The id that ends a model turn (the model config's eos_token_id, `TaskTokenizer.eos`): the
   * episode keeps it in the sample and strips it from the action `step` sees. Unset: the byte
   * tokenizer's EOS (257); `loadTask` sets it from the model's tokenizer for a task that leaves it unset.
   */
  readonly eosId?: number;
  /** A new episode for prompt number `index` (deterministic in `index` and `seed`). */
  reset(index: number, seed: number): { prompt: string; promptIds: Int32Array; state: S };
  /** The model's turn (its sampled ids, EOS excluded) → the environment's reply. */
  step(state: S, action: Int32Array): StepResult<S>;
  /** Final reward of the episode, in [0, 1] for the built-in tasks. */
  reward(state: S): number;
  /**
   * A task of several roles whose roles are not rewarded alike (a proposer rewarded for the problems
   * its solver fails, a solver for solving them): `role`'s reward for the episode that ended in
   * `state`. Each context's sample gets its role's reward (the mean over its branches, as with
   * `reward`); `reward(state)` stays the episode's figure in the step's reward statistics. Absent:
   * every context gets `reward(state)`.
   */
  roleReward?(state: S, role: string): number;
  /**
   * Whether the episode reached the task's goal (the exact answer, the number found), reported as
   * the run's success rate; without it, success is the full reward (1).
   */
  success?(state: S): boolean;
}

/** What the environment gives a task besides its config. */
export interface TaskContext {
  /** The model's tokenizer (its directory's tokenizer.json, or the byte tokenizer): see task-tokenizer.ts. */
  tokenizer: TaskTokenizer;
}

/**
 * A module that provides a task: `export default` a factory taking the topology's config and the
 * context (the built-in tasks default to the byte tokenizer when called without one).
 */
export type TaskFactory = (config: Record<string, unknown>, context?: TaskContext) => Task;

/** Deterministic 32-bit PRNG (mulberry32), so prompts are reproducible from index and seed. */
export const prng = mulberry32;

/** Mixes a prompt index into a seed. */
export function episodeSeed(index: number, seed: number): number {
  return (Math.imul(index + 1, 0x9e3779b1) ^ Math.imul(seed + 7, 0x85ebca6b)) >>> 0;
}
