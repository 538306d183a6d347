// The gateway in front of real engines: an engine child process over a tiny native model
// (test/fixtures/engine-process.ts) behind a real Fleet, and `ooze serve` started as a user starts
// it, attached to another fleet as an external engine URL. Driven by the official SDKs, streaming
// (token by token) and not: multi-turn conversations keep the prefix cached (session affinity, history sent as ids),
// the trained tokens are the ones the engine samples (greedy regeneration gives them back), and the
// gateway answers the same tokens over either engine.
import Anthropic from "@anthropic-ai/sdk";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { initModelDir } from "../../native/model-dir.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { BYTE_VOCAB, EOS_ID } from "../../src/engine/tokenizer.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { sampleProblem, type Sample } from "../../src/sample.ts";
import { spawnEngine, type EngineProcess } from "../fixtures/engine-process.ts";
import { waitUntil } from "../harness/index.ts";

let root: string;
let engine: EngineProcess;
let serve: ChildProcess | null = null;
let serveUrl: string;
const fleets: Fleet[] = [];
const gateways: Gateway[] = [];

async function gatewayOver(url: string): Promise<Gateway> {
  const fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 30_000 });
  fleets.push(fleet);
  await fleet.attach(url);
  const gw = await Gateway.start({ fleet, contextLength: 512, defaultMaxTokens: 24, model: "tiny" });
  gateways.push(gw);
  return gw;
}

/** Response ids of a sample where the loss mask is 1. */
const trained = (s: Sample) => Array.from(s.tokens.subarray(s.tokens.length - s.responseLength)).filter((_, i) => s.lossMask[i] === 1);

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "ooze-gateway-engine-"));
  const dir = join(root, "m");
  await initModelDir("tiny", dir, 3);
  engine = await spawnEngine(dir, 0, "1");
  const child = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--model", dir, "--port", "0", "--weight-version", "1"], { stdio: ["ignore", "pipe", "pipe"] });
  serve = child;
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  serveUrl = await waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "ooze serve to print its URL", diagnostics: () => log });
}, 120_000);

afterAll(async () => {
  for (const g of gateways) await g.close();
  for (const f of fleets) await f.close();
  await engine?.kill("SIGKILL");
  if (serve && serve.exitCode === null) {
    const exited = new Promise((r) => serve!.once("exit", r));
    serve.kill("SIGTERM");
    await exited;
  }
  rmSync(root, { recursive: true, force: true });
});

