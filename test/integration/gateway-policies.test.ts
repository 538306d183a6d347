// Several policies through the gateway: an unchanged program on the official OpenAI SDK plays two
// roles by naming them in `model`, and each role's turns are sampled with its own LoRA adapter (a real
// `ooze serve` holding both) and recorded as segments of that policy, never mixed into the other's —
// even when a request's history extends the other role's conversation. An unknown model is refused
// with OpenAI's model_not_found.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { initModelDir } from "../../native/model-dir.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { Gateway } from "../../src/gateway/index.ts";
import type { Sample } from "../../src/sample.ts";
import { randomAdapter, writePeftAdapter } from "../fixtures/peft-adapter.ts";
import { waitUntil } from "../harness/index.ts";

let root: string;
let serve: ChildProcess;
let fleet: Fleet;
let gw: Gateway;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "ooze-gateway-policies-"));
  const dir = join(root, "m");
  await initModelDir("tiny", dir, 3);
  const layout = loadNative().loadModelDir(dir).tensors;
  // two adapters that move the model well away from the base and from each other
  const a = writePeftAdapter(join(root, "describer"), randomAdapter(layout, { rank: 4, alpha: 8, seed: 1, scale: 0.5 }));
  const b = writePeftAdapter(join(root, "guesser"), randomAdapter(layout, { rank: 4, alpha: 8, seed: 2, scale: 0.5 }));
  serve = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--model", dir, "--port", "0", "--lora-paths", `describer=${a}`, `guesser=${b}`], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  serve.stdout!.on("data", (d) => (log += d));
  serve.stderr!.on("data", (d) => (log += d));
  const url = await waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "ooze serve to print its URL", diagnostics: () => log });
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 30_000 });
  await fleet.attach(url);
  gw = await Gateway.start({ fleet, contextLength: 512, defaultMaxTokens: 12, policies: { describer: { lora: "describer" }, guesser: { lora: "guesser" } } });
}, 120_000);

afterAll(async () => {
  await gw?.close();
  await fleet?.close();
  if (serve && serve.exitCode === null) {
    const exited = new Promise((r) => serve.once("exit", r));
    serve.kill("SIGTERM");
    await exited;
  }
  rmSync(root, { recursive: true, force: true });
});

const sampled = (s: Sample) => Array.from(s.tokens.subarray(s.tokens.length - s.responseLength)).filter((_, i) => s.lossMask[i] === 1);

describe("the gateway with several policies", () => {
  it("samples each role's turns with its adapter and records them as that policy's segments", async () => {
    const s = gw.openSession({ episodeId: "ep-1", groupIndex: 0, temperature: 0, samplingSeed: 1 });
    const client = new OpenAI({ baseURL: s.openaiBaseUrl, apiKey: s.apiKey });
    const ask = (model: string, messages: OpenAI.ChatCompletionMessageParam[]) => client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
    const d = await ask("describer", [{ role: "user", content: "secret: C" }]);
    const said = d.choices[0]!.message.content ?? "";
    // the guesser's history extends the describer's conversation, yet it is the guesser's own segment
    const g = await ask("guesser", [{ role: "user", content: "secret: C" }, { role: "assistant", content: said }, { role: "user", content: "which?" }]);
    const again = await ask("describer", [{ role: "user", content: "secret: C" }]);
    expect(again.choices[0]!.message.content).toBe(said); // greedy: the same adapter gives the same turn
    await expect(ask("narrator", [{ role: "user", content: "hi" }])).rejects.toMatchObject({ status: 404, code: "model_not_found" });
    const report = gw.closeSession(s.id);
    expect(report.samples.map((x) => x.policy)).toEqual(["describer", "guesser", "describer"]);
    // greedy turns of different adapters differ from each other on the same prompt
    const guess = await (async () => {
      const s2 = gw.openSession({ episodeId: "ep-2", groupIndex: 0, temperature: 0, samplingSeed: 1 });
      const c2 = new OpenAI({ baseURL: s2.openaiBaseUrl, apiKey: s2.apiKey });
      await c2.chat.completions.create({ model: "guesser", messages: [{ role: "user", content: "secret: C" }], max_tokens: 8, temperature: 0 });
      return gw.closeSession(s2.id).samples[0]!;
    })();
    expect(sampled(guess)).not.toEqual(sampled(report.samples[0]!));
    expect(g.choices[0]!.message).toBeDefined();
  });
});
