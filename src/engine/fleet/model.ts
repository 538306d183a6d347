// What identifies the model an engine serves (architecture, model type, config dimensions, vocabulary,
// context length) as discovered from /model_info and /server_info, the comparison the fleet uses to
// refuse an engine that serves a different model, and the order of weight versions.

/** Fields compared between engines; each is compared only when both sides report it. */
export const MODEL_KEYS = [
  "architectures",
  "model_type",
  "vocab_size",
  "hidden_size",
  "intermediate_size",
  "num_hidden_layers",
  "num_attention_heads",
  "num_key_value_heads",
  "context_length",
  "tie_word_embeddings",
] as const;

/** The identifying fields of a served model (absent when the engine does not report them). */
export type ModelSignature = Partial<Record<(typeof MODEL_KEYS)[number], unknown>>;

const asObject = (v: unknown): Record<string, unknown> | null =>
  v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : null;

/**
 * Builds a signature from /model_info and /server_info. Dimensions are read from the top level,
 * from a nested `config` / `hf_config` object when the server sends one, and `context_length`
 * also from `max_position_embeddings`.
 */
export function modelSignature(modelInfo: Record<string, unknown>, serverInfo: Record<string, unknown>): ModelSignature {
  const sources = [modelInfo, asObject(modelInfo.config), asObject(modelInfo.hf_config), serverInfo].filter((s): s is Record<string, unknown> => s !== null);
  const sig: ModelSignature = {};
  for (const k of MODEL_KEYS) {
    for (const s of sources) {
      const v = s[k];
      if (v !== undefined && v !== null) {
        sig[k] = v;
        break;
      }
    }
  }
  if (sig.context_length === undefined) {
    for (const s of sources) {
      if (typeof s.max_position_embeddings === "number") {
        sig.context_length = s.max_position_embeddings;
        break;
      }
    }
  }
  return sig;
}

/** Normalises an expected model (a signature, or an HF config.json object) to a signature. */
export function expectedSignature(expect: Record<string, unknown>): ModelSignature {
  return modelSignature(expect, {});
}

/** Differences between two signatures, as readable lines ("hidden_size: 64 here, 128 expected"). */
export function signatureDiff(got: ModelSignature, want: ModelSignature): string[] {
  const out: string[] = [];
  for (const k of MODEL_KEYS) {
    const a = got[k];
    const b = want[k];
    if (a === undefined || b === undefined) continue;
    if (JSON.stringify(a) !== JSON.stringify(b)) out.push(`${k}: ${JSON.stringify(a)} (this engine) vs ${JSON.stringify(b)} (expected)`);
  }
  return out;
}

/** Orders weight versions: numeric-aware ("v9" < "v10", "2" < "10"); negative when a < b. */
export function compareVersions(a: string, b: string): number {
  return a.localeCompare(b, "en", { numeric: true, sensitivity: "base" });
}

/**
 * Whether weight version `a` is `b` or later, for telling an engine behind its fleet: numerically
 * where both are numbers, otherwise only when equal (an SGLang server's "default" is no version of
 * the job's, though compareVersions would order it after "6").
 */
export function versionAtLeast(a: string, b: string): boolean {
  if (a === b) return true;
  return isJobVersion(a) && isJobVersion(b) && Number(a) >= Number(b);
}

/** Whether `v` is one of a job's weight versions (a number), not an engine's own label such as SGLang's "default". */
export function isJobVersion(v: string): boolean {
  return v.trim() !== "" && Number.isFinite(Number(v));
}
