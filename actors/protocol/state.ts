// A run's resumable position: which step it reached, the next prompt and sample index of the data
// stream (and, in fully_async mode, the prompt groups in flight), the weight version, and wall time used. Saved with every checkpoint (state.json beside the
// weights and optimizer) and pointed to by DIR/checkpoints/latest.json, written last and atomically.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { OozeError } from "../../src/errors.ts";
import { hasWeights } from "../../native/model-dir.ts";
import type { PendingGroup } from "./messages.ts";

export type { PendingGroup };

/** Where a run stands between two steps. */
export interface RunState {
  /** Steps completed. */
  step: number;
  /** The next prompt index to generate from (the data position). */
  nextPrompt: number;
  /** The next sample index. */
  nextSample: number;
  /** Weight version of the checkpoint's weights (= steps trained). */
  weightVersion: number;
  /** Wall seconds used by the run so far. */
  seconds: number;
  /**
   * fully_async: prompt groups launched before the checkpoint and not yet trained or dropped (in
   * flight, or complete and waiting). A resumed run generates them again first, from their prompt
   * index, with the same sample indices (the run after the checkpoint never happened).
   */
  pending?: PendingGroup[];
}

/** Directory of the checkpoint after `step`. */
export function checkpointDir(out: string, step: number): string {
  return join(out, "checkpoints", `step-${String(step).padStart(6, "0")}`);
}

function writeAtomic(path: string, text: string): void {
  writeFileSync(`${path}.tmp`, text);
  renameSync(`${path}.tmp`, path);
}

/** Records a complete checkpoint (its weights must already be in `dir`) as the latest. */
export function commitCheckpoint(out: string, dir: string, state: RunState): void {
  mkdirSync(join(out, "checkpoints"), { recursive: true });
  writeAtomic(join(dir, "state.json"), JSON.stringify(state, null, 2));
  writeAtomic(join(out, "checkpoints", "latest.json"), JSON.stringify({ dir, ...state }, null, 2));
}

/** The latest checkpoint of a run directory, or null when it has none. */
export function latestCheckpoint(out: string): { dir: string; state: RunState } | null {
  const p = join(out, "checkpoints", "latest.json");
  if (!existsSync(p)) return null;
  let j: RunState & { dir: string };
  try {
    j = JSON.parse(readFileSync(p, "utf8")) as RunState & { dir: string };
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `${p}: cannot read (${(e as Error).message}); remove it to start over`, { cause: e });
  }
  if (!hasWeights(j.dir))
    throw new OozeError("CHECKPOINT_INVALID", `${p} points to ${j.dir}, which has no model.safetensors (nor a LoRA adapter)`);
  const { dir, ...state } = j;
  return { dir, state };
}

/** Removes all but the newest `keep` checkpoint directories of a run (the latest is always kept). */
export function pruneCheckpoints(out: string, keep: number): void {
  const root = join(out, "checkpoints");
  if (!existsSync(root)) return;
  const dirs = readdirSync(root).filter((d) => /^step-\d+$/.test(d)).sort();
  for (const d of dirs.slice(0, Math.max(0, dirs.length - Math.max(1, keep)))) rmSync(join(root, d), { recursive: true, force: true });
}
