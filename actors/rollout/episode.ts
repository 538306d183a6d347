// One episode, token-in/token-out: the prompt's ids go to the engine, the sampled ids and their
// logprobs are appended exactly as returned (EOS included, so the model learns to stop), the task
// sees the turn's ids without EOS, and its observation is appended with loss mask 0. A turn the
// engine aborts (weight update, engine lost) keeps what was sampled and resumes with the remaining
// budget, each span recorded under the weight version that produced it. Without partial rollout, a
// turn that a weight update interrupted is generated again from its start on the new weights.
// Requests are sized to the engines' context (src/engine/limits.ts): an episode that fills it ends
// truncated, never with a request an engine would refuse.
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
}

/** Tokens a request of `inputLen` tokens may ask for on the generator's engines (Infinity when they report no limits). */
function roomFor(gen: Generator, inputLen: number): number {
  const limits = gen.lengthLimits?.() ?? null;
  return limits === null ? Infinity : sendableMaxNewTokens(limits, inputLen);
}

/**
 * Runs one episode of `task` on `gen`; never throws for a model's bad answer, only for engine
 * failures and a prompt that leaves no room in the engines' context (ENGINE_REJECTED). Each request
 * asks for no more than the context leaves; an episode that fills the context ends truncated.
 */
export async function runEpisode(task: Task, gen: Generator, spec: EpisodeSpec): Promise<Sample> {
  const { prompt, promptIds, state: s0 } = task.reset(spec.groupIndex, spec.seed);
  const rolloutId = `r${spec.index}`;
  const b = new SampleBuilder(spec.index, spec.groupIndex, rolloutId, prompt, promptIds);
  let state = s0;
  let truncated = false;
  let turns = 0;
  const turnRewards: { ends: number[]; rewards: number[] } = { ends: [], rewards: [] };
  for (let turn = 0; turn < task.maxTurns; turn++) {
    turns++;
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
        inputIds: b.tokens.slice(),
        sampling: { max_new_tokens: Math.min(budget, room), temperature: spec.temperature, top_p: 1, top_k: -1, sampling_seed: spec.samplingSeed + turn * 1009 + resumes + restarts * 31 },
        sessionId: rolloutId,
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
      if (res.status !== "completed") truncated = true;
    }
    if (!finished) truncated = true;
    const ids = b.tokens.subarray(b.tokens.length - (b.responseLength - turnStart));
    const action = ids.length > 0 && ids[ids.length - 1] === (task.eosId ?? EOS_ID) ? ids.subarray(0, ids.length - 1) : ids;
    const r = task.step(state, action.slice());
    state = r.state;
    if (r.reward !== undefined) turnRewards.ends.push(b.responseLength), turnRewards.rewards.push(r.reward);
    if (r.done) break;
    // An observation after which the engines could not reply ends the episode here, truncated: the
    // sample never holds more than the context, and no request is sent that an engine would refuse.
    if (roomFor(gen, b.tokens.length + r.observation.length) === 0) {
      truncated = true;
      break;
    }
    b.appendEnv(r.observation);
  }
  // success only where the task tests it: rewardStats counts the full reward otherwise
  return b.build(task.reward(state), truncated ? "truncated" : "completed", {
    turns,
    ...(task.success ? { success: task.success(state) } : {}),
    ...(turnRewards.ends.length > 0 ? { turnRewards } : {}),
  });
}
