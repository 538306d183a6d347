// The rollout side of one step: n episodes for each of a range of prompts, all in flight together
// on the engines, each group closed with the number of samples it produced. An episode that fails on
// an engine error is retried (one an engine refused, ENGINE_REJECTED, is not); one that still fails
// becomes a `failed` sample (the buffer drops it) with the reason in its metadata and the log, so
// every sample index is accounted for.
import type { Generator } from "./generator.ts";
import type { Sample } from "../../src/sample.ts";
import type { Task } from "../environment/task.ts";
import { OozeError } from "../../src/errors.ts";
import { runEpisode, slotsOf, type EpisodeSpec } from "./episode.ts";

/** Where a rollout starts in the job's data stream, and how much it produces. */
export interface RolloutRange {
  /** First prompt index (the task's reset index and the group index). */
  firstPrompt: number;
  prompts: number;
  /** Sample indices per prompt: its episodes × the samples one episode may yield (`slots`). */
  samplesPerPrompt: number;
  /** Index of the first sample produced. */
  firstSample: number;
}

/** Samples of a rollout and the size of each group. */
export interface RolloutResult {
  samples: Sample[];
  groups: { groupIndex: number; count: number }[];
  seconds: number;
  failures: number;
}

/** Options of a rollout. */
export interface RolloutOptions {
  seed: number;
  temperature: number;
  /** Attempts per episode before it is recorded as failed (default 3). */
  attempts?: number;
  /** Called with each finished sample (for streaming to a buffer). */
  onSample?: (s: Sample) => void;
  /** Partial rollout on weight updates (default true; see EpisodeSpec.partialRollout). */
  partialRollout?: boolean;
  /** Abandons the rollout: episodes stop at once and end as `failed` samples, not retried. */
  signal?: AbortSignal;
  /** Told why each failed episode failed. */
  log?: (line: string) => void;
  /** A task of several roles: each role's policy and adapter (EpisodeSpec.roles); its episodes own one sample index per role. */
  roles?: EpisodeSpec["roles"];
}

/**
 * Runs the episodes of `prompts` prompts: samplesPerPrompt / slots each, where slots is the task's
 * roles (1 without); episode k of prompt p owns sample indices firstSample + p·samplesPerPrompt +
 * k·slots onwards, one per context.
 */
export async function rolloutRange(task: Task, gen: Generator, range: RolloutRange, opts: RolloutOptions): Promise<RolloutResult> {
  const t0 = performance.now();
  const slots = slotsOf(opts.roles);
  const n = Math.max(1, Math.floor(range.samplesPerPrompt / slots));
  let failures = 0;
  const jobs: Promise<Sample[]>[] = [];
  for (let p = 0; p < range.prompts; p++) {
    const groupIndex = range.firstPrompt + p;
    for (let k = 0; k < n; k++) {
      const index = range.firstSample + p * range.samplesPerPrompt + k * slots;
      jobs.push(
        (async () => {
          const attempts = opts.attempts ?? 3;
          let lastErr: unknown = null;
          for (let a = 0; a < attempts; a++) {
            try {
              const s = await runEpisode(task, gen, {
                index, groupIndex, seed: opts.seed, temperature: opts.temperature,
                samplingSeed: (opts.seed * 1_000_003 + index * 7919 + a * 104729) >>> 0,
                ...(opts.partialRollout !== undefined ? { partialRollout: opts.partialRollout } : {}),
                ...(opts.signal ? { signal: opts.signal } : {}),
                ...(opts.roles ? { roles: opts.roles } : {}),
              });
              for (const x of s) opts.onSample?.(x);
              return s;
            } catch (e) {
              lastErr = e;
              if (opts.signal?.aborted) break;
              // Refused by an engine (or too long for any): the same prompt would be refused again.
              if (e instanceof OozeError && e.code === "ENGINE_REJECTED") break;
            }
          }
          failures++;
          opts.log?.(`rollout: episode ${index} (prompt ${groupIndex}) failed: ${lastErr instanceof Error ? lastErr.message : String(lastErr)}`);
          const { prompt, promptIds } = task.reset(groupIndex, opts.seed);
          const failed: Sample = {
            index, groupIndex, rolloutId: `r${index}`, prompt, tokens: promptIds.slice(), responseLength: 0,
            lossMask: new Uint8Array(0), rolloutLogprobs: new Float32Array(0), reward: null, status: "failed",
            weightVersions: [], metadata: {
              error: lastErr instanceof Error ? lastErr.message : String(lastErr),
              ...(lastErr instanceof OozeError ? { errorCode: lastErr.code } : {}),
            },
          };
          opts.onSample?.(failed);
          return [failed];
        })(),
      );
    }
  }
  const samples = (await Promise.all(jobs)).flat();
  const groups = [];
  for (let p = 0; p < range.prompts; p++) {
    const groupIndex = range.firstPrompt + p;
    groups.push({ groupIndex, count: samples.filter((s) => s.groupIndex === groupIndex).length });
  }
  return { samples, groups, seconds: (performance.now() - t0) / 1000, failures };
}
