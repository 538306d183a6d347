// Types of every export of the native addon. Each module adds its section here.
import type { PolicyLossConfig, PolicyLossMetrics } from "../src/algorithms/losses.ts";
import type { ValueLossMetrics } from "../src/algorithms/value-loss.ts";

/** The native addon's exports. */
export interface NativeAddon {
  /** Names of the modules compiled into this build. */
  readonly modules: readonly string[];

  // --- training (train_binding.cc) ---
  /** The native trainer: forward/backward over packed sequences, policy losses, AdamW. */
  readonly Trainer: NativeTrainerConstructor;
  /** The policy loss alone (same code as the Trainer's), synchronous: metrics and dL/dlogprobs, dL/dentropy. */
  policyLoss(inputs: NativePolicyLossInputs, loss: Partial<NativeLossConfig>): NativePolicyLossResult;
  /** The critic's clipped value loss alone (same code as the Trainer's), synchronous; valueCoef 0 counts as 1. */
  valueLoss(inputs: NativeValueLossInputs, loss: Partial<NativeLossConfig>): { metrics: ValueLossMetrics & { loss: number }; dValues: Float32Array };

  // --- checkpoints (checkpoint.cc) and the inference engine (engine_napi.cc) ---
  /** Reads config.json + model.safetensors (or sharded index); F32/BF16/F16. Sync. Throws naming file and tensor. */
  loadModelDir(dir: string): LoadedModel;
  /** Writes config.json + model.safetensors (F32, layout order) atomically; creates dir. Sync. */
  saveModelDir(dir: string, config: LlamaHfConfig, params: Float32Array, weightVersion?: string | null): void;
  /** Flat params initialised as HF does (Linear/embedding ~ N(0, std²), norms 1); deterministic per seed. */
  initModelParams(config: LlamaHfConfig, seed: number, std?: number): Float32Array;
  /** The flat tensor layout for a config (validated and normalised). */
  modelLayout(config: LlamaHfConfig): { config: LlamaHfConfig; numel: number; tensors: TensorLayout[] };
  /** The inference engine (continuous batching, KV slot pool, radix prefix cache). */
  readonly Engine: NativeEngineConstructor;

  // --- radix prefix cache (radix_binding.cc) and GEMM (gemm_binding.cc) ---
  /** The radix-tree prefix cache (native/src/radix_cache.h), exposed for tests and benchmarks. */
  readonly RadixCache: RadixCacheConstructor;
  /** C (+)= op(A)·op(B) with the native kernels: nt C[M,N]=A[M,K]·B[N,K]ᵀ, nn A[M,K]·B[K,N], tn A[K,M]ᵀ·B[K,N]. */
  matmul(
    kind: "nt" | "nn" | "tn",
    A: Float32Array,
    B: Float32Array,
    C: Float32Array,
    M: number,
    N: number,
    K: number,
    accumulate: boolean,
  ): void;
  /** Sets the kernels' thread count (the OpenMP ICV they read) for later calls from this thread, if n given; returns it. */
  gemmThreads(n?: number): number;
  /** The micro-kernel in use: "avx512 12x32" (AVX-512F CPUs, unless OOZE_NO_AVX512 is set) or "avx2 6x16". */
  gemmKernel(): string;
}

/** Result of RadixCache.match: the cached prefix length, its KV slots, and the node it ends on. */
export interface RadixMatch {
  length: number;
  slots: Int32Array;
  node: number;
}

/** Constructs a RadixCache holding at most budgetTokens tokens. */
export interface RadixCacheConstructor {
  new (budgetTokens: number): NativeRadixCache;
}

/** Native RadixCache; evicted slot ids collect until takeEvicted() drains them. */
export interface NativeRadixCache {
  /** Longest cached prefix; touches LRU; may split a node. */
  match(tokens: Int32Array): RadixMatch;
  /** Caches tokens with their slots; `cached` leading tokens were already there (caller frees those slots). */
  insert(tokens: Int32Array, slots: Int32Array): { cached: number; node: number };
  lock(node: number): void;
  unlock(node: number): void;
  /** Evicts up to n tokens (LRU unlocked leaves, trimmed from the tail); returns how many went. */
  evict(nTokens: number): number;
  /** Evicts everything; false (nothing flushed) while any lock is held. */
  flush(): boolean;
  size(): number;
  budget(): number;
  lockedTokens(): number;
  hitTokens(): number;
  queriedTokens(): number;
  nodeCount(): number;
  /** "" when every structural invariant holds, else what is wrong. */
  validate(): string;
  /** Slot ids given back (evicted, flushed or not fitting) since the last call. */
  takeEvicted(): Int32Array;
}

