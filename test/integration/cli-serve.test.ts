// `ooze model init` and `ooze serve` as a user runs them: a real process, a real HTTP server, SIGTERM.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadNative } from "../../native/load.ts";
import { PRESETS } from "../../native/presets.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { randomAdapter, writePeftAdapter } from "../fixtures/peft-adapter.ts";
import { waitUntil } from "../harness/index.ts";
import { postJson } from "../harness/http.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-cli-serve-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Starts `ooze serve ARGS`; resolves once it prints its URL (killed if it does not within 30 s). */
async function serve(args: string[]): Promise<{ child: ChildProcess; url: string; exited: Promise<number | null> }> {
  const child = spawn(process.execPath, ["bin/ooze.mjs", "serve", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
  try {
    const url = await waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 30_000, what: "server URL", diagnostics: () => log });
    return { child, url, exited };
  } catch (e) {
    child.kill("SIGKILL");
    throw e;
  }
}

describe("ooze model init / serve", () => {
  it("writes a model directory, serves it over the SGLang API, and stops on SIGTERM", async () => {
    const model = join(dir, "m");
    const init = spawnSync(process.execPath, ["bin/ooze.mjs", "model", "init", "--preset", "tiny", "--out", model, "--seed", "3"], { encoding: "utf8" });
    expect(init.status, init.stderr).toBe(0);
    expect(existsSync(join(model, "model.safetensors"))).toBe(true);
    expect(JSON.parse(readFileSync(join(model, "config.json"), "utf8")).architectures).toEqual(["LlamaForCausalLM"]);

    const { child, url, exited } = await serve(["--model", model, "--port", "0", "--weight-version", "7"]);
    try {
      const client = new EngineClient(url);
      expect(await client.weightVersion()).toBe("7");
      const out = await client.generate({ inputIds: [256, 49, 43, 50, 61], sampling: { max_new_tokens: 4, temperature: 0 }, returnLogprob: true });
      expect(out.outputIds.length).toBeGreaterThan(0);
      expect(out.logprobs.length).toBe(out.outputIds.length);
      const again = await client.generate({ inputIds: [256, 49, 43, 50, 61], sampling: { max_new_tokens: 4, temperature: 0 } });
      expect(Array.from(again.outputIds)).toEqual(Array.from(out.outputIds));
      expect(again.meta.cachedTokens).toBeGreaterThan(0);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
  });

  it("exits when the process named by --parent-pid is gone (no orphaned engines)", async () => {
    const parent = spawn("sleep", ["60"]);
    const child = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--preset", "tiny", "--port", "0", "--parent-pid", String(parent.pid)], { stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    child.stdout!.on("data", (d) => (log += d));
    child.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => child.on("exit", (c) => r(c)));
    await waitUntil(() => log.includes("serving"), { timeoutMs: 30_000, what: "server up", diagnostics: () => log });
    parent.kill("SIGKILL");
    expect(await exited).toBe(0);
  });

  it("serves LoRA adapters given with --lora-paths from the start, and refuses one that does not fit naming the flag and file", async () => {
    const adapter = writePeftAdapter(join(dir, "lora"), randomAdapter(loadNative().modelLayout(PRESETS.tiny).tensors, { rank: 2, alpha: 4, seed: 1 }));
    const { child, url, exited } = await serve(["--preset", "tiny", "--port", "0", "--lora-paths", `sql=${adapter}`]);
    try {
      const info = (await (await fetch(`${url}/server_info`)).json()) as { lora_adapters: { name: string; path: string }[] };
      expect(info.lora_adapters.map((a) => [a.name, a.path])).toEqual([["sql", adapter]]);
      const out = await postJson(`${url}/generate`, { input_ids: [1, 2, 3], sampling_params: { max_new_tokens: 2 }, lora_path: "sql" });
      expect(out.status).toBe(200);
    } finally {
      child.kill("SIGTERM");
    }
    expect(await exited).toBe(0);
    const bad = spawnSync(process.execPath, ["bin/ooze.mjs", "serve", "--preset", "tiny", "--port", "0", "--lora-paths", `x=${join(dir, "nope")}`], { encoding: "utf8", timeout: 30_000 });
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/--lora-paths x=.*nope: cannot load LoRA adapter 'x' from .*nope: .*adapter_config\.json: not found/);
  });

  it("refuses ambiguous or missing model arguments clearly", () => {
    const r = spawnSync(process.execPath, ["bin/ooze.mjs", "serve", "--port", "0"], { encoding: "utf8" });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/exactly one of --model DIR or --preset NAME/);
  });
});
