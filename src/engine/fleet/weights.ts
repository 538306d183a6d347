// Weight updates of one Fleet engine: pause → update_weights_from_disk (a delta format, falling back
// to the full model directory when the engine refuses it) → continue, then the version check.
import { OozeError } from "../../errors.ts";
import type { Engine } from "./types.ts";

/** Options of Fleet.updateWeights. */
export interface WeightUpdateOptions {
  /** pause_generation mode (default "abort"). */
  mode?: "abort" | "in_place";
  /** load_format sent with model_path, e.g. "ooze-delta" (model_path is then a delta file). Default: none (a model directory). */
  loadFormat?: string;
  /** The same version as a model directory: loaded by engines that refuse the loadFormat update, and by engines that join later. Required with a loadFormat other than auto/safetensors. */
  fullModelDir?: string;
  /** Flush each engine's prefix cache with the update (default true, as SGLang does); false keeps the old weights' KV for reuse. */
  flushCache?: boolean;
}

/** What Fleet.updateWeights did: engines that refused a loadFormat update and loaded fullModelDir instead, with the engine's reason. */
export interface WeightUpdateReport {
  version: string;
  fullFallbacks: { engine: string; reason: string }[];
}

/**
 * Walks one engine through pause_generation(mode) → update_weights_from_disk → continue_generation
 * and checks /get_weight_version; with `load` (a delta format), an engine that refuses it loads the
 * full model directory instead (recorded in `fallbacks`). The dispatches running at the pause are
 * marked as having crossed the update.
 */
export async function updateEngine(
  e: Engine, modelDir: string, version: string, mode: "abort" | "in_place", log: (line: string) => void,
  load: { format: string; fullModelDir: string } | null = null, fallbacks: WeightUpdateReport["fullFallbacks"] = [], flushCache = true,
): Promise<void> {
  await e.ctl.pauseGeneration(mode);
  // Every dispatch running now crosses this update, and is recorded under the version it started on.
  // Marked here, not after the version check: a reply that landed between continue_generation and
  // the check carried the newer version (a fresh-clone failure of the partial-rollout test, Dec 1).
  for (const a of e.attempts) a.crossed = true;
  let updated = false;
  const flush = flushCache ? {} : { flushCache: false };
  try {
    let r = await e.ctl.updateWeightsFromDisk({ modelPath: modelDir, weightVersion: version, ...(load ? { loadFormat: load.format } : {}), ...flush });
    if (!r.success && load && load.fullModelDir !== modelDir) {
      // Recorded and logged: the engine's base differs (restarted) or the file was refused (corrupt).
      log(`fleet: ${e.id} refused the ${load.format} update to '${version}' (${r.message}); loading the full checkpoint ${load.fullModelDir}`);
      fallbacks.push({ engine: e.id, reason: r.message });
      modelDir = load.fullModelDir;
      r = await e.ctl.updateWeightsFromDisk({ modelPath: modelDir, weightVersion: version, ...flush });
    }
    if (!r.success) throw new OozeError("ENGINE_REJECTED", `${e.id}: update_weights_from_disk refused ${modelDir}: ${r.message}`);
    updated = true;
  } finally {
    // Continue even after a failed update: the engine keeps serving its old weights.
    await e.ctl.continueGeneration().catch((err) => {
      if (updated) throw err;
    });
  }
  const v = await e.ctl.weightVersion();
  if (v !== version) throw new OozeError("ENGINE_PROTOCOL", `${e.id}: reports weight version '${String(v)}' after an update to '${version}'`);
  e.weightVersion = v;
}
