// Model directories (config.json + model.safetensors): create one from a preset or config with
// random weights, and read a directory's config.
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { OozeError } from "../src/errors.ts";
import type { LlamaHfConfig } from "./index.d.ts";
import { loadNative } from "./load.ts";
import { isPresetName, PRESETS } from "./presets.ts";

/** A preset name or a full config → the config (throws CONFIG_INVALID for an unknown preset). */
export function resolveConfig(presetOrConfig: string | LlamaHfConfig): LlamaHfConfig {
  if (typeof presetOrConfig !== "string") return presetOrConfig;
  if (!isPresetName(presetOrConfig))
    throw new OozeError(
      "CONFIG_INVALID",
      `unknown model preset '${presetOrConfig}'; choose one of: ${Object.keys(PRESETS).join(", ")}`,
    );
  return { ...PRESETS[presetOrConfig] };
}

/**
 * Writes a randomly initialised model (weights ~ N(0, 0.02²), norms 1; deterministic per seed) to
 * `outDir` as a valid HF checkpoint. Returns the config written.
 */
export async function initModelDir(
  presetOrConfig: string | LlamaHfConfig,
  outDir: string,
  seed = 0,
): Promise<LlamaHfConfig> {
  const config = resolveConfig(presetOrConfig);
  const native = loadNative();
  let params: Float32Array;
  try {
    params = native.initModelParams(config, seed, 0.02);
    native.saveModelDir(outDir, config, params, null);
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `cannot write model to ${outDir}: ${(e as Error).message}`, { cause: e });
  }
  return readModelConfig(outDir);
}

const REQUIRED = [
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
] as const;

/** Reads and checks `dir`/config.json (no native addon needed). Fills HF defaults for optional fields. */
export async function readModelConfig(dir: string): Promise<LlamaHfConfig> {
  const path = join(dir, "config.json");
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, "utf8"));
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `${path}: cannot read config: ${(e as Error).message}`, { cause: e });
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new OozeError("CHECKPOINT_INVALID", `${path}: config must be a JSON object`);
  const o = raw as Record<string, unknown>;
  for (const k of REQUIRED)
    if (typeof o[k] !== "number" || !Number.isInteger(o[k]) || (o[k] as number) <= 0)
      throw new OozeError("CHECKPOINT_INVALID", `${path}: field '${k}' must be a positive integer`);
  const rp = typeof o.rope_parameters === "object" && o.rope_parameters !== null ? (o.rope_parameters as Record<string, unknown>) : null;
  const first = (v: unknown, d: number) => (Array.isArray(v) ? Number(v[0]) : typeof v === "number" ? v : d);
  return {
    ...o,
    vocab_size: o.vocab_size as number,
    hidden_size: o.hidden_size as number,
    intermediate_size: o.intermediate_size as number,
    num_hidden_layers: o.num_hidden_layers as number,
    num_attention_heads: o.num_attention_heads as number,
    num_key_value_heads: typeof o.num_key_value_heads === "number" ? o.num_key_value_heads : (o.num_attention_heads as number),
    rms_norm_eps: typeof o.rms_norm_eps === "number" ? o.rms_norm_eps : 1e-6,
    // transformers 5 keeps rope_theta inside rope_parameters (4.x beside it, as ooze also writes it)
    rope_theta: typeof o.rope_theta === "number" ? o.rope_theta : typeof rp?.rope_theta === "number" ? rp.rope_theta : 10000,
    max_position_embeddings: typeof o.max_position_embeddings === "number" ? o.max_position_embeddings : 2048,
    tie_word_embeddings: o.tie_word_embeddings === true,
    bos_token_id: first(o.bos_token_id, 1),
    eos_token_id: first(o.eos_token_id, 2),
  };
}
