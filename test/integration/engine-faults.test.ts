// Engine faults through `ooze rollout` as a user runs it (issue 13): real `ooze serve` engines
// (tiny preset) behind the fault-injecting HTTP proxy of ooze/testing, which applies one fault to
// 30 % of /generate requests — a 503 without forwarding, half of the JSON body, a reply that never
// comes on an open connection. With one engine and with two, every one of the 32 samples completes
// with the tokens of a fault-free run (nothing lost, nothing recorded twice), the run ends, and it
// reports the faults it recovered from. A proxy that fails every request ends the run with failed
// samples whose reason names the fault, not a hang.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startEngineFaultProxy, type EngineFaultKind, type EngineFaultProxy } from "../../src/testing/engine-fault-proxy.ts";
import { waitUntil, withDeadline } from "../harness/index.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-engine-faults-"));
const engines: { url: string; child: ChildProcess; log: () => string }[] = [];
/** Tokens of each sample index in a run without faults. */
let reference: Map<number, number[]>;

interface Line {
  index: number;
  tokens: number[];
  status: string;
  metadata: Record<string, unknown>;
}

async function startServe(): Promise<{ url: string; child: ChildProcess; log: () => string }> {
  const child = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--preset", "tiny", "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  child.stdout!.on("data", (d) => (log += d));
  child.stderr!.on("data", (d) => (log += d));
  const url = await waitUntil(() => /at (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1], { timeoutMs: 60_000, what: "the ooze serve URL", diagnostics: () => log });
  return { url, child, log: () => log };
}

/** Runs `ooze rollout` over `urls` as a child process; kills it and fails (with its output) after `limitMs`. */
async function rollout(urls: string[], name: string, extra: string[] = [], limitMs = 240_000): Promise<{ code: number | null; out: string; lines: Line[] }> {
  const file = join(dir, `${name}.jsonl`);
  const child = spawn(
    process.execPath,
    ["bin/ooze.mjs", "rollout", "topologies/guess-number.yaml", "--engines", urls.join(","), "--prompts", "8", "--samples-per-prompt", "4", "--out", file, ...extra],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let out = "";
  child.stdout!.on("data", (d) => (out += d));
  child.stderr!.on("data", (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
  try {
    const code = await withDeadline(exited, limitMs, `ooze rollout (${name}) to finish; output so far:\n${out}`);
    const lines = code === 0 ? readFileSync(file, "utf8").trim().split("\n").map((l) => JSON.parse(l) as Line) : [];
    return { code, out, lines };
  } finally {
    child.kill("SIGKILL");
  }
}

/** Every sample index 0..31 exactly once. */
function expectEveryIndexOnce(lines: Line[]): void {
  expect(lines.map((l) => l.index).sort((a, b) => a - b)).toEqual(Array.from({ length: 32 }, (_, i) => i));
}

beforeAll(async () => {
  engines.push(await startServe(), await startServe());
  const clean = await rollout([engines[0]!.url], "clean");
  expect(clean.code, clean.out).toBe(0);
  expectEveryIndexOnce(clean.lines);
  expect(clean.lines.every((l) => l.status !== "failed"), clean.out).toBe(true);
  reference = new Map(clean.lines.map((l) => [l.index, l.tokens]));
}, 120_000);

afterAll(async () => {
  for (const e of engines) {
    const gone = new Promise((r) => e.child.once("exit", r));
    if (e.child.exitCode === null && e.child.signalCode === null) e.child.kill("SIGTERM");
    await gone;
  }
  rmSync(dir, { recursive: true, force: true });
});

/** What the fleet calls each proxy fault in its report. */
const reported: Partial<Record<EngineFaultKind, string>> = { "http-503": "http-503", "truncated-body": "malformed-reply", hang: "timeout" };

describe("ooze rollout behind a fault-injecting proxy (30 % of /generate)", () => {
  for (const kind of ["http-503", "truncated-body", "hang"] as const) {
    for (const count of [1, 2]) {
      it(`${kind}, ${count} engine(s): all 32 samples complete with the fault-free tokens, and the faults are reported`, async () => {
        const proxies: EngineFaultProxy[] = [];
        try {
          for (let i = 0; i < count; i++) proxies.push(await startEngineFaultProxy(engines[i]!.url, { kind, rate: 0.3, seed: 11 + i }));
          // A hang is found by the fleet's progress deadline; 3 s instead of the default 10 s before the
          // deadline adapts to observed durations (a slow healthy dispatch re-dispatched is allowed below).
          const r = await rollout(proxies.map((p) => p.url), `${kind}-${count}`, kind === "hang" ? ["--progress-timeout", "3000"] : []);
          const injected = proxies.reduce((n, p) => n + (p.stats().faulted[kind] ?? 0), 0);
          expect(r.code, r.out).toBe(0);
          expectEveryIndexOnce(r.lines);
          expect(r.lines.filter((l) => l.status === "failed").map((l) => l.metadata.error), r.out).toEqual([]);
          for (const l of r.lines) expect(l.tokens, `sample ${l.index}`).toEqual(reference.get(l.index));
          expect(injected).toBeGreaterThan(0);
          const m = /engine faults: (\d+) retried, 0 exhausted a request's retries \((.*)\)/.exec(r.out);
          expect(m, r.out).not.toBeNull();
          // Each injected fault failed one dispatch that was retried (a slow engine may add timeouts of its own).
          expect(Number(m![1])).toBeGreaterThanOrEqual(injected);
          expect(m![2]).toContain(`${reported[kind]} ×`);
        } finally {
          for (const p of proxies) await p.close();
        }
      }, 300_000);
    }
  }

  it("a proxy that fails every request: the run ends with failed samples whose reason names the fault", async () => {
    const proxy = await startEngineFaultProxy(engines[0]!.url, { kind: "http-503" });
    try {
      const r = await rollout([proxy.url], "exhausted", ["--retries", "2"]);
      expect(r.code, r.out).toBe(0);
      expectEveryIndexOnce(r.lines);
      for (const l of r.lines) {
        expect(l.status).toBe("failed");
        expect(String(l.metadata.error)).toMatch(/failed 3 dispatches \(http-503 ×3\), retries exhausted.*answered 503/);
        expect(l.metadata.errorCode).toBe("ENGINE_UNAVAILABLE");
      }
      expect(r.out).toMatch(/32 samples \(32 failed\)/);
      expect(r.out).toMatch(/engine faults: 64 retried, 32 exhausted a request's retries \(http-503 ×96\)/);
      expect(proxy.stats().faulted["http-503"]).toBe(96);
    } finally {
      await proxy.close();
    }
  }, 300_000);
});
