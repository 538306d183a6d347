// EngineClient against the hostile fake SGLang server (test/fixtures/hostile-sglang.ts): the happy
// path, then each hostile mode → the right typed error naming URL and field; retries only where allowed.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngineProtocolError, OozeError } from "../../src/errors.ts";
import { EngineClient, ROUTING_KEY_HEADER } from "../../src/engine/client.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";

let fake: HostileSglang;
let client: EngineClient;

beforeAll(async () => {
  fake = await startHostileSglang();
  client = new EngineClient(fake.url, { retries: 2, retryBaseMs: 1, timeoutMs: 2000 });
});
afterAll(async () => {
  await fake.close();
});

async function caught(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected a rejection");
}

async function drain(it: AsyncGenerator<unknown, unknown>): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const c of it) out.push(c);
  return out;
}

describe("EngineClient, well-behaved server", () => {
  it("generates: ids from triple position 1, logprobs from position 0, status from finish_reason", async () => {
    const r = await client.generate({ inputIds: [10, 11], sampling: { max_new_tokens: 3 }, returnLogprob: true, rid: "r1", routingKey: "sess-1" });
    expect(Array.from(r.outputIds)).toEqual([12, 13, 14]);
    expect(Array.from(r.logprobs)).toEqual([-0.125, -0.25, -0.375]);
    expect(r.finishReason).toEqual({ type: "length", length: 3 });
    expect(r.status).toBe("truncated");
    expect(r.meta).toMatchObject({ id: "r1", promptTokens: 2, completionTokens: 3, weightVersion: "v0" });
    const req = fake.seen.at(-1)!;
    expect(req.headers[ROUTING_KEY_HEADER.toLowerCase()]).toBe("sess-1");
    expect(req.body).toMatchObject({ input_ids: [10, 11], return_logprob: true, rid: "r1" });
  });

  it("sends a /generate body of exactly the request's fields, from typed or plain ids", async () => {
    await client.generate({ inputIds: Int32Array.of(7, 8, 9), sampling: { max_new_tokens: 2, temperature: 0.5 }, rid: "q", lora: 'a"b' });
    expect(fake.seen.at(-1)!.body).toEqual({ input_ids: [7, 8, 9], sampling_params: { max_new_tokens: 2, temperature: 0.5 }, rid: "q", lora_path: 'a"b' });
    await client.generate({ inputIds: [5], sampling: { max_new_tokens: 1 } });
    expect(fake.seen.at(-1)!.body).toEqual({ input_ids: [5], sampling_params: { max_new_tokens: 1 } });
  });

  it("streams cumulative chunks and returns the final result", async () => {
    const gen = client.generateStream({ inputIds: [1], sampling: { max_new_tokens: 4 }, returnLogprob: true });
    const lens: number[] = [];
    let step = await gen.next();
    while (!step.done) {
      lens.push(step.value.outputIds.length);
      step = await gen.next();
    }
    expect(lens).toEqual([1, 2, 3, 4]);
    expect(Array.from(step.value.outputIds)).toEqual([2, 3, 4, 5]);
    expect(step.value.status).toBe("truncated");
  });

  it("reads incremental chunks (SGLang's --incremental-streaming-output) as cumulative ones", async () => {
    fake.script("/generate", { kind: "incremental" });
    const gen = client.generateStream({ inputIds: [1], sampling: { max_new_tokens: 4 }, returnLogprob: true });
    const seen: number[][] = [];
    let step = await gen.next();
    while (!step.done) {
      seen.push(Array.from(step.value.outputIds));
      step = await gen.next();
    }
    expect(seen).toEqual([[2], [2, 3], [2, 3, 4], [2, 3, 4, 5]]);
    expect(Array.from(step.value.outputIds)).toEqual([2, 3, 4, 5]);
    expect(Array.from(step.value.logprobs)).toEqual([-0.125, -0.25, -0.375, -0.5]);
    expect(step.value.text).toBe("\u0002\u0003\u0004\u0005");
  });

  it("control endpoints", async () => {
    expect(await client.health()).toBe(true);
    expect((await client.modelInfo()).model_path).toBe("fake/model");
    expect((await client.serverInfo()).version).toBe("0.5.0-fake");
    expect(await client.flushCache()).toBe(true);
    const u = await client.updateWeightsFromDisk({ modelPath: "/tmp/x", weightVersion: "v7" });
    expect(u).toEqual({ success: true, message: "Succeeded to update model weights.", numPausedRequests: 0 });
    expect(await client.weightVersion()).toBe("v7");
    await client.pauseGeneration("retract");
    await client.continueGeneration();
    await client.abort({ rid: "x" });
    await client.abort({ all: true });
    expect(fake.seen.at(-1)!.body).toEqual({ abort_all: true });
    expect((await client.loads()).total).toBe(0);
  });
});

