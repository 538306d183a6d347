// Types of every export of the native addon. Each module adds its section here.

/** The native addon's exports. */
export interface NativeAddon {
  /** Names of the modules compiled into this build. */
  readonly modules: readonly string[];

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
