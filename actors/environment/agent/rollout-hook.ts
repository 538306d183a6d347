// The rollout's side of agent environments (train.agent): a gateway on loopback over the rollout's
// fleet, the agent task module, and the model's tokenizer and chat template (a model directory's
// own, or the built-in ones of the byte-level presets). The rollout actor calls `group` instead of
// rolloutRange when the topology names an agent; nothing else in the rollout changes.
import { policySpecs } from "../../protocol/policies.ts";
import { setMaxListeners } from "node:events";
import { existsSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { Gateway, loadHfChatModel, type Generator } from "../../../src/gateway/index.ts";
import { decodeBytes } from "../../../src/engine/tokenizer.ts";
import type { Sample } from "../../../src/sample.ts";
import { readModelConfig } from "../../../native/model-dir.ts";
import { PRESETS, isPresetName } from "../../../native/presets.ts";
import type { TrainConfig } from "../../protocol/config.ts";
import { OozeError } from "../../../src/errors.ts";
import { sweepDeadOwners } from "../../../src/owned-dirs.ts";
import type { AgentConfig } from "../../protocol/agent-config.ts";
import { runAgentGroup } from "./group.ts";
import { assertSandboxWorks } from "./sandbox.ts";
import { loadAgentTask } from "./task.ts";

/** A rollout's agent environment: runs prompt groups of agent episodes. */
export interface AgentRollout {
  readonly gateway: Gateway;
  /** The group's episodes (prompt message: `samples` sample indices from firstSample = episodes × maxSegments). */
  group(p: { groupIndex: number; firstSample: number; samples: number }, onSample?: (s: Sample) => void, signal?: AbortSignal): Promise<Sample[]>;
  /**
   * Ends every running episode (their sandboxes or process groups: SIGTERM, SIGKILL after killGraceS)
   * and resolves once all are gone; the groups they belonged to reject (ACTOR_STOPPED), so their
   * prompts are redelivered, not recorded as failed.
   */
  stop(): Promise<void>;
  /** stop(), then the gateway. */
  close(): Promise<void>;
}

/** Starts the gateway and loads the agent task for a topology's `train:` section (train.agent set). */
export async function startAgentRollout(train: TrainConfig & { agent: AgentConfig }, baseDir: string, fleet: Generator, log: (line: string) => void = () => undefined): Promise<AgentRollout> {
  // The sandbox is checked before anything runs: a machine that cannot make it refuses the job, saying why.
  if (train.agent.sandbox === "none") log("rollout: WARNING train.agent.sandbox is 'none': agent and reward commands run unconfined, as ooze's user (they can read its files, the NATS token, and other episodes' sessions)");
  else assertSandboxWorks();
  for (const d of sweepDeadOwners("ooze-agent-")) log(`rollout: removed ${d}, an episode directory a job that is gone left behind`);
  const task = await loadAgentTask(train.task, train.taskConfig, baseDir);
  const modelDir = train.model === undefined ? null : isAbsolute(train.model) ? train.model : resolve(baseDir, train.model);
  let contextLength: number;
  if (modelDir) contextLength = (await readModelConfig(modelDir)).max_position_embeddings;
  else if (isPresetName(train.preset)) contextLength = PRESETS[train.preset].max_position_embeddings;
  else throw new OozeError("CONFIG_INVALID", `train.preset '${train.preset}' is not a preset (${Object.keys(PRESETS).join(", ")})`);
  const hf = modelDir && existsSync(resolve(modelDir, "tokenizer.json")) ? loadHfChatModel(modelDir) : null;
  // Several policies: the request's model field picks the one that samples and learns the turn.
  const specs = policySpecs(train.policies);
  const policies = specs.length > 1 ? Object.fromEntries(specs.map((p) => [p.name, { lora: p.served }])) : null;
  const gateway = await Gateway.start({ fleet, contextLength, policies, ...(hf ? { tokenizer: hf.tokenizer, chatTemplate: hf.chatTemplate } : {}) });
  const decode = hf ? (ids: Int32Array) => hf.tokenizer.decode(ids, false) : (ids: Int32Array) => decodeBytes(ids, false);
  const deps = { sessions: gateway, task, agent: train.agent, baseDir, decode };
  const stopping = new AbortController();
  // every running episode listens to it once (Node warns past 10 listeners, a leak it cannot tell from
  // 64 episodes in flight); the episodes of one group share `sig` below the same way
  setMaxListeners(0, stopping.signal);
  const running = new Set<Promise<unknown>>();
  const stop = async () => {
    stopping.abort();
    await Promise.allSettled([...running]);
  };
  return {
    gateway,
    group(p, onSample, signal) {
      if (stopping.signal.aborted) return Promise.reject(new OozeError("ACTOR_STOPPED", `rollout stopping: group ${p.groupIndex} is left for the next rollout`));
      const episodes = Math.max(1, Math.floor(p.samples / train.agent.maxSegments));
      const sig = signal ? AbortSignal.any([signal, stopping.signal]) : stopping.signal;
      setMaxListeners(0, sig);
      const run = runAgentGroup(deps, { groupIndex: p.groupIndex, firstSample: p.firstSample, episodes, seed: train.seed, temperature: train.temperature, signal: sig }, onSample).then((samples) => {
        if (stopping.signal.aborted) throw new OozeError("ACTOR_STOPPED", `rollout stopping: the episodes of group ${p.groupIndex} were ended; its prompt is redelivered`);
        return samples;
      });
      running.add(run);
      void run.then(() => running.delete(run), () => running.delete(run));
      return run;
    },
    stop,
    close: async () => {
      await stop();
      await gateway.close();
    },
  };
}
