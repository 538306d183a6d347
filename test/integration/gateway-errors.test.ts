// Every refusal of the gateway, in each API's own error shape and status, over a real socket with the
// official SDKs where they can send the request (raw fetch where they cannot: malformed JSON, no key):
// wrong and missing keys, unknown and closed sessions, malformed JSON, fields of the wrong type,
// over-long context, spent maxTurns / maxTokens (recorded in the episode), no engine (before and
// after a stream began), a wrong method, and a stream the agent abandons (aborted at the fleet,
// recorded once), before its first token or mid-answer.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { EOS_ID, encodeBytes } from "../../src/engine/tokenizer.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { startHostileSglang, type HostileSglang } from "../fixtures/hostile-sglang.ts";
import { waitUntil } from "../harness/index.ts";

let fake: HostileSglang;
let fleet: Fleet;
let empty: Fleet;
let gw: Gateway;
let gwNoEngine: Gateway;

const ids = (text: string) => [...encodeBytes(text), EOS_ID];
const user = (content: string) => [{ role: "user" as const, content }];

beforeAll(async () => {
  fake = await startHostileSglang();
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000 });
  await fleet.attach(fake.url);
  gw = await Gateway.start({ fleet, contextLength: 96, model: "m" });
  empty = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 200 });
  gwNoEngine = await Gateway.start({ fleet: empty, contextLength: 96, model: "m" });
});

afterAll(async () => {
  await gw?.close();
  await gwNoEngine?.close();
  await fleet?.close();
  await empty?.close();
  await fake?.close();
});

async function raw(url: string, init: RequestInit): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url, init);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function openaiError(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  const e = await p.then(
    () => null,
    (x: unknown) => x,
  );
  if (!(e instanceof OpenAI.APIError)) throw new Error(`expected an OpenAI APIError, got ${String(e)}`);
  return e;
}

async function anthropicError(p: Promise<unknown>): Promise<InstanceType<typeof Anthropic.APIError>> {
  const e = await p.then(
    () => null,
    (x: unknown) => x,
  );
  if (!(e instanceof Anthropic.APIError)) throw new Error(`expected an Anthropic APIError, got ${String(e)}`);
  return e;
}

