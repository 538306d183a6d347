// Model directories (config.json + model.safetensors): create one from a preset, a family's shape
// (with a real tokenizer copied beside it) or a config with random weights, and read a directory's config.
import { copyFileSync, existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { OozeError } from "../src/errors.ts";
import type { LlamaHfConfig } from "./index.d.ts";
import { loadNative } from "./load.ts";
import { ARCHS, familyConfig, isPresetName, PRESETS, SIZES, type Arch, type Size } from "./presets.ts";

/**
 * The weights file of a checkpoint directory: `model.safetensors` (an HF model directory) or
 * `adapter_model.safetensors` (a PEFT adapter directory, whose adapter_config.json names its base
 * model's directory in base_model_name_or_path); null when it has neither.
 */
export function weightsFileOf(dir: string): "model.safetensors" | "adapter_model.safetensors" | null {
  if (existsSync(join(dir, "model.safetensors"))) return "model.safetensors";
  if (existsSync(join(dir, "adapter_model.safetensors")) && existsSync(join(dir, "adapter_config.json"))) return "adapter_model.safetensors";
  return null;
}

/**
 * The policy directories of a version of several policies: the subdirectories of `dir` that hold
 * weights (a PEFT adapter directory per LoRA policy, a model directory per full policy), sorted by
 * name; null when `dir` is itself a model or adapter directory or has none.
 */
export function policySetOf(dir: string): string[] | null {
  if (weightsFileOf(dir) !== null || !existsSync(dir)) return null;
  const subs = readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory() && weightsFileOf(join(dir, e.name)) !== null)
    .map((e) => join(dir, e.name))
    .sort();
  return subs.length > 0 ? subs : null;
}

/** Whether `dir` holds a checkpoint's weights: a model, an adapter, or a set of policies'. */
export function hasWeights(dir: string): boolean {
  return weightsFileOf(dir) !== null || policySetOf(dir) !== null;
}

/** Bytes of a checkpoint's weights files (a model's, an adapter's, or a set of policies'); 0 when it has none. */
export function weightsBytes(dir: string): number {
  const one = (d: string) => {
    const f = weightsFileOf(d);
    return f ? statSync(join(d, f)).size : 0;
  };
  return weightsFileOf(dir) !== null ? one(dir) : (policySetOf(dir) ?? []).reduce((n, d) => n + one(d), 0);
}

/** Whether `dir` is a PEFT adapter directory (and not a model directory). */
export function isAdapterDir(dir: string): boolean {
  return weightsFileOf(dir) === "adapter_model.safetensors";
}

/**
 * The base model directory a PEFT adapter directory was trained over (its adapter_config.json's
 * base_model_name_or_path, relative paths taken from the adapter directory); throws
 * CHECKPOINT_INVALID naming the file when it is missing or is not a model directory.
 */
export function adapterBaseDir(dir: string): string {
  const file = join(dir, "adapter_config.json");
  let base: unknown;
  try {
    base = (JSON.parse(readFileSync(file, "utf8")) as { base_model_name_or_path?: unknown }).base_model_name_or_path;
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `${file}: cannot read (${(e as Error).message})`, { cause: e });
  }
  if (typeof base !== "string" || base === "")
    throw new OozeError("CHECKPOINT_INVALID", `${file}: base_model_name_or_path is not set; ooze needs the base model's directory there to load the adapter`);
  const abs = resolve(dir, base);
  if (!existsSync(join(abs, "config.json")))
    throw new OozeError("CHECKPOINT_INVALID", `${file}: base_model_name_or_path '${base}' is not a model directory (no ${join(abs, "config.json")}); a hub model id cannot be fetched here`);
  return abs;
}

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
 * Writes a randomly initialised model (weights ~ N(0, std²), std 0.02 as HF by default; norms 1;
 * deterministic per seed) to `outDir` as a valid HF checkpoint. Returns the config written.
 */
export async function initModelDir(
  presetOrConfig: string | LlamaHfConfig,
  outDir: string,
  seed = 0,
  std = 0.02,
): Promise<LlamaHfConfig> {
  const config = resolveConfig(presetOrConfig);
  const native = loadNative();
  let params: Float32Array;
  try {
    params = native.initModelParams(config, seed, std);
    native.saveModelDir(outDir, config, params, null);
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `cannot write model to ${outDir}: ${(e as Error).message}`, { cause: e });
  }
  return readModelConfig(outDir);
}

