// A simulated GPU engine behind the InferenceBackend contract: no model, no compute — each forward
// pass waits (a timer) as long as the serving model (perf-model.ts) says one would take on the GPU.
// Scheduling follows SGLang's: requests wait in order and are admitted while the batch has room
// (maxRunning) and the KV pool has their tokens; a step is either a prefill pass (new requests' prompt
// tokens not found in the prefix cache, up to a chunk) or a decode pass (one token for every running
// request); prefix-cache hits skip prefill. The prefix cache keeps token blocks (16 tokens, hashed with
// everything before them) of finished requests, LRU within the KV capacity. Sampled ids are printable
// bytes (never EOS, unless stopProbability says so) and their logprobs, both deterministic in the seed,
// the request's sampling seed and the context. The engine's clock keeps its pace under timer jitter
// (late steps shorten the next waits, up to 50 ms behind); time it could not make up shows as `lagSeconds`.
import type { BackendAdmission, BackendCacheStats, BackendModelInfo, BackendSampling, FinishReason, InferenceBackend, TokenEvent } from "../backend.ts";
import { OozeError } from "../../errors.ts";
import { BOS_ID, BYTE_TOKENIZER_VOCAB, EOS_ID } from "../tokenizer.ts";
import { decodeStepMs, H100_LLAMA_8B, type PerfTable, prefillMs } from "./perf-model.ts";

/** Options of SimBackend. */
export interface SimBackendOptions {
  /** The serving model (default: Llama-3.1-8B on an H100, perf-model.ts). */
  table?: PerfTable;
  /** Seed of the sampled ids (default 0). */
  seed?: number;
  /** Chance that a sampled token is EOS (default 0: requests end at max_new_tokens or a stop id). */
  stopProbability?: number;
  /** Overrides of the table's maxRunning and kvTokens. */
  maxRunning?: number;
  kvTokens?: number;
  /** How far behind its clock the engine still makes up time (default 50 ms; see `wait`). */
  catchUpMs?: number;
}

/** Counters of a simulated engine (also in /server_info's internal_states[0].cache). */
export interface SimStats extends BackendCacheStats {
  /** Seconds of simulated GPU time (prefill + decode + weight loads). */
  busySeconds: number;
  /** Seconds steps ran later than the serving model says (the host could not keep up). */
  lagSeconds: number;
  prefillSteps: number;
  decodeSteps: number;
  decodedTokens: number;
  prefilledTokens: number;
  /** Sequences summed over decode steps (÷ decodeSteps: the mean decode batch). */
  decodeSequences: number;
  /** Requests admitted (a request dispatched again after an abort counts again). */
  requests: number;
  /** Requests aborted before they finished (a pause in abort mode, or the client's abort). */
  aborted: number;
}

const BLOCK = 16;
/**
 * Default time behind its clock an engine makes up (its next steps wait less, or not at all), so that
 * timer and scheduling delays of a loaded host do not slow the simulated GPU; beyond it the time is
 * lost and counted as lag.
 */
const CATCH_UP_MS = 50;

interface SimReq {
  rid: string;
  ids: number[];
  promptLen: number;
  /** Prompt tokens still to prefill (after the cached prefix). */
  toPrefill: number;
  generated: number;
  sampling: BackendSampling;
  rng: number;
}

