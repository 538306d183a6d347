// Weight loading for an embedded engine server (`ooze serve`): full checkpoints (a model directory,
// load_format auto/safetensors) as the backend does, and ooze's lossless deltas (load_format
// "ooze-delta", model_path = a delta file written by encodeDelta). A delta is applied to the weights
// the engine serves now — checked by base version and per-tensor checksums, so a delta made from
// other weights is refused and nothing changes — and the result is loaded like a full checkpoint;
// re-applying the delta the engine serves already is a no-op. A LoRA policy's version is a PEFT
// adapter directory naming its policy (POLICY_FILE): the engine serves it under that name over the
// base it has (SGLang's load_lora_adapter), and the base stays. With several policies a version is
// a directory of them (a full policy's a whole model, served under its name beside the base).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { loadNative } from "../../native/load.ts";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import type { LoadWeightsHook } from "../../src/engine/server.ts";
import { OozeError } from "../../src/errors.ts";
import { applyDelta, decodeDelta, tensorLayout, type TensorSlot } from "./delta.ts";
import { adapterBaseDir, policySetOf, isAdapterDir } from "../../native/model-dir.ts";
import { POLICY_FILE, readPolicyFile } from "../protocol/policies.ts";

/** The load_format value of ooze's delta files. */
export const DELTA_LOAD_FORMAT = "ooze-delta";

interface Current {
  config: LlamaHfConfig;
  params: Float32Array;
  layout: TensorSlot[];
}

/** A LoadWeightsHook for `backend`, whose weights were first loaded from `initialDir`. */
export function engineWeightLoader(backend: InferenceBackend, initialDir: string): LoadWeightsHook {
  let fullDir = initialDir;
  // The weights being served, materialised only once deltas are used (reloaded after a full update).
  let current: Current | null = null;
  const materialise = (): Current => {
    if (current) return current;
    const m = loadNative().loadModelDir(fullDir);
    current = { config: m.config, params: m.params, layout: tensorLayout(m.tensors) };
    return current;
  };
  return async ({ modelPath, loadFormat, currentVersion, keepCache }) => {
    const keep = { keepCache: keepCache ?? false };
    const set = loadFormat === null || loadFormat === "auto" ? (isAdapterDir(modelPath) ? [modelPath] : policySetOf(modelPath)) : null;
    if (set) {
      // each policy's directory, checked first: a version is served whole or not at all
      const lora = backend.lora;
      if (!lora) throw new OozeError("BAD_REQUEST", `${modelPath} holds the weights of named policies (LoRA adapters or whole models) and this engine serves no named weights`);
      const named = set.map((dir) => {
        const policy = readPolicyFile(dir);
        if (policy === null)
          throw new OozeError("CHECKPOINT_INVALID", `${dir} has no ${POLICY_FILE}: it does not say which name to serve it under; load it with POST /load_lora_adapter`);
        return { dir, policy };
      });
      // Adapters are over the base their adapter_config.json names: an engine started on other
      // weights (a preset's own initialisation) loads that base first, once. A full policy's
      // directory is a whole model, served under its name beside the base.
      const bases = [...new Set(set.filter((d) => isAdapterDir(d)).map((d) => adapterBaseDir(d)))];
      if (bases.length > 1) throw new OozeError("CHECKPOINT_INVALID", `${modelPath}: its adapters are over different bases (${bases.join(", ")})`);
      if (bases.length === 1 && resolve(bases[0]!) !== resolve(fullDir)) {
        await backend.loadWeights(bases[0]!);
        fullDir = bases[0]!;
        current = null;
      }
      for (const a of named) await lora.load(a.policy, a.dir);
      return;
    }
    if (loadFormat === null || loadFormat === "auto" || loadFormat === "safetensors") {
      await backend.loadWeights(modelPath, keep);
      fullDir = modelPath;
      current = null;
      return;
    }
    if (loadFormat !== DELTA_LOAD_FORMAT)
      throw new OozeError("BAD_REQUEST", `load_format '${loadFormat}' is not supported; use auto/safetensors (a model directory) or ${DELTA_LOAD_FORMAT} (a delta file)`);
    let bytes: Uint8Array;
    try {
      bytes = readFileSync(modelPath);
    } catch (e) {
      throw new OozeError("CHECKPOINT_INVALID", `cannot read weight delta ${modelPath}: ${(e as Error).message}`, { cause: e });
    }
    const delta = decodeDelta(bytes);
    const cur = materialise();
    const next = cur.params.slice(); // applied to a copy: the served weights change only after a successful load
    if (applyDelta(cur.layout, next, currentVersion, delta) === "already-applied") return; // the engine serves the delta's weights already: nothing to load
    const dir = mkdtempSync(join(tmpdir(), "ooze-delta-"));
    try {
      loadNative().saveModelDir(dir, cur.config, next, delta.version);
      await backend.loadWeights(dir, keep);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    current = { ...cur, params: next };
  };
}