/** The tokenizer files copied into a model directory (those present; tokenizer.json and tokenizer_config.json required). */
const TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt"];

/** What `initFamilyModelDir` writes. */
export interface FamilyInit {
  arch: string;
  size: string;
  outDir: string;
  seed?: number;
  /** A directory with the family's tokenizer.json and tokenizer_config.json; null: none (the byte tokenizer's ids then). */
  tokenizerDir?: string | null;
}

/**
 * Writes a random checkpoint of a family's shape (`ooze model init --arch`). With a tokenizer
 * directory, its files are copied beside the weights and the config takes the tokenizer's BOS/EOS ids
 * (and a vocabulary at least as large as its ids); without one, BOS/EOS are the byte tokenizer's so
 * that the built-in tasks run on it. Returns the config written.
 */
export async function initFamilyModelDir(opts: FamilyInit): Promise<LlamaHfConfig> {
  if (!(ARCHS as readonly string[]).includes(opts.arch))
    throw new OozeError("CONFIG_INVALID", `unknown --arch '${opts.arch}'; choose one of: ${ARCHS.join(", ")}`);
  if (!(SIZES as readonly string[]).includes(opts.size))
    throw new OozeError("CONFIG_INVALID", `unknown --size '${opts.size}'; choose one of: ${SIZES.join(", ")}`);
  const config = familyConfig(opts.arch as Arch, opts.size as Size);
  const tok = opts.tokenizerDir ? readTokenizerIds(opts.tokenizerDir) : null;
  if (tok) {
    config.vocab_size = Math.max(config.vocab_size, tok.size);
    config.eos_token_id = tok.eos;
    if (tok.bos !== null) config.bos_token_id = tok.bos;
  } else {
    const { BOS_ID, EOS_ID } = await import("../src/engine/tokenizer.ts");
    config.bos_token_id = BOS_ID, config.eos_token_id = EOS_ID;
  }
  const written = await initModelDir(config, opts.outDir, opts.seed ?? 0);
  if (opts.tokenizerDir)
    for (const f of TOKENIZER_FILES)
      if (existsSync(join(opts.tokenizerDir, f))) copyFileSync(join(opts.tokenizerDir, f), join(opts.outDir, f));
  return written;
}

/** The ids a tokenizer directory gives BOS and EOS, and one past its largest id. */
function readTokenizerIds(dir: string): { size: number; bos: number | null; eos: number } {
  const read = (f: string): Record<string, unknown> => {
    const path = join(dir, f);
    try {
      return JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
    } catch (e) {
      throw new OozeError("CONFIG_INVALID", `--tokenizer ${dir}: cannot read ${f} (${(e as Error).message}); give a directory with the model's tokenizer.json and tokenizer_config.json`, { cause: e });
    }
  };
  const tj = read("tokenizer.json"), tc = read("tokenizer_config.json");
  const ids = new Map<string, number>();
  const vocab = (tj.model as { vocab?: Record<string, number> } | undefined)?.vocab ?? {};
  for (const [k, v] of Object.entries(vocab)) ids.set(k, v);
  for (const a of (tj.added_tokens ?? []) as { id: number; content: string }[]) ids.set(a.content, a.id);
  let size = 0;
  for (const v of ids.values()) size = Math.max(size, v + 1);
  const name = (v: unknown): string | null => (typeof v === "string" ? v : v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string" ? (v as { content: string }).content : null);
  const idOf = (field: string): number | null => {
    const tokenName = name(tc[field]);
    if (tokenName === null) return null;
    const id = ids.get(tokenName);
    if (id === undefined) throw new OozeError("CONFIG_INVALID", `--tokenizer ${dir}: tokenizer_config.json ${field} '${tokenName}' is not a token of tokenizer.json`);
    return id;
  };
  const eos = idOf("eos_token");
  if (eos === null) throw new OozeError("CONFIG_INVALID", `--tokenizer ${dir}: tokenizer_config.json has no eos_token`);
  return { size, bos: idOf("bos_token"), eos };
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
