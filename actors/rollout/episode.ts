// One episode, token-in/token-out: the prompt's ids go to the engine, the sampled ids and their
// logprobs are appended exactly as returned (EOS included, so the model learns to stop), the task
// sees the turn's ids without EOS, and its observation is appended with loss mask 0. A turn the
// engine aborts (weight update, engine lost) keeps what was sampled and resumes with the remaining
// budget, each span recorded under the weight version that produced it. Without partial rollout, a
// turn that a weight update interrupted is generated again from its start on the new weights.
// Requests are sized to the engines' context (src/engine/limits.ts): an episode that fills it ends
// truncated, never with a request an engine would refuse. A task of several roles starts a new
// context (a new sample, index + 1) where a step says so: its requests send that context's tokens
// only and name its role's adapter, and every context of the episode gets the episode's reward.
import type { Generator } from "./generator.ts";
import { OozeError } from "../../src/errors.ts";
import { sendableMaxNewTokens } from "../../src/engine/limits.ts";
import { EOS_ID } from "../../src/engine/tokenizer.ts";
import { SampleBuilder, type Sample } from "../../src/sample.ts";
import type { Task } from "../environment/task.ts";

/** What one episode needs besides the task. */
export interface EpisodeSpec {
  /** The sample's index (unique in the job). */
  index: number;
  /** The prompt's index: the group, and the task's reset index. */
  groupIndex: number;
  /** Task seed (prompts are deterministic in groupIndex and seed). */
  seed: number;
  temperature: number;
  /** Sampling seed for this episode (reproducible generations). */
  samplingSeed: number;
  /** Resumes allowed after aborted generations within one turn. */
  maxResumes?: number;
  /**
   * Keep the tokens of a turn interrupted by a weight update and resume it on the new weights
   * (default true). false: the turn's tokens are discarded and it is generated again.
   */
  partialRollout?: boolean;
  /** Abandons the episode: its generation is aborted and runEpisode rejects with ACTOR_STOPPED. */
  signal?: AbortSignal;
  /**
   * A task of several roles: each role's policy, and its LoRA adapter's name on the engines (null:
   * the base). The episode's samples are indices index, index + 1, … (one per context).
   */
  roles?: ReadonlyMap<string, { policy: string; lora: string | null; contexts?: number }> | null;
}

/** Sample indices one episode owns: the contexts its roles play (1 without roles). */
export function slotsOf(roles: EpisodeSpec["roles"]): number {
  return Math.max(1, [...(roles?.values() ?? [])].reduce((n, r) => n + (r.contexts ?? 1), 0));
}

/** Tokens a request of `inputLen` tokens may ask for on the generator's engines (Infinity when they report no limits). */
function roomFor(gen: Generator, inputLen: number): number {
  const limits = gen.lengthLimits?.() ?? null;
  return limits === null ? Infinity : sendableMaxNewTokens(limits, inputLen);
}

/** The role a context is played by, as its sample and requests name it, and how many contexts it plays per opening. */
function roleOf(spec: EpisodeSpec, role: string | undefined, index: number): { policy?: string; lora?: string | null; contexts: number } {
  if (!spec.roles || role === undefined) return { contexts: 1 };
  const r = spec.roles.get(role);
  if (!r) throw new OozeError("CONFIG_INVALID", `episode ${index}: the task's role '${role}' has no policy in train.roles (${[...spec.roles.keys()].join(", ")})`);
  return { policy: r.policy, lora: r.lora, contexts: r.contexts ?? 1 };
}

/** One context of an episode: its sample being built, what its requests name, and how its branch ended. */
interface Context<S> {
  b: SampleBuilder;
  role: string | null;
  lora: string | null | undefined;
  /** Its sampling session (routing affinity): the episode's id, then `.N` for its N-th context. */
  session: string;
  turns: number;
  turnRewards: { ends: number[]; rewards: number[] };
  truncated: boolean;
  /** Final states of the episode's branches that went through this context (one, unless it forked). */
  leaves: S[];
}

/**
 * Runs one episode of `task` on `gen`: one sample per context (one, unless the task has roles);
 * never throws for a model's bad answer, only for engine failures and a prompt that leaves no room
 * in the engines' context (ENGINE_REJECTED). Each request asks for no more than the context leaves;
 * an episode that fills the context ends truncated. Where a step opens a context for a role that
 * plays several (`contexts` in train.roles), the rest of the episode runs once per context, in
 * parallel, from that state; a context's reward is the mean reward of the branches through it (its
 * role's, where the task rewards roles apart: Task.roleReward).
 */
