// Prefill and decode tokens/s of the native inference engine (native/engine.ts createNativeBackend)
// on a randomly initialised preset model, for bench/native.ts. Returns nulls with the reason when
// the engine is not part of this checkout yet.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BackendSampling, InferenceBackend } from "../../src/engine/backend.ts";

/** Measured throughput, or nulls and why. */
export interface EngineThroughput {
  prefillTokensPerS: number | null;
  decodeTokensPerS: number | null;
  note: string;
}

const greedy = (maxNewTokens: number): BackendSampling => ({
  maxNewTokens,
  temperature: 0,
  topP: 1,
  topK: -1,
  minNewTokens: 0,
  stopTokenIds: [],
  ignoreEos: true,
  seed: 1,
});

function randomPrompt(n: number, seed: number): Int32Array {
  let s = seed >>> 0;
  return Int32Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s % 256;
  });
}

/** Steps until nothing runs; returns the number of token events. */
async function drain(b: InferenceBackend): Promise<number> {
  let events = 0;
  while (b.running() > 0) events += (await b.step()).length;
  return events;
}

/**
 * Prefill: `requests` prompts of `promptTokens` distinct tokens, one new token each, timed from
 * admission to the last event. Decode: `requests` short prompts generating `decodeTokens` each,
 * timed after the first (prefill) step.
 */
export async function measureEngine(
  preset: string,
  requests = 16,
  promptTokens = 256,
  decodeTokens = 64,
): Promise<EngineThroughput> {
  let createNativeBackend: (o: { modelDir: string; cacheTokens?: number; maxRunning?: number }) => InferenceBackend;
  let initModelDir: (preset: string, out: string, seed: number) => Promise<unknown>;
  try {
    ({ createNativeBackend } = await import("../../native/engine.ts"));
    ({ initModelDir } = await import("../../native/model-dir.ts"));
  } catch (e) {
    return { prefillTokensPerS: null, decodeTokensPerS: null, note: `engine not available: ${(e as Error).message}` };
  }
  const dir = mkdtempSync(join(tmpdir(), "ooze-bench-model-"));
  try {
    await initModelDir(preset, dir, 0);
    const b = createNativeBackend({ modelDir: dir, cacheTokens: requests * (promptTokens + decodeTokens) * 2, maxRunning: requests });
    try {
      // Warm-up (allocations, thread pool), not timed.
      b.add("warm", randomPrompt(32, 99), greedy(2));
      await drain(b);
      b.flushCache();

      let t0 = performance.now();
      for (let r = 0; r < requests; r++) b.add(`p${r}`, randomPrompt(promptTokens, 1000 + r), greedy(1));
      await drain(b);
      const prefill = (requests * promptTokens) / ((performance.now() - t0) / 1000);
      b.flushCache();

      for (let r = 0; r < requests; r++) b.add(`d${r}`, randomPrompt(16, 2000 + r), greedy(decodeTokens + 1));
      await b.step(); // prefill + first token
      t0 = performance.now();
      const events = await drain(b);
      const decode = events / ((performance.now() - t0) / 1000);
      return {
        prefillTokensPerS: prefill,
        decodeTokensPerS: decode,
        note: `${preset}: prefill ${requests}x${promptTokens} tokens; decode batch ${requests} x ${decodeTokens} tokens`,
      };
    } finally {
      b.close();
    }
  } catch (e) {
    return { prefillTokensPerS: null, decodeTokensPerS: null, note: `engine measurement failed: ${(e as Error).message}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
