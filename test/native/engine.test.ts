// The native inference engine against the TypeScript reference forward (tiny preset): logits,
// greedy tokens and logprobs, prefill-then-decode, seeded sampling, batch invariance, stop rules,
// the radix prefix cache, abort, weight reload and admission limits.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { LlamaHfConfig, NativeSampling } from "../../native/index.d.ts";
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import { referenceArgmax, referenceLogits, referenceLogprob } from "../../native/reference/model.ts";
import { drain, expectClose, generate, prompt, sampling } from "./engine-helpers.ts";

const native = loadNative();
const root = mkdtempSync(join(tmpdir(), "ooze-engine-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const tiny: LlamaHfConfig = { ...PRESETS.tiny };
const tinyTied: LlamaHfConfig = { ...PRESETS.tiny, tie_word_embeddings: true };
const V = tiny.vocab_size;
// std 0.2 rather than 0.02 so logits are far from uniform and comparisons mean something.
const params = native.initModelParams(tiny, 11, 0.2);

function engine(opts: { cacheTokens?: number; maxRunning?: number; config?: LlamaHfConfig; p?: Float32Array } = {}) {
  return new native.Engine({
    config: opts.config ?? tiny,
    params: opts.p ?? params,
    ...(opts.cacheTokens === undefined ? {} : { cacheTokens: opts.cacheTokens }),
    ...(opts.maxRunning === undefined ? {} : { maxRunning: opts.maxRunning }),
  });
}

describe("native engine vs the TypeScript reference", () => {
  it("forwardLogits equals the reference within 1e-4 (untied and tied heads)", () => {
    for (const cfg of [tiny, tinyTied]) {
      const p = native.initModelParams(cfg, 4, 0.2);
      const e = engine({ config: cfg, p });
      const ids = prompt(40);
      expectClose(e.forwardLogits(ids), referenceLogits(cfg, p, ids), 1e-4, `logits tie=${cfg.tie_word_embeddings}`);
      e.close();
    }
  });

  it("greedy tokens and logprobs (prefill then decode) equal the reference full forward", async () => {
    const e = engine();
    const ids = prompt(13);
    const out = await generate(e, "g", ids, sampling({ maxNewTokens: 12 }));
    expect(out.finished).toEqual({ type: "length", length: 12 });
    const seq = Int32Array.from([...ids, ...out.tokens]);
    const ref = referenceLogits(tiny, params, seq);
    const wantTokens = out.tokens.map((_, i) => referenceArgmax(ref, V, ids.length - 1 + i));
    expect(out.tokens).toEqual(wantTokens);
    const wantLp = out.tokens.map((t, i) => referenceLogprob(ref, V, ids.length - 1 + i, t));
    expectClose(out.logprobs, wantLp, 1e-4, "greedy logprobs");
    e.close();
  });

  it("sampled logprobs are log-softmax(logits / temperature) and top-k bounds the choice", async () => {
    const e = engine();
    const ids = prompt(9, 2);
    const T = 0.7;
    const out = await generate(e, "s", ids, sampling({ temperature: T, topK: 5, topP: 0.9, maxNewTokens: 10, seed: 3 }));
    const ref = referenceLogits(tiny, params, Int32Array.from([...ids, ...out.tokens]));
    out.tokens.forEach((t, i) => {
      const row = ids.length - 1 + i;
      const rank = Array.from(ref.subarray(row * V, (row + 1) * V)).filter((x) => x > ref[row * V + t]!).length;
      expect(rank).toBeLessThan(5);
    });
    const want = out.tokens.map((t, i) => referenceLogprob(ref, V, ids.length - 1 + i, t, T));
    expectClose(out.logprobs, want, 1e-4, "sampled logprobs");
    e.close();
  });
});

describe("native engine batching and sampling", () => {
  it("same seed and inputs give the same tokens, alone or in any batch", async () => {
    const s = sampling({ temperature: 1, maxNewTokens: 10, seed: 42 });
    const alone = await generate(engine(), "a", prompt(7), s);
    const e = engine();
    e.add("x", prompt(20, 1), sampling({ temperature: 1, maxNewTokens: 6, seed: 7 }));
    await e.step(); // "x" is already decoding when "a" joins
    e.add("a", prompt(7), s);
    e.add("y", prompt(3, 2), sampling({ temperature: 0.5, maxNewTokens: 15, seed: 9 }));
    const batch = await drain(e);
    expect(batch.get("a")!.tokens).toEqual(alone.tokens);
    expectClose(batch.get("a")!.logprobs, alone.logprobs, 1e-5, "logprobs alone vs batched");
    const other = await generate(engine(), "a", prompt(7), sampling({ temperature: 1, maxNewTokens: 10, seed: 43 }));
    expect(other.tokens).not.toEqual(alone.tokens);
  });

  it("a batch of different-length greedy requests gives each request's tokens alone", async () => {
    const lens = [1, 4, 17, 33, 60];
    const alone = await Promise.all(lens.map(async (n, i) => generate(engine(), `r${i}`, prompt(n, i), sampling({ maxNewTokens: 5 + i }))));
    const e = engine({ maxRunning: 3 });
    lens.forEach((n, i) => e.add(`r${i}`, prompt(n, i), sampling({ maxNewTokens: 5 + i })));
    let most = 0;
    const batch = await drain(e, (ev) => (most = Math.max(most, ev.length)));
    expect(most).toBe(3); // maxRunning caps the batch; the rest wait in order
    lens.forEach((_, i) => {
      expect(batch.get(`r${i}`)!.tokens).toEqual(alone[i]!.tokens);
      expectClose(batch.get(`r${i}`)!.logprobs, alone[i]!.logprobs, 1e-5, `r${i} logprobs`);
    });
  });

  it("sampled first tokens follow the renormalised top-k and top-p distributions (2000 seeds each)", async () => {
    const ids = prompt(4, 8);
    const T = 0.8;
    const ref = referenceLogits(tiny, params, ids);
    const row = Array.from(ref.subarray((ids.length - 1) * V, ids.length * V), (x) => x / T);
    const order = row.map((_, i) => i).sort((a, b) => row[b]! - row[a]!);
    const mx = row[order[0]!]!;
    const top = order.slice(0, 4).map((i) => Math.exp(row[i]! - mx));
    const z = top.reduce((a, b) => a + b, 0);
    const e = engine({ maxRunning: 2000 });
    const n = 2000;
    for (let i = 0; i < n; i++) e.add(`s${i}`, ids, sampling({ temperature: T, topK: 4, maxNewTokens: 1, seed: i }));
    const counts = new Map<number, number>();
    const got = await drain(e);
    for (const o of got.values()) counts.set(o.tokens[0]!, (counts.get(o.tokens[0]!) ?? 0) + 1);
    expect([...counts.keys()].every((t) => order.slice(0, 4).includes(t))).toBe(true);
    // Seeds are fixed, so this is deterministic; 0.04 is > 4 standard errors at n = 2000.
    order.slice(0, 4).forEach((t, k) => expect(Math.abs((counts.get(t) ?? 0) / n - top[k]! / z)).toBeLessThan(0.04));
    // top_p between the top-2 and top-3 cumulative mass: the nucleus is the top 3, renormalised.
    const all = row.reduce((a, x) => a + Math.exp(x - mx), 0);
    const cum = (k: number) => order.slice(0, k).reduce((a, i) => a + Math.exp(row[i]! - mx), 0) / all;
    const e2 = engine({ maxRunning: 2000 });
    for (let i = 0; i < n; i++)
      e2.add(`q${i}`, ids, sampling({ temperature: T, topP: (cum(2) + cum(3)) / 2, maxNewTokens: 1, seed: 10_000 + i }));
    const counts2 = new Map<number, number>();
    for (const o of (await drain(e2)).values()) counts2.set(o.tokens[0]!, (counts2.get(o.tokens[0]!) ?? 0) + 1);
    expect([...counts2.keys()].every((t) => order.slice(0, 3).includes(t))).toBe(true);
    order.slice(0, 3).forEach((t, k) =>
      expect(Math.abs((counts2.get(t) ?? 0) / n - Math.exp(row[t]! - mx) / all / cum(3))).toBeLessThan(0.04),
    );
    // top_p smaller than the top token's probability leaves only that token: greedy.
    const greedyTok = order[0]!;
    const tp = await generate(engine(), "tp", ids, sampling({ temperature: T, topP: 1e-6, maxNewTokens: 1, seed: 5 }));
    expect(tp.tokens).toEqual([greedyTok]);
  });

  it("one step prefills at most 4096 prompt tokens; the rest are admitted at the next step", async () => {
    const e = engine();
    for (let i = 0; i < 10; i++) e.add(`p${i}`, prompt(500, i), sampling({ maxNewTokens: 2 }));
    expect((await e.step()).map((ev) => ev.rid)).toEqual(["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"]);
    expect((await e.step()).length).toBe(10);
    expect(e.running()).toBe(2);
    e.close();
  });

  it("stop ids end generation, min_new_tokens masks them, max_new_tokens and the context bound it", async () => {
    const ids = prompt(10, 3);
    const first = (await generate(engine(), "f", ids, sampling({ maxNewTokens: 1 }))).tokens[0]!;
    const stop = await generate(engine(), "st", ids, sampling({ stopTokenIds: [first] }));
    expect(stop).toMatchObject({ tokens: [first], finished: { type: "stop", matched: first } });
    // A model that prefers EOS after this prompt: lm_head[EOS] = 2·lm_head[first] doubles a positive logit.
    const eosId = tiny.eos_token_id;
    const head = native.modelLayout(tiny).tensors.find((t) => t.name === "lm_head.weight")!.offset;
    const H = tiny.hidden_size;
    const p2 = params.slice();
    for (let k = 0; k < H; k++) p2[head + eosId * H + k] = 2 * p2[head + first * H + k]!;
    const withEos = (s: Partial<NativeSampling>) => generate(engine({ p: p2 }), "e", ids, sampling(s));
    expect(await withEos({ ignoreEos: false })).toMatchObject({ tokens: [eosId], finished: { type: "stop", matched: eosId } });
    expect((await withEos({ ignoreEos: true, maxNewTokens: 3 })).tokens).toHaveLength(3);
    const late = await withEos({ ignoreEos: false, minNewTokens: 2, maxNewTokens: 3 });
    expect(late.tokens.slice(0, 2)).not.toContain(eosId);
    const masked = await generate(engine(), "m", ids, sampling({ stopTokenIds: [first], minNewTokens: 3, maxNewTokens: 6 }));
    expect(masked.tokens[0]).not.toBe(first);
    expect(masked.tokens.slice(0, 3)).not.toContain(first);
    expect(masked.tokens.length).toBeGreaterThanOrEqual(3);
    const ctx = tiny.max_position_embeddings;
    const full = await generate(engine(), "c", prompt(ctx - 2), sampling({ maxNewTokens: null }));
    expect(full).toMatchObject({ finished: { type: "length", length: 2 } });
    expect(full.tokens.length).toBe(2);
  });

  it("rejects empty, too-long, out-of-vocabulary and duplicate requests", () => {
    const e = engine();
    expect(() => e.add("a", new Int32Array(0), sampling())).toThrow(/empty/);
    expect(() => e.add("a", prompt(tiny.max_position_embeddings + 1), sampling())).toThrow(/longer than the context \(512\)/);
    expect(() => e.add("a", Int32Array.from([1, V]), sampling())).toThrow(/outside the vocabulary/);
    e.add("a", prompt(3), sampling());
    expect(() => e.add("a", prompt(3), sampling())).toThrow(/already running/);
    e.close();
    expect(() => e.running()).toThrow(/closed/);
  });
});

describe("native engine prefix cache, abort and weights", () => {
  it("reuses cached prefixes with identical results and reports cached tokens", async () => {
    const e = engine();
    const ids = prompt(25, 4);
    expect(e.add("a", ids, sampling({ maxNewTokens: 6 }))).toBe(0);
    const a = (await drain(e)).get("a")!;
    expect(e.cacheStats()).toMatchObject({ cachedTokens: 25 + 6 - 1, promptTokens: 25, hitTokens: 0 });
    // Same prompt: all but the last prompt token come from the cache; same tokens and logprobs.
    expect(e.add("b", ids, sampling({ maxNewTokens: 6 }))).toBe(24);
    const b = (await drain(e)).get("b")!;
    expect(b.tokens).toEqual(a.tokens);
    expectClose(b.logprobs, a.logprobs, 1e-5, "cached vs fresh logprobs");
    // A continuation (multi-turn) hits the whole previous sequence that has keys/values.
    const turn2 = Int32Array.from([...ids, ...a.tokens, 10, 11, 12]);
    expect(e.add("c", turn2, sampling({ maxNewTokens: 4 }))).toBe(25 + 6 - 1);
    expect(e.flushCache()).toBe(false); // "c" holds its cached prefix
    const c = (await drain(e)).get("c")!;
    const fresh = await generate(engine(), "c", turn2, sampling({ maxNewTokens: 4 }));
    expect(c.tokens).toEqual(fresh.tokens);
    expect(e.cacheStats().hitTokens).toBe(24 + 30);
    expect(e.flushCache()).toBe(true);
    expect(e.cacheStats()).toMatchObject({ cachedTokens: 0, freeSlots: 16384 });
  });

  it("a prompt is shared as soon as it is prefilled, while its request still runs", async () => {
    const e = engine();
    const ids = prompt(30, 9);
    e.add("a", ids, sampling({ maxNewTokens: 8 }));
    await e.step(); // "a" prefilled: its prompt is now in the cache, pinned by "a"
    expect(e.add("b", ids, sampling({ maxNewTokens: 8 }))).toBe(29);
    expect(e.add("c", Int32Array.from([...ids.subarray(0, 20), 1, 2, 3]), sampling({ maxNewTokens: 8 }))).toBe(20);
    expect(e.flushCache()).toBe(false);
    const got = await drain(e);
    const alone = await generate(engine(), "x", ids, sampling({ maxNewTokens: 8 }));
    expect(got.get("b")!.tokens).toEqual(alone.tokens);
    const aloneC = await generate(engine(), "y", Int32Array.from([...ids.subarray(0, 20), 1, 2, 3]), sampling({ maxNewTokens: 8 }));
    expect(got.get("c")!.tokens).toEqual(aloneC.tokens);
    const st = e.cacheStats();
    expect(st.freeSlots + st.cachedTokens).toBe(16384);
  });

  it("abort drops a request at any point and keeps its prefix cached", async () => {
    const e = engine();
    const ids = prompt(12, 5);
    e.add("a", ids, sampling({ maxNewTokens: 50 }));
    await e.step();
    await e.step();
    e.abort("a");
    e.abort("unknown");
    expect(e.running()).toBe(0);
    expect(await e.step()).toEqual([]);
    expect(e.cacheStats().cachedTokens).toBe(13); // 12 prompt + 1 fed sampled token
    // Abort while a step is in flight: no event after the step that was running.
    e.add("b", ids, sampling({ maxNewTokens: 50 }));
    const inFlight = e.step();
    e.abort("b");
    expect(e.running()).toBe(0);
    e.add("b", ids, sampling({ maxNewTokens: 2 })); // the rid is free again at once
    // Whether the abort landed before, during or after that step's compute, the old "b" yields no
    // event and the new "b" exactly its 2 tokens.
    const firstEvents = (await inFlight).filter((ev) => ev.rid === "b");
    const again = await drain(e);
    expect(firstEvents.length + again.get("b")!.tokens.length).toBe(2);
    expect(e.running()).toBe(0);
    expect(await e.step()).toEqual([]);
    // Abort before admission.
    e.add("c", ids, sampling());
    e.abort("c");
    expect(e.running()).toBe(0);
    const st = e.cacheStats();
    expect(st.freeSlots + st.cachedTokens).toBe(16384); // no slot leaked by any abort path
  });

  it("a small KV pool evicts cached prefixes and still serves every request", async () => {
    const e = engine({ cacheTokens: 512, maxRunning: 8 });
    const want = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => generate(engine(), `r${i}`, prompt(100, i), sampling({ maxNewTokens: 20 }))));
    // Rounds with and without a flush: a slot leak would starve a later round (an abort event).
    for (let round = 0; round < 4; round++) {
      [0, 1, 2, 3, 4, 5].forEach((i) => e.add(`r${i}`, prompt(100, i), sampling({ maxNewTokens: 20 })));
      if (round === 3) e.abort("r5");
      const got = await drain(e);
      [0, 1, 2, 3, 4].forEach((i) => expect(got.get(`r${i}`)!.tokens).toEqual(want[i]!.tokens));
      const st = e.cacheStats();
      expect(st.cachedTokens).toBeLessThanOrEqual(512);
      expect(st.freeSlots + st.cachedTokens).toBe(512); // every slot is free or cached when idle
      if (round === 1) expect(e.flushCache()).toBe(true);
    }
  });

  it("loadWeights swaps the weights, flushes the cache and refuses another shape", async () => {
    const e = engine();
    const ids = prompt(10, 6);
    await generate(e, "a", ids, sampling());
    expect(e.cacheStats().cachedTokens).toBeGreaterThan(0);
    const p2 = native.initModelParams(tiny, 99, 0.2);
    const dir = join(root, "w2");
    native.saveModelDir(dir, tiny, p2, "v2");
    await e.loadWeights(dir);
    expect(e.cacheStats().cachedTokens).toBe(0);
    expectClose(e.forwardLogits(ids), referenceLogits(tiny, p2, ids), 1e-4, "logits after reload");
    // A reload while a request runs: its pinned prefix is never reused, then dropped when it ends.
    e.add("long", ids, sampling({ maxNewTokens: 6 }));
    await e.step();
    native.saveModelDir(dir, tiny, params, "v3");
    await e.loadWeights(dir);
    expect(e.add("new", ids, sampling({ maxNewTokens: 6 }))).toBe(0);
    const got = await drain(e);
    expect(got.get("new")!.tokens).toEqual((await generate(engine(), "n", ids, sampling({ maxNewTokens: 6 }))).tokens);
    const st = e.cacheStats();
    expect(st.freeSlots + st.cachedTokens).toBe(16384);
    // "long" ended first (flushing the stale prefix), so "new", computed under v3 only, was cached.
    expect(st.cachedTokens).toBe(ids.length + 5);
    expect(e.add("again", ids, sampling({ maxNewTokens: 6 }))).toBe(ids.length - 1);
    expect((await drain(e)).get("again")!.tokens).toEqual(got.get("new")!.tokens);
    const other = join(root, "other");
    native.saveModelDir(other, tinyTied, native.initModelParams(tinyTied, 1, 0.02), null);
    await expect(e.loadWeights(other)).rejects.toThrow(/config differs/);
    await expect(e.loadWeights(join(root, "nowhere"))).rejects.toThrow(/config.json: not found/);
  });
});