export async function runEpisode<S>(task: Task<S>, gen: Generator, spec: EpisodeSpec): Promise<Sample[]> {
  const { prompt, promptIds, state: s0 } = task.reset(spec.groupIndex, spec.seed);
  const rolloutId = `r${spec.index}`;
  const contexts: Context<S>[] = [];
  const slots = slotsOf(spec.roles);
  const open = (role: string | undefined, p: unknown, ids: Int32Array): Context<S> => {
    const n = contexts.length;
    if (n >= slots) throw new OozeError("CONFIG_INVALID", `task ${task.name}: episode ${spec.index} opened more contexts than the ${slots} its roles own`);
    const r = roleOf(spec, role, spec.index + n);
    const id = n === 0 ? rolloutId : `${rolloutId}.${n}`;
    const c: Context<S> = {
      b: new SampleBuilder(spec.index + n, spec.groupIndex, id, p, ids, r.policy), role: role ?? null, lora: r.lora, session: id,
      turns: 0, turnRewards: { ends: [], rewards: [] }, truncated: false, leaves: [],
    };
    contexts.push(c);
    return c;
  };

  /** Plays turns from `turn0` in context `c`, from `state`; returns the final states of every branch. */
  const play = async (c: Context<S>, state0: S, turn0: number): Promise<S[]> => {
    const b = c.b;
    let state = state0;
    for (let turn = turn0; turn < task.maxTurns; turn++) {
      c.turns++;
      const turnStart = b.responseLength;
      let budget = task.maxTurnTokens;
      let resumes = 0;
      let restarts = 0;
      let finished = false;
      while (budget > 0 && !finished) {
        const room = roomFor(gen, b.tokens.length);
        if (room === 0) {
          if (b.responseLength > 0) break; // the context is full: the turn (and the episode) ends truncated
          const l = gen.lengthLimits!()!;
          throw new OozeError(
            "ENGINE_REJECTED",
            `episode ${spec.index} (prompt ${spec.groupIndex}): the prompt of ${b.tokens.length} tokens leaves no room for a reply in the engines' context ` +
              `(${l.contextLength} tokens; inputs below ${l.maxReqInputLen} tokens are served); use shorter prompts or a model with a longer context`,
          );
        }
        const res = await gen.generate({
          inputIds: b.tokens, // a view: the builder only appends past it, so it never changes under the request
          sampling: { max_new_tokens: Math.min(budget, room), temperature: spec.temperature, top_p: 1, top_k: -1, sampling_seed: spec.samplingSeed + (b.index - spec.index) * 7717 + turn * 1009 + resumes + restarts * 31 },
          sessionId: c.session,
          ...(c.lora !== undefined ? { lora: c.lora } : {}),
          ...(spec.signal ? { signal: spec.signal } : {}),
        });
        if (spec.signal?.aborted) throw new OozeError("ACTOR_STOPPED", `episode ${spec.index} (prompt ${spec.groupIndex}) was abandoned`);
        if (spec.partialRollout === false && b.responseLength === turnStart && new Set(res.weightVersions.map((sp) => sp.version)).size > 1 && restarts < 8) {
          restarts++; // interrupted by a weight update: start the turn again on the new weights
          continue;
        }
        const covered = res.weightVersions.reduce((n, sp) => n + sp.end - sp.start, 0);
        if (covered === res.outputIds.length)
          for (const sp of res.weightVersions) b.appendModel(res.outputIds.subarray(sp.start, sp.end), res.logprobs.subarray(sp.start, sp.end), sp.version);
        else b.appendModel(res.outputIds, res.logprobs, res.weightVersions.at(-1)?.version ?? "unknown");
        budget -= res.outputIds.length;
        if (res.status === "aborted" && resumes < (spec.maxResumes ?? 4)) {
          resumes++;
          continue;
        }
        finished = true;
        if (res.status !== "completed") c.truncated = true;
      }
      if (!finished) c.truncated = true;
      const ids = b.tokens.subarray(b.tokens.length - (b.responseLength - turnStart));
      const action = ids.length > 0 && ids[ids.length - 1] === (task.eosId ?? EOS_ID) ? ids.subarray(0, ids.length - 1) : ids;
      const r = task.step(state, action.slice());
      state = r.state;
      if (r.reward !== undefined) c.turnRewards.ends.push(b.responseLength), c.turnRewards.rewards.push(r.reward);
      if (r.done) break;
      if (r.context) {
        // a new context for another role (a sample of its own, which sees only its prompt), played
        // as many times as the role plays per opening, each branch on from here
        const ctx = r.context;
        const k = roleOf(spec, ctx.role, spec.index + contexts.length).contexts;
        const children = Array.from({ length: k }, () => open(ctx.role, ctx.prompt, ctx.promptIds));
        c.leaves = (await Promise.all(children.map((child) => play(child, state, turn + 1)))).flat();
        return c.leaves;
      }
      // An observation after which the engines could not reply ends the episode here, truncated: the
      // sample never holds more than the context, and no request is sent that an engine would refuse.
      if (roomFor(gen, b.tokens.length + r.observation.length) === 0) {
        c.truncated = true;
        break;
      }
      b.appendEnv(r.observation);
    }
    c.leaves = [state];
    return c.leaves;
  };

  await play(open(task.roles?.[0], prompt, promptIds), s0, 0);
  const truncated = contexts.some((x) => x.truncated);
  const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / xs.length;
  return contexts.map((x, i) => {
    const one = x.leaves.length === 1 ? x.leaves[0]! : null;
    // success where the task tests it (rewardStats counts the full reward otherwise); a context of
    // several branches has a success rate, not one outcome: null keeps it out of success_rate
    const success = task.success ? { success: one !== null ? task.success(one) : null } : {};
    // each role's own reward where the task gives one (Task.roleReward), else the episode's
    const rewardOf = (l: S) => (task.roleReward && x.role !== null ? task.roleReward(l, x.role) : task.reward(l));
    return x.b.build(mean(x.leaves.map(rewardOf)), truncated ? "truncated" : "completed", {
      turns: x.turns,
      ...success,
      ...(x.turnRewards.ends.length > 0 ? { turnRewards: x.turnRewards } : {}),
      ...(task.roles ? { context: i, role: x.role } : {}),
    });
  });
}