// --- checkpoints and inference engine (checkpoint.cc, engine_napi.cc) ---

/**
 * Rotary scaling as config.json holds it (`rope_scaling`, or `rope_parameters` with `rope_theta`):
 * `linear` (factor), `llama3` (factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings) or `yarn` (factor, original_max_position_embeddings, beta_fast,
 * beta_slow, mscale, mscale_all_dim, attention_factor, truncate); transformers before 4.45 wrote
 * `type` for `rope_type`.
 */
export interface RopeScalingJson {
  rope_type?: "default" | "linear" | "llama3" | "yarn" | (string & {});
  type?: string;
  factor?: number;
  low_freq_factor?: number;
  high_freq_factor?: number;
  original_max_position_embeddings?: number;
  beta_fast?: number;
  beta_slow?: number;
  mscale?: number;
  mscale_all_dim?: number;
  attention_factor?: number;
  truncate?: boolean;
}

/** The model families the native model implements (config.json `model_type`). */
export type ModelFamily = "llama" | "mistral" | "qwen2" | "qwen3";

/**
 * config.json of a Llama-architecture model (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM): the fields ooze reads (a loaded config.json carries others too).
 */
export interface LlamaHfConfig {
  /** Absent: llama (or what `architectures` names). */
  model_type?: ModelFamily | (string & {});
  architectures?: string[];
  vocab_size: number;
  hidden_size: number;
  intermediate_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  rms_norm_eps: number;
  rope_theta: number;
  /** Rotary scaling (absent or null: none). Configs ooze writes carry it here and in `rope_parameters`. */
  rope_scaling?: RopeScalingJson | null;
  max_position_embeddings: number;
  tie_word_embeddings: boolean;
  bos_token_id: number;
  eos_token_id: number;
  /** Size of each attention head; absent: hidden_size / num_attention_heads (Qwen3 sets it). */
  head_dim?: number;
  /** Llama, Qwen3: biases on q, k, v and o projections. (Qwen2 always has q/k/v biases.) */
  attention_bias?: boolean;
  /** Mistral: each position attends to the last `sliding_window` positions; null: all. */
  sliding_window?: number | null;
}

/** One tensor of the flat params buffer: HF name, offset in floats, shape. */
export interface TensorLayout {
  name: string;
  offset: number;
  shape: number[];
}

/** What loadModelDir returns. */
export interface LoadedModel {
  config: LlamaHfConfig;
  params: Float32Array;
  tensors: TensorLayout[];
  /** __metadata__.weight_version of the safetensors file, or null. */
  weightVersion: string | null;
}

/** Sampling settings as Engine.add takes them (BackendSampling of src/engine/backend.ts). */
export interface NativeSampling {
  maxNewTokens: number | null;
  temperature: number;
  topP: number;
  topK: number;
  minNewTokens: number;
  stopTokenIds: readonly number[] | Int32Array;
  ignoreEos: boolean;
  seed: number | null;
}

/** One step event. An abort event (KV memory or forward failure) carries tokenId -1. */
export interface NativeTokenEvent {
  rid: string;
  tokenId: number;
  logprob: number;
  finished:
    | null
    | { type: "stop"; matched: number }
    | { type: "length"; length: number }
    | { type: "abort"; message: string };
}

/** Engine options: a model directory, or a config with its flat params. */
export type NativeEngineOptions = ({ modelDir: string } | { config: LlamaHfConfig; params: Float32Array }) & {
  /** KV pool size in tokens (at least max_position_embeddings; default 16384); also the prefix cache budget. */
  cacheTokens?: number;
  /** Most requests decoding at once; the rest wait in order (default 64). */
  maxRunning?: number;
};

export interface NativeEngineConstructor {
  new (opts: NativeEngineOptions): NativeEngine;
}

/** PEFT's name of a Linear layer a LoRA adapter can target. */
export type LoraTargetName = "q_proj" | "k_proj" | "v_proj" | "o_proj" | "gate_proj" | "up_proj" | "down_proj";