describe("gateway: errors", () => {
  it("refuses other keys, missing keys, unknown and closed sessions in each API's shape", async () => {
    const s = gw.openSession({ episodeId: "e", groupIndex: 0 });
    const wrongOpenAI = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: "sk-other", maxRetries: 0 });
    const e1 = await openaiError(wrongOpenAI.chat.completions.create({ model: "m", messages: user("hi") }));
    expect(e1.status).toBe(401);
    expect(e1.error).toMatchObject({ type: "invalid_request_error", code: "invalid_api_key", param: null });
    const wrongAnthropic = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: "sk-other", maxRetries: 0 });
    const e2 = await anthropicError(wrongAnthropic.messages.create({ model: "m", max_tokens: 5, messages: user("hi") }));
    expect(e2.status).toBe(401);
    expect(e2.error).toMatchObject({ type: "error", error: { type: "authentication_error" } });

    const none = await raw(`${s.openaiBaseUrl}/chat/completions`, { method: "POST", body: JSON.stringify({ model: "m", messages: user("hi") }) });
    expect(none.status).toBe(401);
    expect((none.body.error as { message: string }).message).toMatch(/no API key/);

    const unknown = await raw(`${gw.url}/s/nosuchsession/v1/messages`, { method: "POST", headers: { "x-api-key": s.apiKey }, body: "{}" });
    expect(unknown.status).toBe(404);
    expect(unknown.body).toMatchObject({ type: "error", error: { type: "not_found_error" } });
    const nowhere = await raw(`${gw.url}/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${s.apiKey}` }, body: "{}" });
    expect(nowhere.status).toBe(404);
    expect(nowhere.body).toMatchObject({ error: { type: "invalid_request_error", code: "not_found" } });

    const get = await raw(`${s.openaiBaseUrl}/chat/completions`, { headers: { authorization: `Bearer ${s.apiKey}` } });
    expect(get.status).toBe(405);

    const rep = gw.closeSession(s.id);
    expect(rep.samples).toEqual([]);
    const closed = await openaiError(new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 }).chat.completions.create({ model: "m", messages: user("hi") }));
    expect(closed.status).toBe(404);
    // A refused key never reaches a session: nothing was generated.
    expect(fake.count("/generate")).toBe(0);
  });

  it("answers malformed JSON and wrong field types with 400 naming the field", async () => {
    const s = gw.openSession({ episodeId: "e", groupIndex: 0 });
    const bad = await raw(`${s.openaiBaseUrl}/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${s.apiKey}` }, body: '{"model": "m", "messages": [' });
    expect(bad.status).toBe(400);
    expect(bad.body).toMatchObject({ error: { type: "invalid_request_error", param: "body" } });
    expect((bad.body.error as { message: string }).message).toMatch(/not valid JSON/);
    const badA = await raw(`${s.anthropicBaseUrl}/v1/messages`, { method: "POST", headers: { "x-api-key": s.apiKey }, body: "{nope" });
    expect(badA.status).toBe(400);
    expect(badA.body).toMatchObject({ type: "error", error: { type: "invalid_request_error" } });

    const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const cases: [Record<string, unknown>, string][] = [
      [{ messages: "hi" }, "messages"],
      [{ messages: user("hi"), temperature: "hot" }, "temperature"],
      [{ messages: [{ role: "robot", content: "x" }] }, "messages[0].role"],
      [{ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }, "messages[0].content[0].type"],
      [{ messages: user("hi"), max_tokens: -3 }, "max_tokens"],
      [{ messages: user("hi"), tools: [{ type: "function", function: { name: 5 } }] }, "tools[0].function.name"],
    ];
    for (const [body, param] of cases) {
      const e = await openaiError(ai.chat.completions.create({ model: "m", ...body } as never));
      expect(e.status, param).toBe(400);
      expect(e.error, param).toMatchObject({ type: "invalid_request_error", param });
    }
    const an = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const e3 = await anthropicError(an.messages.create({ model: "m", messages: user("hi") } as never));
    expect(e3.status).toBe(400);
    expect(e3.message).toMatch(/max_tokens/);
    const e4 = await anthropicError(an.messages.create({ model: "m", max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "" } }] }] }));
    expect(e4.message).toMatch(/messages\[0\]\.content\[0\]\.type/);
    const rep = gw.closeSession(s.id);
    // Client mistakes are not the episode's failure.
    expect(rep.error).toBeNull();
    expect(fake.count("/generate")).toBe(0);
  });

  it("refuses an over-long context and spent limits, and records them in the episode", async () => {
    const s = gw.openSession({ episodeId: "e", groupIndex: 0, maxTurns: 2, maxTokens: 12 });
    const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const long = await openaiError(ai.chat.completions.create({ model: "m", messages: user("x".repeat(200)) }));
    expect(long.status).toBe(400);
    expect(long.error).toMatchObject({ code: "context_length_exceeded", param: "messages" });
    expect(long.message).toMatch(/context length is 96 tokens/);
    const an = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const longA = await anthropicError(an.messages.create({ model: "m", max_tokens: 5, messages: user("x".repeat(200)) }));
    expect(longA.status).toBe(400);
    expect(longA.error).toMatchObject({ type: "error", error: { type: "invalid_request_error" } });

    fake.script("/generate", { kind: "tokens", ids: ids("0123456789") });
    await ai.chat.completions.create({ model: "m", messages: user("count"), max_tokens: 50 });
    // The request's max_tokens is capped by the context left and by the episode's token budget.
    const sent = fake.seen.filter((x) => x.path === "/generate").at(-1)!.body as { sampling_params: { max_new_tokens: number } };
    expect(sent.sampling_params.max_new_tokens).toBe(12);
    fake.script("/generate", { kind: "tokens", ids: ids("abcdefgh") });
    const r2 = await ai.chat.completions.create({ model: "m", messages: user("more") });
    expect(r2.choices[0]!.finish_reason).toBe("length");
    expect(r2.usage!.completion_tokens).toBe(1);
    const spent = await openaiError(ai.chat.completions.create({ model: "m", messages: user("again") }));
    expect(spent.status).toBe(400);
    expect(spent.error).toMatchObject({ code: "session_limit_exceeded" });
    const rep = gw.closeSession(s.id);
    expect(rep.error).toMatch(/limit of 2 model turns|limit of 12 sampled tokens/);
    expect(rep.requests).toBe(5);
    expect(rep.samples.map((x) => x.status)).toEqual(["completed", "truncated"]);
  });

  it("answers 503 when no engine serves, before or after the stream began", async () => {
    const s = gwNoEngine.openSession({ episodeId: "e", groupIndex: 0 });
    const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const e = await openaiError(ai.chat.completions.create({ model: "m", messages: user("hi") }));
    expect(e.status).toBe(503);
    expect(e.error).toMatchObject({ type: "server_error", code: "engine_unavailable" });
    const stream = await ai.chat.completions.create({ model: "m", messages: user("hi"), stream: true });
    const seen: unknown[] = [];
    const err = await (async () => {
      for await (const c of stream) seen.push(c);
    })().then(
      () => null,
      (x: unknown) => x,
    );
    expect(seen).toHaveLength(1); // the role chunk
    expect(String(err)).toMatch(/no healthy engine/);
    const an = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const ea = await anthropicError(an.messages.create({ model: "m", max_tokens: 5, messages: user("hi") }));
    expect(ea.status).toBe(503);
    expect(ea.error).toMatchObject({ type: "error", error: { type: "overloaded_error" } });
    const rep = gwNoEngine.closeSession(s.id);
    expect(rep.error).toMatch(/no engine could serve/);
    expect(rep.samples).toEqual([]);
  });

  it("does not charge a request no engine served to the session's turns: the agent's retry of a 503 is served", async () => {
    const later = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 200 });
    const g = await Gateway.start({ fleet: later, contextLength: 96, model: "m" });
    try {
      const s = g.openSession({ episodeId: "e", groupIndex: 0, maxTurns: 1 });
      const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
      expect((await openaiError(ai.chat.completions.create({ model: "m", messages: user("hi") }))).status).toBe(503);
      await later.attach(fake.url); // an engine comes back
      fake.script("/generate", { kind: "tokens", ids: ids("ok") });
      const r = await ai.chat.completions.create({ model: "m", messages: user("hi") });
      expect(r.choices[0]!.message.content).toBe("ok");
      const spent = await openaiError(ai.chat.completions.create({ model: "m", messages: user("again") }));
      expect(spent.error).toMatchObject({ code: "session_limit_exceeded" }); // the one turn is the served one
      expect(g.closeSession(s.id).samples).toHaveLength(1);
    } finally {
      await g.close();
      await later.close();
    }
  });

  it("refuses a body over the size limit with 413", async () => {
    const small = await Gateway.start({ fleet, contextLength: 96, maxBodyBytes: 1024, model: "m" });
    try {
      const s = small.openSession({ episodeId: "e", groupIndex: 0 });
      const big = await raw(`${s.openaiBaseUrl}/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${s.apiKey}` },
        body: JSON.stringify({ model: "m", messages: user("x".repeat(5000)) }),
      });
      expect(big.status).toBe(413);
      expect(big.body).toMatchObject({ error: { code: "request_too_large" } });
    } finally {
      await small.close();
    }
  });

  it("re-dispatches to another engine when one dies mid-request, and trains what the survivor sampled", async () => {
    const dying = await startHostileSglang();
    const spare = await startHostileSglang();
    const two = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 10_000, routing: "round_robin" });
    const g = await Gateway.start({ fleet: two, contextLength: 4096, model: "m" });
    try {
      await two.attach(dying.url);
      await two.attach(spare.url);
      // round_robin sends the first request to the first engine attached.
      dying.script("/generate", { kind: "reset" });
      spare.script("/generate", { kind: "tokens", ids: ids("survived") });
      const s = g.openSession({ episodeId: "e", groupIndex: 0 });
      const r = await new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 }).chat.completions.create({ model: "m", messages: user("hi") });
      expect(r.choices[0]!.message.content).toBe("survived");
      expect([dying.count("/generate"), spare.count("/generate")]).toEqual([1, 1]);
      const rep = g.closeSession(s.id);
      expect(rep.samples).toHaveLength(1);
      expect(Array.from(rep.samples[0]!.tokens.subarray(-ids("survived").length))).toEqual(ids("survived"));
    } finally {
      await g.close();
      await two.close();
      await dying.close();
      await spare.close();
    }
  });

  it("aborts the generation of a stream the agent abandons and records its turn once", async () => {
    const s = gw.openSession({ episodeId: "e", groupIndex: 0 });
    fake.script("/generate", { kind: "slow", ms: 500 });
    const abortsBefore = fake.count("/abort_request");
    const ctl = new AbortController();
    const res = await fetch(`${s.openaiBaseUrl}/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${s.apiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: user("hi"), stream: true, max_tokens: 6 }),
      signal: ctl.signal,
    });
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(new TextDecoder().decode(first.value)).toMatch(/"role":"assistant"/);
    ctl.abort();
    await waitUntil(() => fake.count("/abort_request") > abortsBefore, { what: "the fleet to abort the engine request", timeoutMs: 10_000, diagnostics: () => JSON.stringify(gw.sessionStats(s.id)) });
    await waitUntil(() => gw.sessionStats(s.id)?.inFlight === 0, { what: "the generation to end", timeoutMs: 10_000, diagnostics: () => JSON.stringify(gw.sessionStats(s.id)) });
    const rep = gw.closeSession(s.id);
    expect(rep.requests).toBe(1);
    // The fake keeps sampling after /abort_request, so the turn comes back whole: recorded once.
    expect(rep.samples).toHaveLength(1);
    expect(rep.samples[0]!.lossMask.reduce((a, b) => a + b, 0)).toBe(6);
  });

  it("aborts at the engine a token stream the agent abandons mid-answer and records the streamed tokens once", async () => {
    const s = gw.openSession({ episodeId: "e2", groupIndex: 0 });
    const out = ids("a long answer that the agent will not read to the end");
    fake.script("/generate", { kind: "tokens", ids: out, holdAfter: 10 });
    const ctl = new AbortController();
    const stream = await new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 }).chat.completions.create(
      { model: "m", messages: user("talk"), stream: true, max_tokens: 80 },
      { signal: ctl.signal },
    );
    let text = "";
    const reading = (async () => {
      for await (const c of stream) text += c.choices[0]?.delta.content ?? "";
    })().catch((e: unknown) => e);
    await waitUntil(() => text === "a long ans", { what: "the first ten tokens' text", timeoutMs: 10_000, diagnostics: () => JSON.stringify(text) });
    const aborts = fake.seen.filter((x) => x.path === "/abort_request").length;
    ctl.abort();
    await reading;
    // The engine is told to abort this very request (it answers with the tokens so far).
    const rid = (fake.seen.filter((x) => x.path === "/generate").at(-1)!.body as { rid: string }).rid;
    await waitUntil(() => fake.seen.slice(aborts).some((x) => x.path === "/abort_request" && (x.body as { rid?: string }).rid === rid), {
      what: `an /abort_request of ${rid}`,
      timeoutMs: 10_000,
      diagnostics: () => JSON.stringify(fake.seen.slice(aborts).map((x) => [x.path, x.body])),
    });
    await waitUntil(() => gw.sessionStats(s.id)?.inFlight === 0, { what: "the generation to end", timeoutMs: 10_000, diagnostics: () => JSON.stringify(gw.sessionStats(s.id)) });
    expect(fake.release()).toBe(0);
    const rep = gw.closeSession(s.id);
    expect(rep.requests).toBe(1);
    expect(rep.samples).toHaveLength(1);
    const smp = rep.samples[0]!;
    expect(smp.status).toBe("aborted");
    expect(Array.from(smp.tokens.subarray(-smp.responseLength))).toEqual(out.slice(0, 10));
    expect(smp.lossMask.reduce((a, b) => a + b, 0)).toBe(10);
  });
});
