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

/**
 * An inference engine with continuous batching: requests are added at any time; each `step()`
 * runs prefill for newly added requests and one decode step for every running request, together,
 * and returns one TokenEvent per request that produced a token.
 */
export interface InferenceBackend {
  readonly info: BackendModelInfo;
  /** Admit a request. Throws OozeError("BAD_REQUEST") if the prompt is longer than the context. */
  add(rid: string, inputIds: Int32Array, sampling: BackendSampling): BackendAdmission;
  /** One scheduling iteration, off the event loop. Resolves with [] when nothing is running. */
  step(): Promise<TokenEvent[]>;
  /** Drop a request (its partial sequence may stay in the prefix cache). Unknown rids are ignored. */
  abort(rid: string): void;
  /** Requests admitted and not finished. */
  running(): number;
  /** Empty the prefix cache; false (nothing flushed) while requests hold cache locks. */
  flushCache(): boolean;
  cacheStats(): BackendCacheStats;
  /** Replace the weights from a model directory (config must match). Flushes the prefix cache. */
  loadWeights(dir: string): Promise<void>;
  /** Release native memory. */
  close(): void;
}
