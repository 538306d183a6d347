// A synthetic multi-turn agentic trace through the native RadixCache, used by bench/native.ts:
// sessions share a system prompt; each turn's prompt is the previous prompt + response + a new
// user message; each prompt is sampled by a group of G rollouts (GRPO-style), run with the engine's
// protocol (match, lock, prefill the rest, insert prompt+response, unlock).
import type { NativeAddon } from "../../native/index.d.ts";

/** Trace shape. */
export interface TraceOptions {
  sessions: number;
  turns: number;
  group: number;
  systemTokens: number;
  userTokens: number;
  responseTokens: number;
  budgetTokens: number;
  seed: number;
}

/** Defaults: 32 sessions x 4 turns x group 4, 96-token system prompt, 64k-token cache budget. */
export const DEFAULT_TRACE: TraceOptions = {
  sessions: 32,
  turns: 4,
  group: 4,
  systemTokens: 96,
  userTokens: 24,
  responseTokens: 48,
  budgetTokens: 65_536,
  seed: 7,
};

/** Result: fraction of prompt tokens served from the cache, and the totals behind it. */
export interface TraceResult {
  savedFraction: number;
  promptTokens: number;
  hitTokens: number;
  evictedTokens: number;
  finalCachedTokens: number;
}

/** Runs the trace; token ids are bytes 0..255 from a seeded generator. */
export function runPrefixTrace(addon: NativeAddon, o: TraceOptions = DEFAULT_TRACE): TraceResult {
  let s = o.seed >>> 0;
  const rand = (n: number): number => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s % n;
  };
  const randomTokens = (n: number): number[] => Array.from({ length: n }, () => rand(256));
  const cache = new addon.RadixCache(o.budgetTokens);
  let nextSlot = 0;
  const freeSlots: number[] = [];
  const alloc = (): number => freeSlots.pop() ?? nextSlot++;
  let evicted = 0;
  const reclaim = (): void => {
    const e = cache.takeEvicted();
    evicted += e.length;
    for (const x of e) freeSlots.push(x);
  };
  const system = randomTokens(o.systemTokens);
  const history: number[][] = Array.from({ length: o.sessions }, () => system.slice());
  for (let turn = 0; turn < o.turns; turn++) {
    for (let sess = 0; sess < o.sessions; sess++) {
      const prompt = [...history[sess]!, ...randomTokens(o.userTokens)];
      const promptArr = Int32Array.from(prompt);
      let kept: number[] = [];
      for (let g = 0; g < o.group; g++) {
        const m = cache.match(promptArr);
        cache.lock(m.node);
        const response = randomTokens(o.responseTokens);
        const seq = Int32Array.from([...prompt, ...response]);
        const slots = new Int32Array(seq.length);
        slots.set(m.slots);
        for (let i = m.length; i < seq.length; i++) slots[i] = alloc();
        const r = cache.insert(seq, slots);
        // Slots of tokens cached meanwhile (beyond our match) are ours to free.
        for (let i = m.length; i < r.cached; i++) freeSlots.push(slots[i]!);
        cache.unlock(m.node);
        reclaim();
        if (g === 0) kept = response;
      }
      history[sess] = [...prompt, ...kept];
    }
  }
  const hit = cache.hitTokens();
  const queried = cache.queriedTokens();
  return {
    savedFraction: queried === 0 ? 0 : hit / queried,
    promptTokens: queried,
    hitTokens: hit,
    evictedTokens: evicted,
    finalCachedTokens: cache.size(),
  };
}