/** A LoRA adapter loaded into the engine (Engine.loraAdapters), or a named whole model (`full`; rank 0, no targets). */
export interface NativeLoraAdapterInfo {
  name: string;
  full: boolean;
  rank: number;
  alpha: number;
  rslora: boolean;
  targets: LoraTargetName[];
}

/** The native engine. Methods other than step/loadWeights are synchronous and cheap. */
export interface NativeEngine {
  /**
   * Queues a request under a loaded LoRA adapter (null or absent: the base); returns prompt tokens
   * served from that adapter's prefix cache. Throws on an empty or too-long prompt, bad ids, a
   * duplicate rid or an adapter that is not loaded (the message names it).
   */
  add(rid: string, inputIds: Int32Array, sampling: NativeSampling, adapter?: string | null): number;
  /**
   * Admits waiting requests (in order, while places, KV slots and a 4096-token prefill budget allow),
   * prefills them and decodes one token for the others, in one batched forward off the event loop.
   * Resolves with one event per request that produced a token ([] when nothing runs). Call one at a time.
   */
  step(): Promise<NativeTokenEvent[]>;
  /**
   * Drops a request: no event for it after abort() returns, even from a step in flight (the rid is
   * free for reuse at once); its computed prefix goes to the prefix cache. Unknown rids are ignored.
   */
  abort(rid: string): void;
  /** Requests added and not finished (waiting + running). */
  running(): number;
  /** Empties the prefix cache; false while requests hold cached prefixes. */
  flushCache(): boolean;
  /** Prefix-cache figures; freeSlots: KV slots held by nobody (idle: freeSlots + cachedTokens = pool size). */
  cacheStats(): { cachedTokens: number; budgetTokens: number; promptTokens: number; hitTokens: number; freeSlots: number };
  /** Loads new weights from a model directory (same shapes) off the event loop; flushes the prefix cache unless keepCache. */
  loadWeights(dir: string, keepCache?: boolean): Promise<void>;
  /** Logits [n × vocab] at every position of tokens under an adapter (null: the base), from a fresh cache (tests, debugging). Sync. */
  forwardLogits(tokens: Int32Array, adapter?: string | null): Float32Array;
  /**
   * Reads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) against the
   * base's config, off the event loop, and serves it as `name`. Loading a name again replaces it:
   * requests added before keep the old adapter to their end, and its cached prefixes are never
   * reused. Rejects with a message naming the file and the field or tensor that does not fit.
   */
  loadLoraAdapter(name: string, dir: string): Promise<{ replaced: boolean }>;
  /**
   * Loads a whole model directory (config.json + model.safetensors, the base's architecture) as
   * `name`: served like an adapter (requests name it; a prefix cache of its own), on its own
   * weights. A policy of its own full weights beside others is served this way.
   */
  loadNamedModel(name: string, dir: string): Promise<{ replaced: boolean }>;
  /** Unloads an adapter (running requests finish with it; its cached prefixes are freed); false if not loaded. */
  unloadLoraAdapter(name: string): boolean;
  /** The loaded adapters, by name. */
  loraAdapters(): NativeLoraAdapterInfo[];
  /** The model's config.json (as written by ooze). */
  config(): LlamaHfConfig;
  /** Releases native memory; later calls throw. */
  close(): void;
}

// --- training (train_binding.cc; typed wrapper in native/trainer.ts) ---

/**
 * A packed batch: sequences concatenated; sequence s is tokens[cuSeqlens[s] .. cuSeqlens[s+1]).
 * Attention never crosses sequences; positions restart at 0 in each.
 */
export interface NativePackedBatch {
  tokens: Int32Array;
  cuSeqlens: Int32Array;
}

/**
 * A training batch: per-token arrays aligned with tokens (one entry per token). Entry i of
 * oldLogprobs/rolloutLogprobs/refLogprobs is the logprob of tokens[i] given the tokens before it in its
 * sequence (the first token of each sequence has no logprob: give 0 and mask it out).
 */