/** 32-bit mix (murmur3's finaliser). */
function mix(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** Hashes of each full block of `ids`, each covering every token before it. */
function blockHashes(ids: ArrayLike<number>, upto: number): number[] {
  const out: number[] = [];
  let h = 0x9e3779b9;
  for (let i = 0; i < upto; i++) {
    h = mix(h ^ (ids[i]! + 0x632be5ab));
    if ((i + 1) % BLOCK === 0) out.push(h);
  }
  return out;
}

/** The simulated engine. */
export class SimBackend implements InferenceBackend {
  readonly info: BackendModelInfo;
  readonly table: PerfTable;
  private readonly seed: number;
  private readonly stopProbability: number;
  private readonly maxRunning: number;
  private readonly kvTokens: number;
  private readonly catchUpMs: number;
  private readonly waiting: SimReq[] = [];
  private readonly batch = new Map<string, SimReq>();
  /** Prefix cache: block hash → true, in LRU order (Map order). */
  private readonly cache = new Map<number, true>();
  private nextSeed = 1;
  /** When the engine's next step may end at the earliest (its own clock), ms. */
  private clock = 0;
  private readonly stats = { promptTokens: 0, hitTokens: 0, busyMs: 0, lagMs: 0, prefillSteps: 0, decodeSteps: 0, decodedTokens: 0, prefilledTokens: 0, decodeSequences: 0, requests: 0, aborted: 0 };
  private closed = false;

  constructor(opts: SimBackendOptions = {}) {
    this.table = opts.table ?? H100_LLAMA_8B;
    this.seed = opts.seed ?? 0;
    this.stopProbability = opts.stopProbability ?? 0;
    this.maxRunning = opts.maxRunning ?? this.table.maxRunning;
    this.kvTokens = opts.kvTokens ?? this.table.kvTokens;
    this.catchUpMs = opts.catchUpMs ?? CATCH_UP_MS;
    this.info = {
      modelPath: this.table.name,
      // The simulated model's shape (Llama-3.1-8B) over ooze's byte vocabulary: token-in/token-out
      // tasks and the fleet's model check work as with any engine.
      config: {
        architectures: ["LlamaForCausalLM"],
        model_type: "llama",
        vocab_size: BYTE_TOKENIZER_VOCAB,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        max_position_embeddings: this.table.maxContext,
        bos_token_id: BOS_ID,
        eos_token_id: EOS_ID,
        simulated: true,
      },
      eosTokenId: EOS_ID,
      maxContext: this.table.maxContext,
    };
  }

  add(rid: string, inputIds: Int32Array, sampling: BackendSampling, lora: string | null = null): BackendAdmission {
    if (this.closed) throw new OozeError("INTERNAL", "the simulated engine is closed");
    if (lora !== null) throw new OozeError("BAD_REQUEST", `the simulated engine serves no LoRA adapters (asked for '${lora}')`);
    if (inputIds.length === 0) throw new OozeError("BAD_REQUEST", "input_ids is empty");
    if (inputIds.length >= this.table.maxContext)
      throw new OozeError("BAD_REQUEST", `the prompt has ${inputIds.length} tokens; the context is ${this.table.maxContext}`);
    // Longest cached prefix in whole blocks, leaving at least one token to compute (as SGLang does).
    const hashes = blockHashes(inputIds, inputIds.length - 1);
    let cached = 0;
    for (const h of hashes) {
      if (!this.cache.has(h)) break;
      this.cache.delete(h);
      this.cache.set(h, true);
      cached += BLOCK;
    }
    this.stats.promptTokens += inputIds.length;
    this.stats.hitTokens += cached;
    this.stats.requests++;
    const s = sampling.seed ?? this.seed * 1_000_003 + this.nextSeed++;
    this.waiting.push({ rid, ids: Array.from(inputIds), promptLen: inputIds.length, toPrefill: inputIds.length - cached, generated: 0, sampling, rng: mix(s ^ 0x5bd1e995) });
    return { cachedTokens: cached };
  }

  async step(): Promise<TokenEvent[]> {
    this.admit();
    const prefilling = [...this.batch.values()].filter((r) => r.toPrefill > 0);
    if (prefilling.length > 0) return this.prefill(prefilling);
    if (this.batch.size === 0) return [];
    return this.decode();
  }

  abort(rid: string): void {
    const r = this.batch.get(rid);
    if (r) {
      this.batch.delete(rid);
      this.remember(r);
      this.stats.aborted++;
      return;
    }
    const i = this.waiting.findIndex((w) => w.rid === rid);
    if (i >= 0) this.waiting.splice(i, 1), this.stats.aborted++;
  }

  running(): number {
    return this.batch.size + this.waiting.length;
  }

  flushCache(): boolean {
    this.cache.clear();
    return true;
  }

  cacheStats(): SimStats {
    return {
      cachedTokens: this.cache.size * BLOCK,
      budgetTokens: this.kvTokens,
      promptTokens: this.stats.promptTokens,
      hitTokens: this.stats.hitTokens,
      busySeconds: this.stats.busyMs / 1000,
      lagSeconds: this.stats.lagMs / 1000,
      prefillSteps: this.stats.prefillSteps,
      decodeSteps: this.stats.decodeSteps,
      decodedTokens: this.stats.decodedTokens,
      prefilledTokens: this.stats.prefilledTokens,
      decodeSequences: this.stats.decodeSequences,
      requests: this.stats.requests,
      aborted: this.stats.aborted,
    };
  }

  async loadWeights(_dir: string, opts: { keepCache?: boolean } = {}): Promise<void> {
    await this.wait(this.table.updateWeightsMs);
    if (!opts.keepCache) this.cache.clear();
  }

  close(): void {
    this.closed = true;
    this.waiting.length = 0;
    this.batch.clear();
  }

  /** KV tokens the running requests hold. */
  private kvUsed(): number {
    let n = 0;
    for (const r of this.batch.values()) n += r.ids.length;
    return n;
  }

  /** Moves waiting requests into the batch, in order, while it has room and the KV pool their tokens. */
  private admit(): void {
    let used = this.kvUsed();
    while (this.waiting.length > 0 && this.batch.size < this.maxRunning) {
      const r = this.waiting[0]!;
      const budget = Math.min(r.sampling.maxNewTokens ?? 512, 512);
      if (this.batch.size > 0 && used + r.ids.length + budget > this.kvTokens) break;
      this.waiting.shift();
      this.batch.set(r.rid, r);
      used += r.ids.length;
    }
  }

  /** One prefill pass: up to a chunk of prompt tokens, oldest requests first; finished prompts sample their first token. */
  private async prefill(reqs: SimReq[]): Promise<TokenEvent[]> {
    let room = this.table.chunkTokens;
    const done: SimReq[] = [];
    let tokens = 0;
    for (const r of reqs) {
      if (room <= 0) break;
      const take = Math.min(room, r.toPrefill);
      r.toPrefill -= take;
      room -= take;
      tokens += take;
      if (r.toPrefill === 0) done.push(r);
    }
    this.stats.prefillSteps++;
    this.stats.prefilledTokens += tokens;
    await this.wait(prefillMs(this.table, tokens));
    return done.filter((r) => this.batch.has(r.rid)).map((r) => this.sample(r));
  }

  /** One decode pass: a token for every running request. */
  private async decode(): Promise<TokenEvent[]> {
    const reqs = [...this.batch.values()];
    const context = reqs.reduce((n, r) => n + r.ids.length, 0) / reqs.length;
    this.stats.decodeSteps++;
    this.stats.decodeSequences += reqs.length;
    await this.wait(decodeStepMs(this.table, reqs.length, context));
    return reqs.filter((r) => this.batch.has(r.rid)).map((r) => this.sample(r));
  }

  /** The next token of a request (deterministic), and its finish. */
  private sample(r: SimReq): TokenEvent {
    r.rng = mix(r.rng + r.ids.length * 0x27d4eb2d + (r.ids[r.ids.length - 1] ?? 0));
    const u = r.rng / 4294967296;
    const s = r.sampling;
    const mayStop = !s.ignoreEos && r.generated + 1 >= s.minNewTokens;
    const eos = mayStop && this.stopProbability > 0 && u < this.stopProbability;
    const tokenId = eos ? EOS_ID : 32 + (r.rng % 95); // printable ASCII
    const logprob = -((mix(r.rng) % 4000) / 1000);
    r.ids.push(tokenId);
    r.generated++;
    this.stats.decodedTokens++;
    let finished: FinishReason | null = null;
    if (eos) finished = { type: "stop", matched: EOS_ID };
    else if (mayStop && s.stopTokenIds.includes(tokenId)) finished = { type: "stop", matched: tokenId };
    else if (s.maxNewTokens !== null && r.generated >= s.maxNewTokens) finished = { type: "length", length: r.generated };
    else if (r.ids.length >= this.table.maxContext) finished = { type: "length", length: r.generated };
    if (finished) {
      this.batch.delete(r.rid);
      this.remember(r);
    }
    return { rid: r.rid, tokenId, logprob, finished };
  }

  /** Puts a request's whole blocks into the prefix cache, evicting the least recently used beyond capacity. */
  private remember(r: SimReq): void {
    const done = r.ids.length - r.toPrefill; // tokens whose KV exists
    for (const h of blockHashes(r.ids, Math.min(done, r.ids.length))) {
      this.cache.delete(h);
      this.cache.set(h, true);
    }
    const maxBlocks = Math.floor(this.kvTokens / BLOCK);
    while (this.cache.size > maxBlocks) this.cache.delete(this.cache.keys().next().value!);
  }

  /**
   * Waits `ms` of simulated GPU time on the engine's own clock (a timer: no CPU burned). While the
   * engine is busy, a step starts when the previous one ended by the clock, so a late timer is made
   * up on the next waits; a step that ends more than catchUpMs behind counts as lag.
   */
  private async wait(ms: number): Promise<void> {
    this.stats.busyMs += ms;
    const now = performance.now();
    const start = now - this.clock < this.catchUpMs ? this.clock : now;
    this.clock = start + ms;
    const delay = this.clock - now;
    // Behind the clock: no wait, but let I/O in before the next step.
    await new Promise((r) => (delay >= 1 ? setTimeout(r, delay) : setImmediate(r)));
    const late = performance.now() - this.clock;
    if (late > this.catchUpMs) {
      this.stats.lagMs += late;
      this.clock = performance.now();
    }
  }
}
