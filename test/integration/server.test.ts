// The SGLang-compatible engine server over the REAL native backend (a tiny random model written to a
// temp dir), driven through EngineClient and raw fetch against /work/shared/sglang-api.md.
import { mkdtempSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient, type GenerateRequest } from "../../src/engine/client.ts";
import type { GenerateOutput } from "../../src/engine/protocol.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { OozeError } from "../../src/errors.ts";
import { postJson } from "../harness/http.ts";

let dir: string;
let dir2: string;
let backend: InferenceBackend;
let server: EngineServer;
let client: EngineClient;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "ooze-server-"));
  dir2 = mkdtempSync(join(tmpdir(), "ooze-server2-"));
  await initModelDir("tiny", dir, 1);
  await initModelDir("tiny", dir2, 2);
  backend = createNativeBackend({ modelDir: dir, maxRunning: 16 });
  server = await startEngineServer({ backend, weightVersion: "v1", maxRunning: 16 });
  client = new EngineClient(server.url, { retries: 0 });
});
afterAll(async () => {
  await server?.close();
  backend?.close();
  rmSync(dir, { recursive: true, force: true });
  rmSync(dir2, { recursive: true, force: true });
});

async function waitUntil(what: string, cond: () => Promise<boolean> | boolean, deadlineMs = 20_000): Promise<void> {
  const end = Date.now() + deadlineMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out after ${deadlineMs} ms waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const post = (path: string, body: unknown) => postJson(`${server.url}${path}`, body);

/** Starts a stream and resolves after its first chunk; `rest` drains it to the final result. */
async function started(req: GenerateRequest) {
  const gen = client.generateStream({ returnLogprob: true, ...req });
  const first = await gen.next();
  if (first.done) throw new Error("stream ended at once");
  const rest = (async () => {
    const chunks: GenerateOutput[] = [first.value];
    for (;;) {
      const n = await gen.next();
      if (n.done) return { chunks, result: n.value };
      chunks.push(n.value);
    }
  })();
  return { first: first.value, rest };
}

const long = { max_new_tokens: 300, ignore_eos: true, temperature: 0 };

describe("engine server: /generate", () => {
  it("generates from input_ids with logprob triples and meta_info", async () => {
    const r = await client.generate({ inputIds: [256, 72, 105], sampling: { max_new_tokens: 6, ignore_eos: true, sampling_seed: 7 }, returnLogprob: true, rid: "g1" });
    expect(r.outputIds.length).toBe(6);
    expect(r.logprobs.length).toBe(6);
    for (const lp of r.logprobs) expect(lp).toBeLessThanOrEqual(0);
    expect(r.finishReason).toEqual({ type: "length", length: 6 });
    expect(r.status).toBe("truncated");
    expect(r.meta).toMatchObject({ id: "g1", promptTokens: 3, completionTokens: 6, weightVersion: "v1" });
    expect(r.meta.e2eLatency).toBeGreaterThanOrEqual(0);
    const raw = r.meta.raw.output_token_logprobs as unknown[][];
    expect(raw[0]).toEqual([r.logprobs[0], r.outputIds[0], null]);
  });

  it("text input, output text, return_text_in_logprobs, PUT accepted", async () => {
    const res = await fetch(`${server.url}/generate`, {
      method: "PUT",
      body: JSON.stringify({ text: "Hi", sampling_params: { max_new_tokens: 3, ignore_eos: true }, return_logprob: true, return_text_in_logprobs: true }),
    });
    expect(res.status).toBe(200);
    const j = (await res.json()) as any;
    expect(j.meta_info.prompt_tokens).toBe(3); // BOS + 2 bytes
    expect(j.output_ids.length).toBe(3);
    expect(typeof j.text).toBe("string");
    expect(typeof j.meta_info.output_token_logprobs[0][2]).toBe("string");
    expect(j.meta_info.finish_reason).toEqual({ type: "length", length: 3 });
    expect(typeof j.meta_info.cached_tokens).toBe("number");
  });

  it("seeded sampling and greedy decoding are deterministic", async () => {
    const s = { max_new_tokens: 8, ignore_eos: true, sampling_seed: 1234, temperature: 1.0 };
    const a = await client.generate({ inputIds: [1, 2, 3], sampling: s, returnLogprob: true });
    const b = await client.generate({ inputIds: [1, 2, 3], sampling: s, returnLogprob: true });
    expect(Array.from(b.outputIds)).toEqual(Array.from(a.outputIds));
    expect(Array.from(b.logprobs)).toEqual(Array.from(a.logprobs));
    const g1 = await client.generate({ inputIds: [5, 6], sampling: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
    const g2 = await client.generate({ inputIds: [5, 6], sampling: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
    expect(Array.from(g2.outputIds)).toEqual(Array.from(g1.outputIds));
  });

  it("streams cumulative chunks ending in [DONE], equal to the non-streamed result", async () => {
    const s = { max_new_tokens: 5, ignore_eos: true, sampling_seed: 99 };
    const { rest } = await started({ inputIds: [9, 8, 7], sampling: s });
    const { chunks, result } = await rest;
    expect(chunks.map((c) => c.outputIds.length)).toEqual([1, 2, 3, 4, 5]);
    for (let i = 1; i < chunks.length; i++) expect(Array.from(chunks[i]!.outputIds.slice(0, i))).toEqual(Array.from(chunks[i - 1]!.outputIds));
    expect(chunks.slice(0, -1).every((c) => c.finishReason === null)).toBe(true);
    const plain = await client.generate({ inputIds: [9, 8, 7], sampling: s, returnLogprob: true });
    expect(Array.from(result.outputIds)).toEqual(Array.from(plain.outputIds));
    const raw = await (await fetch(`${server.url}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [1], sampling_params: { max_new_tokens: 2 }, stream: true }) })).text();
    expect(raw.startsWith("data: {")).toBe(true);
    expect(raw.endsWith("data: [DONE]\n\n")).toBe(true);
  });

  it("batches and n > 1 answer lists in order; batch stream chunks carry index", async () => {
    const b = await post("/generate", { input_ids: [[1, 2], [3], [4, 5, 6]], sampling_params: [{ max_new_tokens: 1 }, { max_new_tokens: 2 }, { max_new_tokens: 3 }], rid: ["a", "b", "c"] });
    expect(b.status).toBe(200);
    expect(b.json.map((o: any) => o.meta_info.id)).toEqual(["a", "b", "c"]);
    expect(b.json.map((o: any) => o.meta_info.prompt_tokens)).toEqual([2, 1, 3]);
    expect(b.json.map((o: any) => o.meta_info.completion_tokens)).toEqual([1, 2, 3].map((n, i) => Math.min(n, b.json[i].output_ids.length)));
    const n = await post("/generate", { input_ids: [1, 2], sampling_params: { max_new_tokens: 4, n: 3, sampling_seed: 5, ignore_eos: true }, rid: "par" });
    expect(n.status).toBe(200);
    expect(n.json.map((o: any) => o.meta_info.id)).toEqual(["par_0", "par_1", "par_2"]);
    expect(n.json.every((o: any) => o.output_ids.length === 4)).toBe(true);
    const s = await (await fetch(`${server.url}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [[1], [2]], sampling_params: { max_new_tokens: 2, ignore_eos: true }, stream: true }) })).text();
    const events = s.split("\n\n").filter(Boolean);
    expect(events.at(-1)).toBe("data: [DONE]");
    const idx = new Set(events.slice(0, -1).map((e) => JSON.parse(e.slice(6)).index));
    expect(idx).toEqual(new Set([0, 1]));
  });

  it("stop_token_ids and stop strings finish with type stop and trim the text", async () => {
    const probe = await client.generate({ inputIds: [10, 20], sampling: { max_new_tokens: 24, temperature: 0, ignore_eos: true } });
    const ids = Array.from(probe.outputIds);
    const k = 3;
    const t = await client.generate({ inputIds: [10, 20], sampling: { max_new_tokens: 24, temperature: 0, stop_token_ids: [ids[k]!] } });
    const first = ids.indexOf(ids[k]!);
    expect(t.finishReason).toEqual({ type: "stop", matched: ids[k] });
    expect(t.outputIds.length).toBe(first + 1);
    const ascii = ids.find((x) => x >= 32 && x < 127);
    if (ascii !== undefined) {
      const stop = String.fromCharCode(ascii);
      const r = await post("/generate", { input_ids: [10, 20], sampling_params: { max_new_tokens: 24, temperature: 0, stop, ignore_eos: true } });
      expect(r.json.meta_info.finish_reason).toEqual({ type: "stop", matched: stop });
      expect(r.json.text.includes(stop)).toBe(false);
      expect(r.json.output_ids.at(-1)).toBe(ascii);
    }
  });

  it("concurrent requests all complete", async () => {
    const rs = await Promise.all(
      Array.from({ length: 12 }, (_, i) => client.generate({ inputIds: [i + 1, i + 2], sampling: { max_new_tokens: 4 + (i % 3), ignore_eos: true }, returnLogprob: true })),
    );
    rs.forEach((r, i) => {
      expect(r.outputIds.length).toBe(4 + (i % 3));
      expect(r.status).toBe("truncated");
    });
  });
});

describe("engine server: control", () => {
  it("health, model_info, server_info, weight version, loads", async () => {
    expect(await client.health()).toBe(true);
    expect(await client.health({ generate: true })).toBe(true);
    const mi = await client.modelInfo();
    expect(mi).toMatchObject({ model_path: dir, is_generation: true, weight_version: "v1" });
    expect((await (await fetch(`${server.url}/get_model_info`)).json()) as object).toEqual(mi);
    const si = await client.serverInfo();
    expect(si).toMatchObject({ tp_size: 1, dp_size: 1, page_size: 1 });
    expect(typeof si.max_total_num_tokens).toBe("number");
    expect(typeof si.version).toBe("string");
    expect(await client.weightVersion()).toBe("v1");
    expect(await client.loads()).toMatchObject({ running: 0, waiting: 0, total: 0 });
  });

  it("abort_request ends a running request with finish_reason abort", async () => {
    const { rest } = await started({ inputIds: [3, 4], sampling: long, rid: "to-abort" });
    await client.abort({ rid: "to-abort" });
    const { result } = await rest;
    expect(result.finishReason.type).toBe("abort");
    expect(result.status).toBe("aborted");
    expect(result.outputIds.length).toBe(result.logprobs.length);
    await waitUntil("loads drop to zero", async () => (await client.loads()).total === 0);
  });

  it("pause abort → in-flight aborted, new requests wait; continue → they run", async () => {
    const { rest } = await started({ inputIds: [1, 1], sampling: long });
    await client.pauseGeneration("abort");
    expect((await rest).result.status).toBe("aborted");
    const waiting = client.generate({ inputIds: [2, 2], sampling: { max_new_tokens: 3, ignore_eos: true } });
    await waitUntil("the new request is counted as waiting", async () => (await client.loads()).waiting === 1);
    expect(await client.health()).toBe(true); // a paused engine is alive
    await client.continueGeneration();
    expect((await waiting).outputIds.length).toBe(3);
  });

  it("pause retract and in_place keep requests; continue finishes them in full", async () => {
    for (const mode of ["retract", "in_place"] as const) {
      const { rest } = await started({ inputIds: [7, 7, 7], sampling: { max_new_tokens: 150, ignore_eos: true, sampling_seed: 3 } });
      await client.pauseGeneration(mode);
      expect((await client.loads()).total).toBe(1);
      await client.continueGeneration();
      const { result } = await rest;
      expect(result.finishReason).toEqual({ type: "length", length: 150 });
      expect(result.outputIds.length).toBe(150);
      expect(result.logprobs.length).toBe(150);
    }
  });

  it("flush_cache: 400 while busy, 200 when idle", async () => {
    const { rest } = await started({ inputIds: [4, 4], sampling: long, rid: "busy" });
    expect(await client.flushCache()).toBe(false);
    await client.abort({ rid: "busy" });
    await rest;
    await waitUntil("idle", async () => (await client.loads()).total === 0);
    expect(await client.flushCache()).toBe(true);
  });

  it("update_weights_from_disk swaps weights and bumps weight_version; failures are 400", async () => {
    const before = await client.generate({ inputIds: [1, 2, 3], sampling: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
    const u = await client.updateWeightsFromDisk({ modelPath: dir2, weightVersion: "v2" });
    expect(u).toMatchObject({ success: true, numPausedRequests: 0 });
    expect(await client.weightVersion()).toBe("v2");
    expect((await client.modelInfo()).model_path).toBe(dir2);
    const after = await client.generate({ inputIds: [1, 2, 3], sampling: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
    expect(after.meta.weightVersion).toBe("v2");
    expect(Array.from(after.outputIds)).not.toEqual(Array.from(before.outputIds));
    const bad = await client.updateWeightsFromDisk({ modelPath: join(dir, "missing"), weightVersion: "v3" });
    expect(bad.success).toBe(false);
    expect(await client.weightVersion()).toBe("v2");
    const noPath = await post("/update_weights_from_disk", { weight_version: "v9" });
    expect(noPath.status).toBe(400);
    expect(noPath.json).toMatchObject({ object: "error", type: "Bad Request", code: 400 });
    // Back to the first weights for the other tests.
    expect((await client.updateWeightsFromDisk({ modelPath: dir, weightVersion: "v1" })).success).toBe(true);
  });

  it("the refit sequence: pause in_place → update (requests kept) → continue; abort_all_requests aborts", async () => {
    const { rest } = await started({ inputIds: [6, 6], sampling: { max_new_tokens: 150, ignore_eos: true } });
    await client.pauseGeneration("in_place");
    const u = await client.updateWeightsFromDisk({ modelPath: dir2, weightVersion: "v5" });
    expect(u).toMatchObject({ success: true, numPausedRequests: 1 });
    await client.continueGeneration();
    const { result } = await rest;
    expect(result.outputIds.length).toBe(150);
    expect(result.meta.weightVersion).toBe("v5");

    const second = await started({ inputIds: [6, 7], sampling: long });
    const v = await client.updateWeightsFromDisk({ modelPath: dir, weightVersion: "v1", abortAllRequests: true });
    expect(v.success).toBe(true);
    expect((await second.rest).result.status).toBe("aborted");
    expect(await client.weightVersion()).toBe("v1");
  });

  it("a client disconnect aborts its request", async () => {
    const ctl = new AbortController();
    const res = await fetch(`${server.url}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [5, 5], sampling_params: long, stream: true, rid: "gone" }), signal: ctl.signal });
    const reader = res.body!.getReader();
    await reader.read();
    ctl.abort();
    await waitUntil("the disconnected request is dropped", async () => (await client.loads()).total === 0);
  });
});

describe("engine server: SGLang fidelity (flush with pending requests, stale prefixes after a weight update)", () => {
  // SGLang v0.5.x http_server.py: the same text either way, 200 flushed / 400 not, no content-type.
  const FLUSH_BODY = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";
  const flush = async () => {
    const res = await fetch(`${server.url}/flush_cache`, { method: "POST" });
    return { status: res.status, text: await res.text(), type: res.headers.get("content-type") };
  };
  const prompt = Array.from({ length: 40 }, (_, i) => (i * 7 + 3) % 200);
  const greedy = { max_new_tokens: 6, temperature: 0, ignore_eos: true };

  it("/flush_cache with a running request, and with waiting ones (paused), answers 400 with SGLang's body and flushes nothing", async () => {
    await waitUntil("idle", async () => (await client.loads()).total === 0);
    await client.generate({ inputIds: prompt, sampling: greedy }); // caches the prompt
    const cached = backend.cacheStats().cachedTokens;
    expect(cached).toBeGreaterThan(0);
    // running
    const { rest } = await started({ inputIds: [4, 4], sampling: long, rid: "flush-running" });
    expect(await flush()).toEqual({ status: 400, text: FLUSH_BODY, type: null });
    await client.abort({ rid: "flush-running" });
    await rest;
    // waiting: paused, a new request queued
    await waitUntil("idle", async () => (await client.loads()).total === 0);
    await client.pauseGeneration("abort");
    const waiting = client.generate({ inputIds: prompt, sampling: greedy });
    await waitUntil("the request is counted as waiting", async () => (await client.loads()).waiting === 1);
    expect(await flush()).toEqual({ status: 400, text: FLUSH_BODY, type: null });
    await client.continueGeneration();
    const w = await waiting;
    expect(w.meta.cachedTokens).toBe(prompt.length - 1); // the cache survived both refusals
    await waitUntil("idle", async () => (await client.loads()).total === 0);
    expect(await flush()).toEqual({ status: 200, text: FLUSH_BODY, type: null });
    expect(backend.cacheStats().cachedTokens).toBe(0);
  });

  it("after update_weights_from_disk no request reuses keys/values of the old weights (unless flush_cache is false, as in SGLang): logprobs equal a fresh engine's on the new weights", async () => {
    const freshBackend = createNativeBackend({ modelDir: dir2, maxRunning: 4 });
    const fresh = await startEngineServer({ backend: freshBackend });
    try {
      const freshClient = new EngineClient(fresh.url, { retries: 0 });
      const longer = [...prompt, 9, 8, 7];
      const want = await freshClient.generate({ inputIds: longer, sampling: greedy, returnLogprob: true });
      const same = (got: GenerateOutput, what: string) => {
        expect(Array.from(got.outputIds), what).toEqual(Array.from(want.outputIds));
        for (let i = 0; i < want.logprobs.length; i++) expect(Math.abs(got.logprobs[i]! - want.logprobs[i]!), `${what}: logprob ${i}`).toBeLessThanOrEqual(1e-5);
      };
      // 1. idle engine, prefix cached under the old weights. flush_cache: false keeps the cache, as
      // SGLang does (train.keepCacheOnUpdate): the prefix is reused under the new weights. The
      // default update flushes it.
      await waitUntil("idle", async () => (await client.loads()).total === 0);
      await client.generate({ inputIds: prompt, sampling: greedy });
      expect((await client.updateWeightsFromDisk({ modelPath: dir2, weightVersion: "fresh-0", flushCache: false })).success).toBe(true);
      expect((await client.generate({ inputIds: longer, sampling: greedy })).meta.cachedTokens).toBeGreaterThan(0);
      expect((await client.updateWeightsFromDisk({ modelPath: dir2, weightVersion: "fresh-1" })).success).toBe(true);
      const a = await client.generate({ inputIds: longer, sampling: greedy, returnLogprob: true });
      expect(a.meta.cachedTokens).toBe(0);
      same(a, "idle update");
      // 2. a request pinning the prefix runs across the update (pause in_place → update → continue)
      expect((await client.updateWeightsFromDisk({ modelPath: dir, weightVersion: "v1" })).success).toBe(true);
      const pinned = await started({ inputIds: prompt, sampling: { max_new_tokens: 250, ignore_eos: true }, rid: "pins-prefix" });
      await client.pauseGeneration("in_place");
      expect((await client.updateWeightsFromDisk({ modelPath: dir2, weightVersion: "fresh-2" })).success).toBe(true);
      await client.continueGeneration();
      const b = await client.generate({ inputIds: longer, sampling: greedy, returnLogprob: true });
      expect(b.meta.cachedTokens).toBe(0);
      same(b, "update while a request pinned the old prefix");
      await client.abort({ rid: "pins-prefix" });
      await pinned.rest;
      // 3. once the stale request is gone, the cache works again, with keys/values of the new weights
      const c1 = await client.generate({ inputIds: longer, sampling: greedy, returnLogprob: true });
      const c2 = await client.generate({ inputIds: longer, sampling: greedy, returnLogprob: true });
      same(c1, "after the stale request ended");
      same(c2, "served from the new cache");
      expect(c2.meta.cachedTokens).toBeGreaterThan(0);
    } finally {
      await fresh.close();
      freshBackend.close();
      expect((await client.updateWeightsFromDisk({ modelPath: dir, weightVersion: "v1" })).success).toBe(true);
    }
  });
});

/** Raw bytes written to a fresh connection, `gapMs` apart: what comes back before the server closes it. */
function rawExchange(port: number, writes: string[], gapMs = 200): Promise<string> {
  return new Promise<string>((resolve) => {
    let got = "";
    const s = connect(port, "127.0.0.1", async () => {
      for (const [i, w] of writes.entries()) {
        if (i > 0) await new Promise((r) => setTimeout(r, gapMs));
        if (s.writable) s.write(w);
      }
    });
    s.on("data", (d) => (got += d.toString("latin1")));
    s.on("close", () => resolve(got));
    s.on("error", () => resolve(got));
  });
}

describe("engine server: bad requests and garbage", () => {
  const bad: [string, unknown][] = [
    ["both text and input_ids", { text: "a", input_ids: [1] }],
    ["neither", { sampling_params: {} }],
    ["top_p 0", { input_ids: [1], sampling_params: { top_p: 0 } }],
    ["top_k 0", { input_ids: [1], sampling_params: { top_k: 0 } }],
    ["negative temperature", { input_ids: [1], sampling_params: { temperature: -1 } }],
    ["min > max", { input_ids: [1], sampling_params: { max_new_tokens: 2, min_new_tokens: 5 } }],
    ["n 0", { input_ids: [1], sampling_params: { n: 0 } }],
    ["token out of vocabulary", { input_ids: [1, 100000] }],
    ["wrong type", { input_ids: "abc" }],
    ["float token", { input_ids: [1.5] }],
    ["huge number", { input_ids: [1], sampling_params: { max_new_tokens: 1e300 } }],
    ["empty input", { input_ids: [] }],
    ["rid list for one input", { input_ids: [1], rid: ["a", "b"] }],
    ["sampling list length", { input_ids: [[1], [2]], sampling_params: [{}] }],
    ["top logprobs", { input_ids: [1], return_logprob: true, top_logprobs_num: 3 }],
    ["body is a list", [1, 2, 3]],
    ["body is null", null],
  ];
  it.each(bad)("%s → 400 with SGLang's error body", async (_name, body) => {
    const r = await post("/generate", body);
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ object: "error", type: "Bad Request", param: null, code: 400 });
    expect(typeof r.json.message).toBe("string");
  });

  it("null sampling values mean the defaults", async () => {
    const r = await post("/generate", { input_ids: [1], sampling_params: { temperature: null, top_p: null, top_k: null, max_new_tokens: 2, stop: null, n: null } });
    expect(r.status).toBe(200);
    expect(r.json.output_ids.length).toBeLessThanOrEqual(2);
  });

  it("a prompt longer than the context → 400 {error:{message}}", async () => {
    const r = await post("/generate", { input_ids: Array.from({ length: backend.info.maxContext + 1 }, () => 1) });
    expect(r.status).toBe(400);
    expect(r.json.error.message).toContain("context length");
  });

  it("invalid JSON, unknown endpoints, wrong methods and raw garbage do not crash the server", async () => {
    const j = await post("/generate", "{not json");
    expect(j.status).toBe(400);
    expect(j.json.object).toBe("error");
    const nf = await fetch(`${server.url}/no/such/thing`);
    expect(nf.status).toBe(404);
    expect(await nf.json()).toEqual({ detail: "Not Found" });
    expect((await fetch(`${server.url}/generate`)).status).toBe(405);
    expect((await post("/pause_generation", { mode: "sideways" })).status).toBe(400);
    // a fresh connection's garbage: a 400 that says why
    const fresh = await rawExchange(server.port, ["\x00\x01GARBAGE\r\n\r\n\xff\xfe"]);
    expect(fresh).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(fresh).toMatch(/the server could not read the request \(HPE_[A-Z_]+\)/);
    // garbage after a response on a kept-alive connection: closed, no 400 the client could take for its next answer
    const body = JSON.stringify({ input_ids: [1], sampling_params: { max_new_tokens: 2 } });
    const ok = `POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`;
    const used = await rawExchange(server.port, [ok, "\x00\x01GARBAGE\r\n\r\n"]);
    expect(used).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(used).not.toContain(" 400 ");
    const r = await client.generate({ inputIds: [1], sampling: { max_new_tokens: 2 } });
    expect(r.outputIds.length).toBeGreaterThan(0);
    expect(await client.health()).toBe(true);
  });

  it("a request whose head arrives slowly is answered; past requestReadTimeoutMs, 408 with the reason", async () => {
    const body = JSON.stringify({ input_ids: [1], sampling_params: { max_new_tokens: 2 } });
    const head = "POST /generate HTTP/1.1\r\nhost: x\r\n";
    const rest = `content-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`;
    const slow = (port: number) => rawExchange(port, [head, rest], 1_200);
    expect(await slow(server.port)).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    const strict = await startEngineServer({ backend, requestReadTimeoutMs: 400 });
    try {
      const got = await slow(strict.port);
      expect(got).toMatch(/^HTTP\/1\.1 408 Request Timeout\r\n/);
      expect(got).toContain("the server could not read the request (ERR_HTTP_REQUEST_TIMEOUT)");
    } finally {
      await strict.close();
    }
  });

  it("the client surfaces a 400 as ENGINE_REJECTED", async () => {
    const e = await client.generate({ inputIds: [1], sampling: { top_p: 2 } }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OozeError);
    expect((e as OozeError).code).toBe("ENGINE_REJECTED");
    expect((e as OozeError).message).toContain("top_p");
  });
});