export interface NativeTrainBatch extends NativePackedBatch {
  /** 1 = model token trained on; 0 = prompt, environment or tool token. */
  lossMask: Uint8Array;
  advantages: Float32Array;
  oldLogprobs: Float32Array;
  /** The inference engine's logprobs (TIS); null when tisCap is null. */
  rolloutLogprobs: Float32Array | null;
  /** Reference policy logprobs (KL); null when klCoef is 0. */
  refLogprobs: Float32Array | null;
  /** The critic's values when the returns were computed (value clip); absent or null without a critic loss. */
  oldValues?: Float32Array | null;
  /** Value targets (GAE returns); absent or null without a critic loss. */
  returns?: Float32Array | null;
}

/** Per-token inputs of valueLoss (one entry per token; sequences by cuSeqlens). */
export interface NativeValueLossInputs {
  cuSeqlens: Int32Array;
  lossMask: Uint8Array;
  values: Float32Array;
  oldValues: Float32Array;
  returns: Float32Array;
}

/** Loss settings (see native/reference/losses.ts for the formulas); native defaults in comments. */
export interface NativeLossConfig extends PolicyLossConfig {
  /** 1: logits / temperature before the log-softmax. */
  temperature: number;
  /** Weight of the critic's value loss (needs a value head, oldValues and returns); 0 = none. */
  valueCoef: number;
  /** Value clip ε_v around oldValues; null or <= 0 = unclipped. */
  valueClip: number | null;
}

/** AdamW settings. Weight decay is decoupled and never applied to 1-D tensors (RMSNorm weights). */
export interface NativeOptimConfig {
  lr: number;
  beta1: number; // 0.9
  beta2: number; // 0.999
  eps: number; // 1e-8
  weightDecay: number; // 0
  maxGradNorm: number; // 1; 0 disables clipping
}

/** Loss metrics (with a normalizer, means are this micro-batch's share): the public definition. */
export type NativeLossMetrics = PolicyLossMetrics & ValueLossMetrics;

/** Result of one optimizer step. */
export interface NativeOptimResult {
  /** Global gradient L2 norm before clipping. */
  gradNorm: number;
  clipCoef: number;
  /** The norm was not finite: params unchanged, step not advanced. */
  skipped: boolean;
  /** Steps taken so far. */
  step: number;
}

/** Per-token inputs of policyLoss (all arrays one entry per token; sequences by cuSeqlens). */
export interface NativePolicyLossInputs {
  cuSeqlens: Int32Array;
  logprobs: Float32Array;
  entropy: Float32Array;
  lossMask: Uint8Array;
  advantages: Float32Array;
  oldLogprobs: Float32Array;
  rolloutLogprobs: Float32Array | null;
  refLogprobs: Float32Array | null;
  /** The uniform distribution's cross-entropy against the policy per token; needed when uniformCoef > 0. */
  uniformCe?: Float32Array | null;
}

/** What policyLoss returns. */
export interface NativePolicyLossResult {
  metrics: NativeLossMetrics;
  dLogprobs: Float32Array;
  dEntropy: Float32Array;
  dUniform: Float32Array;
}

/** A forward without gradient: per-token logprobs, entropies and (with a value head) values, aligned with the tokens. */
export interface NativeForward {
  logprobs: Float32Array;
  entropy: Float32Array;
  /** values[i]: the critic's value of the state that predicts tokens[i]; 0 at sequence starts; null without a value head. */
  values: Float32Array | null;
}

/** The Linear layers a LoRA adapter can target (PEFT's module names). */
export type LoraTargetModule = "q_proj" | "k_proj" | "v_proj" | "o_proj" | "gate_proj" | "up_proj" | "down_proj";

/** A LoRA adapter's shape: y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ, s = alpha / rank (alpha / √rank with rsLoRA). */
export interface LoraConfig {
  rank: number;
  alpha: number;
  targets: LoraTargetModule[];
  rslora: boolean;
}

export interface NativeTrainerConstructor {
  /** From a config and params (flat, HF layout), or random init (HF's N(0, 0.02²)) from seed; no argument: empty until load(dir). */
  new (opts?: { config: Partial<LlamaHfConfig>; params: Float32Array | null; seed: number | null }): NativeTrainer;
}

/**
 * The native trainer: one model, its gradient buffer and AdamW state. Promise methods run off the
 * event loop, one at a time (a call while another is in flight rejects); sync methods throw while busy.
 */