describe("EngineClient, hostile server", () => {
  it("malformed JSON from /generate → EngineProtocolError naming URL and body", async () => {
    fake.script("/generate", { kind: "malformed-json" });
    const e = await caught(client.generate({ inputIds: [1] }));
    expect(e).toBeInstanceOf(EngineProtocolError);
    expect((e as EngineProtocolError).url).toBe(`${fake.url}/generate`);
    expect((e as EngineProtocolError).field).toBe("body");
  });

  it("a missing field names the field", async () => {
    fake.script("/generate", { kind: "delete", field: "meta_info.finish_reason" });
    const e = (await caught(client.generate({ inputIds: [1] }))) as EngineProtocolError;
    expect(e).toBeInstanceOf(EngineProtocolError);
    expect(e.field).toBe("meta_info.finish_reason");
    expect(e.message).toContain(fake.url);
  });

  it("missing logprobs when requested, and a null finish_reason in a final response", async () => {
    fake.script("/generate", { kind: "delete", field: "meta_info.output_token_logprobs" }, { kind: "set", field: "meta_info.finish_reason", value: null });
    const a = (await caught(client.generate({ inputIds: [1], returnLogprob: true }))) as EngineProtocolError;
    expect(a.field).toBe("meta_info.output_token_logprobs");
    const b = (await caught(client.generate({ inputIds: [1] }))) as EngineProtocolError;
    expect(b.field).toBe("meta_info.finish_reason");
  });

  it("wrong types name the exact field", async () => {
    fake.script(
      "/generate",
      { kind: "set", field: "output_ids", value: "12,13" },
      { kind: "set", field: "meta_info.output_token_logprobs.1.0", value: "high" },
      { kind: "set", field: "meta_info.finish_reason", value: { type: "exploded" } },
    );
    expect(((await caught(client.generate({ inputIds: [1] }))) as EngineProtocolError).field).toBe("output_ids");
    expect(((await caught(client.generate({ inputIds: [1], returnLogprob: true }))) as EngineProtocolError).field).toBe(
      "meta_info.output_token_logprobs[1][0]",
    );
    expect(((await caught(client.generate({ inputIds: [1] }))) as EngineProtocolError).field).toBe("meta_info.finish_reason");
  });

  it("503 on /generate is not retried; 503 on GETs is retried until it succeeds", async () => {
    const before = fake.count("/generate");
    fake.script("/generate", { kind: "status", status: 503 });
    const e = (await caught(client.generate({ inputIds: [1] }))) as OozeError;
    expect(e.code).toBe("ENGINE_UNAVAILABLE");
    expect(e.retryable).toBe(true);
    expect(e.message).toContain(`${fake.url}/generate`);
    expect(fake.count("/generate") - before).toBe(1);

    const infoBefore = fake.count("/model_info");
    fake.script("/model_info", { kind: "status", status: 503 }, { kind: "reset" });
    expect((await client.modelInfo()).model_path).toBe("fake/model");
    expect(fake.count("/model_info") - infoBefore).toBe(3);
  });

  it("GET retries stop after the configured count", async () => {
    const before = fake.count("/get_weight_version");
    fake.script("/get_weight_version", ...Array.from({ length: 3 }, () => ({ kind: "status" as const, status: 503 })));
    const e = (await caught(client.weightVersion())) as OozeError;
    expect(e.code).toBe("ENGINE_UNAVAILABLE");
    expect(fake.count("/get_weight_version") - before).toBe(3);
  });

  it("a reset before the answer on /generate → ENGINE_UNAVAILABLE, one attempt", async () => {
    const before = fake.count("/generate");
    fake.script("/generate", { kind: "reset" });
    const e = (await caught(client.generate({ inputIds: [1] }))) as OozeError;
    expect(e.code).toBe("ENGINE_UNAVAILABLE");
    expect(fake.count("/generate") - before).toBe(1);
  });

  it("a server that never answers → TimeoutError naming the URL", async () => {
    const c = new EngineClient(fake.url, { retries: 0, generateTimeoutMs: 200 });
    fake.script("/generate", { kind: "hang" });
    const e = (await caught(c.generate({ inputIds: [1] }))) as OozeError;
    expect(e.code).toBe("TIMEOUT");
    expect(e.message).toContain(`${fake.url}/generate`);
  });

  it("a slow server within the deadline still answers", async () => {
    fake.script("/generate", { kind: "slow", ms: 50 });
    const r = await client.generate({ inputIds: [1], sampling: { max_new_tokens: 2 } });
    expect(Array.from(r.outputIds)).toEqual([2, 3]);
  });

  it("4xx → ENGINE_REJECTED with the server's message, not retried", async () => {
    fake.script("/generate", {
      kind: "status",
      status: 400,
      body: JSON.stringify({ object: "error", message: "top_p must be in (0, 1]", type: "Bad Request", param: null, code: 400 }),
    });
    const e = (await caught(client.generate({ inputIds: [1] }))) as OozeError;
    expect(e.code).toBe("ENGINE_REJECTED");
    expect(e.retryable).toBe(false);
    expect(e.message).toContain("top_p must be in (0, 1]");
  });

  it("a connection reset mid-stream is a clear ENGINE_UNAVAILABLE after the chunks received", async () => {
    fake.script("/generate", { kind: "reset-mid-stream", after: 2 });
    const got: unknown[] = [];
    const e = (await caught(
      (async () => {
        for await (const c of client.generateStream({ inputIds: [1], sampling: { max_new_tokens: 6 } })) got.push(c);
      })(),
    )) as OozeError;
    expect(got.length).toBe(2);
    expect(e.code).toBe("ENGINE_UNAVAILABLE");
    expect(e.message).toContain("mid-stream after 2 chunks");
    expect(e.message).toContain(fake.url);
  });

  it("stream: error event → ENGINE_REJECTED; no [DONE] → ENGINE_UNAVAILABLE; bad chunk → protocol error", async () => {
    fake.script("/generate", { kind: "stream-error", after: 1 }, { kind: "no-done" }, { kind: "malformed-json" }, { kind: "delete", field: "meta_info.id" });
    const s = { inputIds: [1], sampling: { max_new_tokens: 3 } };
    const a = (await caught(drain(client.generateStream(s)))) as OozeError;
    expect(a.code).toBe("ENGINE_REJECTED");
    expect(a.message).toContain("fake failure inside generate");
    const b = (await caught(drain(client.generateStream(s)))) as OozeError;
    expect(b.code).toBe("ENGINE_UNAVAILABLE");
    expect(b.message).toContain("[DONE]");
    const c = (await caught(drain(client.generateStream(s)))) as EngineProtocolError;
    expect(c).toBeInstanceOf(EngineProtocolError);
    expect(c.field).toBe("data");
    const d = (await caught(drain(client.generateStream(s)))) as EngineProtocolError;
    expect(d.field).toBe("data[0].meta_info.id");
  });

  it("health is false on 503 after retries, control-call malformed bodies name the field", async () => {
    fake.script("/health", ...Array.from({ length: 3 }, () => ({ kind: "status" as const, status: 503 })));
    expect(await client.health()).toBe(false);
    fake.script("/get_weight_version", { kind: "set", field: "weight_version", value: 3 });
    expect(((await caught(client.weightVersion())) as EngineProtocolError).field).toBe("weight_version");
    fake.script("/v1/loads", { kind: "set", field: "loads", value: "busy" });
    expect(((await caught(client.loads())) as EngineProtocolError).field).toBe("loads");
    fake.script("/update_weights_from_disk", { kind: "delete", field: "success" });
    expect(((await caught(client.updateWeightsFromDisk({ modelPath: "/x" }))) as EngineProtocolError).field).toBe("success");
  });

  it("an unreachable engine → ENGINE_UNAVAILABLE naming the URL", async () => {
    const dead = new EngineClient("http://127.0.0.1:1", { retries: 1, retryBaseMs: 1 });
    const e = (await caught(dead.generate({ inputIds: [1] }))) as OozeError;
    expect(e.code).toBe("ENGINE_UNAVAILABLE");
    expect(e.message).toContain("http://127.0.0.1:1/generate");
    expect(await dead.health()).toBe(false);
  });
});
