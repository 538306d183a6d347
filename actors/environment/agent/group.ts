// A prompt group of agent episodes: samplesPerPrompt episodes run together, episode k owning the
// sample indices [firstSample + k·maxSegments, firstSample + (k+1)·maxSegments), so every index is
// a function of (group, episode, segment) and a redelivered group reproduces the same ones.
import type { Sample } from "../../../src/sample.ts";
import { runAgentEpisode, type AgentDeps } from "./episode.ts";

/** One group's place in the job. */
export interface AgentGroupSpec {
  groupIndex: number;
  /** First index of the group's range (episodes × maxSegments indices). */
  firstSample: number;
  episodes: number;
  seed: number;
  temperature: number;
  signal?: AbortSignal;
}

/** Runs a group's episodes concurrently; resolves with all their samples (index order). */
export async function runAgentGroup(deps: AgentDeps, g: AgentGroupSpec, onSample?: (s: Sample) => void): Promise<Sample[]> {
  const per = deps.agent.maxSegments;
  const runs = [];
  for (let k = 0; k < g.episodes; k++) {
    const firstIndex = g.firstSample + k * per;
    runs.push(
      runAgentEpisode(deps, {
        groupIndex: g.groupIndex, episode: k, firstIndex, seed: g.seed, temperature: g.temperature,
        samplingSeed: (g.seed * 1_000_003 + firstIndex * 7919) >>> 0,
        ...(g.signal ? { signal: g.signal } : {}),
      }).then((samples) => {
        for (const s of samples) onSample?.(s);
        return samples;
      }),
    );
  }
  return (await Promise.all(runs)).flat();
}