export interface NativeTrainer {
  /** Per-token logprobs and entropies (aligned with tokens, 0 at each sequence's first token), no grad. */
  logprobs(batch: NativePackedBatch, temperature?: number): Promise<NativeForward>;
  /** Adds the gradient of Σ dLogprobs·logprobs + dEntropy·entropy (+ dValues·values, needs a value head) into the grads. */
  backward(batch: NativePackedBatch, temperature: number, dLogprobs: Float32Array, dEntropy: Float32Array, dValues?: Float32Array): Promise<void>;
  /** Forward, policy loss, backward; gradients are added into the grads (micro-batch accumulation). */
  accumulate(batch: NativeTrainBatch, loss: Partial<NativeLossConfig>): Promise<NativeLossMetrics>;
  /** Clips, takes one AdamW step with the accumulated grads, and zeroes them. */
  applyGrads(optim: Partial<NativeOptimConfig> & { lr: number }): Promise<NativeOptimResult>;
  /** zeroGrads + accumulate + applyGrads in one call. */
  trainStep(batch: NativeTrainBatch, loss: Partial<NativeLossConfig>, optim: Partial<NativeOptimConfig> & { lr: number }): Promise<NativeLossMetrics & NativeOptimResult>;
  zeroGrads(): void;
  /** A copy of the params (flat, HF layout). */
  getParams(): Float32Array;
  /** Replaces the params (same size); keeps the optimizer state. */
  setParams(params: Float32Array): void;
  /** A copy of the accumulated gradients (throws while an adapter trains: the base has none). */
  getGrads(): Float32Array;
  /** Forgets the AdamW moments and step count (the model's, the adapter's and the value head's). */
  resetOptimizer(): void;
  /** Config, size, step of what trains (adapter or model), tensor layout and the adapter's config; null while empty. */
  info(): {
    config: LlamaHfConfig;
    numParams: number;
    step: number;
    valueHead: boolean;
    tensors: TensorLayout[];
    lora: (LoraConfig & { numParams: number }) | null;
  } | null;
  /**
   * Trains a new LoRA adapter over the frozen base from now on (PEFT's initialisation from `seed`: A
   * uniform in ±1/√in, B zero; or `params` in the adapter's layout), or the whole model again with
   * null. Grads and optimizer state start empty. While an adapter is set, logprobs/backward/accumulate
   * use base + adapter, and applyGrads/trainStep/saveOptimizer/loadOptimizer act on the adapter only.
   */
  setLora(opts: (Partial<LoraConfig> & { seed?: number; params?: Float32Array }) | null): void;
  /** The adapter being trained: config, params, accumulated grads, AdamW step and tensor layout (PEFT names); null in full mode. */
  getLora(): { config: LoraConfig; params: Float32Array; grads: Float32Array; step: number; tensors: TensorLayout[] } | null;
  /** Replaces the adapter's values (same size); keeps its optimizer state. */
  setLoraParams(params: Float32Array): void;
  /** Writes the adapter in PEFT's format: dir/adapter_config.json and dir/adapter_model.safetensors (F32). */
  saveLora(dir: string, weightVersion?: string, baseModel?: string): Promise<void>;
  /** Trains the PEFT adapter in `dir` over the frozen base from now on (fresh optimizer); throws naming file and field when it does not fit the base. */
  loadLora(dir: string): Promise<{ weightVersion: string }>;
  /** Creates or replaces the critic's value head (hidden_size + 1 floats: weight, then bias); its grads and moments restart. */
  setValueHead(params: Float32Array): void;
  /** The value head's params, accumulated grads and AdamW step; null without one. */
  getValueHead(): { params: Float32Array; grads: Float32Array; step: number } | null;
  /** Writes the value head and its AdamW state to one file. */
  saveValueHead(path: string): Promise<void>;
  /** Replaces the value head and its AdamW state from a saveValueHead file. */
  loadValueHead(path: string): Promise<void>;
  /** Writes dir/config.json and dir/model.safetensors (F32) of the current params. */
  save(dir: string, weightVersion?: string): Promise<void>;
  /** Replaces the model from a checkpoint dir; zeroes grads, resets the optimizer and drops the value head and the adapter. */
  load(dir: string): Promise<{ weightVersion: string }>;
  /** Writes the AdamW moments and step count of what trains (the adapter, or the model) to one file (native/src/optim.h format). */
  saveOptimizer(path: string): Promise<void>;
  /** Replaces the AdamW state of what trains from a saveOptimizer file with as many parameters. */
  loadOptimizer(path: string): Promise<{ step: number }>;
}
