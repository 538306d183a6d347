// The contract between an inference server and the model that computes for it. `ooze serve`
// (the SGLang-compatible HTTP server) drives an InferenceBackend; the native engine implements it.
// The core never imports native/: the backend is injected.

/** Sampling settings after SGLang defaults have been applied and validated. */
export interface BackendSampling {
  /** null = no cap (bounded by the model's context). */
  maxNewTokens: number | null;
  /** < 1e-6 means greedy. */
  temperature: number;
  /** (0, 1]. */
  topP: number;
  /** -1 = all. */
  topK: number;
  minNewTokens: number;
  /** Token ids that end generation, in addition to the model's EOS unless ignoreEos. */
  stopTokenIds: readonly number[];
  ignoreEos: boolean;
  /** Same seed and inputs → same tokens. null = a fresh random seed. */
  seed: number | null;
}

/** Why a request finished, in SGLang's shapes. */
export type FinishReason =
  | { type: "stop"; matched: number | string }
  | { type: "length"; length: number }
  | { type: "abort"; message: string };

/** One sampled token of one request, from one backend step. */
export interface TokenEvent {
  rid: string;
  tokenId: number;
  /** Log-probability of tokenId under the temperature-scaled distribution it was sampled from. */
  logprob: number;
  /** Set on the request's last token. */
  finished: FinishReason | null;
}

export interface BackendAdmission {
  /** Prompt tokens whose keys/values came from the prefix cache. */
  cachedTokens: number;
}

export interface BackendModelInfo {
  /** Directory or preset the weights came from. */
  modelPath: string;
  /** The HF config.json contents. */
  config: Record<string, unknown>;
  eosTokenId: number;
  maxContext: number;
}

export interface BackendCacheStats {
  /** Tokens held in the radix prefix cache. */
  cachedTokens: number;
  budgetTokens: number;
  /** Totals since start: prompt tokens seen, and those served from cache. */
  promptTokens: number;
  hitTokens: number;
}

/** A LoRA adapter a backend serves, as the server lists it. */
export interface BackendLoraAdapter {
  name: string;
  /** The PEFT directory it was read from (or, `full`, the model directory). */
  path: string;
  /** ooze: a whole model of the base's architecture served under the name (rank 0, no targets). */
  full?: boolean;
  rank: number;
  alpha: number;
  /** PEFT module names ("q_proj", …). */
  targets: string[];
}

/** LoRA adapters over the base model (SGLang's LoRA API), for backends that can serve them. */
export interface BackendLora {
  /**
   * Reads the PEFT adapter directory `path` (adapter_config.json + adapter_model.safetensors) and
   * serves it as `name`, replacing an adapter of that name: requests admitted before keep the old
   * one to their end. Throws OozeError("CHECKPOINT_INVALID") naming the file and field or tensor.
   * ooze: `path` may also be a model directory of the base's architecture (a policy of its own full
   * weights), served under `name` the same way on those weights.
   */
  load(name: string, path: string): Promise<BackendLoraAdapter>;
  /** Stops serving `name` (running requests finish with it); false if it was not loaded. */
  unload(name: string): boolean;
  /** The loaded adapters, by name. */
  list(): BackendLoraAdapter[];
}

/**
 * An inference engine with continuous batching: requests are added at any time; each `step()`
 * runs prefill for newly added requests and one decode step for every running request, together,
 * and returns one TokenEvent per request that produced a token.
 */
export interface InferenceBackend {
  readonly info: BackendModelInfo;
  /**
   * Admit a request, under LoRA adapter `lora` when given (null: the base). Throws
   * OozeError("BAD_REQUEST") if the prompt is longer than the context or the adapter is not loaded.
   */
  add(rid: string, inputIds: Int32Array, sampling: BackendSampling, lora?: string | null): BackendAdmission;
  /** LoRA adapters; absent or null: this backend serves the base only, and the server refuses `lora_path`. */
  readonly lora?: BackendLora | null;
  /** One scheduling iteration, off the event loop. Resolves with [] when nothing is running. */
  step(): Promise<TokenEvent[]>;
  /** Drop a request (its partial sequence may stay in the prefix cache). Unknown rids are ignored. */
  abort(rid: string): void;
  /** Requests admitted and not finished. */
  running(): number;
  /** Empty the prefix cache; false (nothing flushed) while requests hold cache locks. */
  flushCache(): boolean;
  cacheStats(): BackendCacheStats;
  /**
   * Replace the weights from a model directory (config must match). Flushes the prefix cache unless
   * opts.keepCache (SGLang's flush_cache false: cached prefixes are reused under the new weights).
   */
  loadWeights(dir: string, opts?: { keepCache?: boolean }): Promise<void>;
  /** Release native memory. */
  close(): void;
}
