// Helpers of the native engine tests: default sampling, deterministic prompts, stepping an engine
// until it is idle, and a tolerance check that prints the first differing values (llm.c's check_tensor).
import { expect } from "vitest";
import type { NativeEngine, NativeSampling, NativeTokenEvent } from "../../native/index.d.ts";

/** Greedy, 8 new tokens, EOS ignored, seed 1; `s` overrides. */
export function sampling(s: Partial<NativeSampling> = {}): NativeSampling {
  return { maxNewTokens: 8, temperature: 0, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: true, seed: 1, ...s };
}

/** n deterministic token ids below 256 (`salt` varies them). */
export function prompt(n: number, salt = 0): Int32Array {
  return Int32Array.from({ length: n }, (_, i) => (i * 31 + salt * 17 + 5) % 256);
}

/** What one request produced. */
export interface Out {
  tokens: number[];
  logprobs: number[];
  finished: NativeTokenEvent["finished"];
}

/** Steps until nothing runs; collects each request's tokens. */
export async function drain(e: NativeEngine, onStep?: (events: NativeTokenEvent[]) => void): Promise<Map<string, Out>> {
  const out = new Map<string, Out>();
  for (let steps = 0; e.running() > 0; steps++) {
    if (steps > 5000) throw new Error("engine did not finish within 5000 steps");
    const events = await e.step();
    onStep?.(events);
    for (const ev of events) {
      const o = out.get(ev.rid) ?? { tokens: [], logprobs: [], finished: null };
      if (ev.tokenId >= 0) o.tokens.push(ev.tokenId), o.logprobs.push(ev.logprob);
      o.finished = ev.finished;
      out.set(ev.rid, o);
    }
  }
  return out;
}

/** Adds one request (under `adapter`, null: the base) and steps until the engine is idle. */
export async function generate(e: NativeEngine, rid: string, ids: Int32Array, s: NativeSampling, adapter: string | null = null): Promise<Out> {
  e.add(rid, ids, s, adapter);
  return (await drain(e)).get(rid)!;
}

/** Fails with the first differing values (llm.c's check_tensor). */
export function expectClose(got: Float32Array | number[], want: Float32Array | number[], tol: number, what: string) {
  expect(got.length).toBe(want.length);
  const bad: string[] = [];
  for (let i = 0; i < got.length; i++)
    if (!(Math.abs(got[i]! - want[i]!) <= tol)) bad.push(`[${i}] got ${got[i]} want ${want[i]}`);
  if (bad.length) console.error(`${what}: ${bad.length} values differ by more than ${tol}; first: ${bad.slice(0, 5).join(", ")}`);
  expect(bad.length).toBe(0);
}