describe("gateway over real engines", () => {
  it("serves a multi-turn OpenAI conversation token-in/token-out with the prefix cached", async () => {
    const gw = await gatewayOver(engine.url);
    const s = gw.openSession({ episodeId: "real-1", groupIndex: 0, temperature: 0 });
    const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const history: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: "user", content: "Add 2 and 3." }];
    const r1 = await ai.chat.completions.create({ model: "tiny", messages: history, max_tokens: 16 });
    const c1 = r1.usage!.completion_tokens;
    expect(c1).toBeGreaterThan(0);
    history.push({ role: "assistant", content: r1.choices[0]!.message.content }, { role: "user", content: "And 4?" });
    const r2 = await ai.chat.completions.create({ model: "tiny", messages: history, max_tokens: 16 });
    // The second prompt starts with the first prompt (and, extending, the sampled ids): the engine had it cached.
    expect(r2.usage!.prompt_tokens_details!.cached_tokens).toBeGreaterThanOrEqual(r1.usage!.prompt_tokens);
    const rep = gw.closeSession(s.id);
    const smp = rep.samples[0]!;
    for (const x of rep.samples) expect(sampleProblem(x)).toBeNull();
    // One segment when the first answer, as the agent got it, renders back as it was sampled; this
    // random model also samples special ids mid-answer (<bos>), which the content leaves out, so the
    // template's rendering of the second request differs there and it opens a second segment.
    const first = trained(smp).slice(0, c1);
    const rendersBack = first.every((id, i) => id < BYTE_VOCAB || (i === c1 - 1 && id === EOS_ID));
    expect(rep.samples).toHaveLength(rendersBack ? 1 : 2);
    expect(rep.samples.reduce((n, x) => n + trained(x).length, 0)).toBe(c1 + r2.usage!.completion_tokens);
    expect(smp.weightVersions.every((w) => w.version === "1")).toBe(true);
    const lps = Array.from(smp.rolloutLogprobs).filter((_, i) => smp.lossMask[i] === 1);
    expect(lps.every((x) => x <= 0) && lps.some((x) => x < 0)).toBe(true);
    // The first turn's trained ids are what the engine samples greedily for the first prompt.
    const prompt1 = smp.tokens.subarray(0, r1.usage!.prompt_tokens);
    const again = await new EngineClient(engine.url).generate({ inputIds: prompt1, sampling: { max_new_tokens: c1, temperature: 0 } });
    expect(Array.from(again.outputIds)).toEqual(trained(smp).slice(0, c1));
  });

  it("streams OpenAI chunks and Anthropic events from the engine", async () => {
    const gw = await gatewayOver(engine.url);
    const s = gw.openSession({ episodeId: "real-2", groupIndex: 0, temperature: 0 });
    const ai = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const plain = await ai.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hello" }], max_tokens: 12 });
    const stream = await ai.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hello" }], max_tokens: 12, stream: true, stream_options: { include_usage: true } });
    let text = "";
    let deltas = 0;
    let usage: OpenAI.CompletionUsage | null | undefined = null;
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? "";
      if (c.choices[0]?.delta.content) deltas++;
      if (c.usage) usage = c.usage;
    }
    // Token by token: several content deltas (each at a whole character), together the non-streamed text.
    expect(deltas).toBeGreaterThan(1);
    expect(text).toBe(plain.choices[0]!.message.content);
    expect(usage!.completion_tokens).toBe(plain.usage!.completion_tokens);
    const an = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
    const events = an.messages.stream({ model: "tiny", max_tokens: 12, messages: [{ role: "user", content: "hello" }] });
    let textDeltas = 0;
    events.on("streamEvent", (e) => void (e.type === "content_block_delta" && e.delta.type === "text_delta" && textDeltas++));
    const msg = await events.finalMessage();
    expect(textDeltas).toBe(deltas);
    expect(msg.content[0]).toEqual({ type: "text", text: plain.choices[0]!.message.content });
    expect(msg.usage.output_tokens).toBe(plain.usage!.completion_tokens);
    const rep = gw.closeSession(s.id);
    // Three fresh conversations of one prompt: three segments (the later ones do not extend a turn).
    expect(rep.samples).toHaveLength(3);
  });

  it("gives the same tokens through `ooze serve` attached as an external engine URL", async () => {
    const viaChild = await gatewayOver(engine.url);
    const viaServe = await gatewayOver(serveUrl);
    const ask = async (gw: Gateway) => {
      const s = gw.openSession({ episodeId: "ext", groupIndex: 0, temperature: 0 });
      const an = new Anthropic({ baseURL: s.anthropicBaseUrl, apiKey: s.apiKey, maxRetries: 0 });
      const messages: Anthropic.MessageParam[] = [{ role: "user", content: "Name a color." }];
      const m1 = await an.messages.create({ model: "tiny", max_tokens: 10, system: "Be short.", messages });
      messages.push({ role: "assistant", content: m1.content }, { role: "user", content: "Another." });
      await an.messages.create({ model: "tiny", max_tokens: 10, system: "Be short.", messages });
      const rep = gw.closeSession(s.id);
      expect(rep.samples).toHaveLength(1);
      return rep.samples[0]!;
    };
    const a = await ask(viaChild);
    const b = await ask(viaServe);
    expect(Array.from(b.tokens)).toEqual(Array.from(a.tokens));
    expect(Array.from(b.lossMask)).toEqual(Array.from(a.lossMask));
  });
});
