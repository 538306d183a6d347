// ooze/testing against real targets: a schedule played for real (SIGSTOP/SIGCONT and SIGKILL of a
// node child process, a nats-server SIGKILLed and restarted under a connected bus, a cut proxy cut
// and healed, an engine fault switched on and off), stop() undoing what is in effect, a missing
// target refused before anything is injected; and each engine fault kind of the proxy in front of a
// real engine server (503, half a body, a reply held back, a delay, a reset socket; rate, schedule
// and seed).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient, engineFaultKind } from "../../src/engine/client.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";
import { createCutProxy, parseFaultSchedule, playFaults, startEngineFaultProxy, useNats, waitUntil, withDeadline } from "../harness/index.ts";

const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-testing-faults-"));
let backend: InferenceBackend;
let engine: EngineServer;
const children: ChildProcess[] = [];

beforeAll(async () => {
  await initModelDir("tiny", join(dir, "m"), 3);
  backend = createNativeBackend({ modelDir: join(dir, "m") });
  engine = await startEngineServer({ backend });
});

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  await engine?.close();
  backend?.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A node process that idles until killed. */
function idleNode(): ChildProcess {
  const c = spawn(process.execPath, ["-e", "setInterval(() => {}, 1 << 30)"], { stdio: "ignore" });
  children.push(c);
  return c;
}

/** The process state letter from /proc (R, S, T = stopped, …), or null when it is gone. */
function procState(pid: number): string | null {
  try {
    return /\) (\w) /.exec(readFileSync(`/proc/${pid}/stat`, "utf8"))?.[1] ?? null;
  } catch {
    return null;
  }
}

const prompt = Int32Array.from([256, 72, 101, 108, 108, 111]);

describe("playFaults", () => {
  it("plays a schedule against real processes, a nats-server, a link and an engine; stop() undoes what is in effect", async () => {
    const a = idleNode();
    const b = idleNode();
    const bus = await nats.connect();
    const link = await createCutProxy(nats.server.port);
    const viaLink = await nats.connect({ url: link.url });
    const proxy = await startEngineFaultProxy(engine.url);
    const oldNatsPid = nats.server.pid;
    const schedule = parseFaultSchedule([
      // in effect until stop(): observed while they last, whatever the machine's speed
      { kind: "pause", target: "a", at: 0, forMs: 600_000 },
      { kind: "cut", link: "bus", at: 0, forMs: 600_000 },
      { kind: "engine", engine: "e0", at: 0, forMs: 600_000, fault: { kind: "http-503" } },
      { kind: "nats-restart", at: 50, downMs: 100 },
      { kind: "kill", target: "b", at: 100 },
    ]);
    const player = playFaults(schedule, {
      processes: { a: () => a.pid ?? null, b: () => (b.exitCode === null && b.signalCode === null ? b.pid! : null) },
      nats: nats.server,
      links: { bus: link },
      engines: { e0: proxy },
    });
    try {
      // In effect: a is stopped, the link is cut, the engine answers 503, b is killed, the nats-server restarted.
      await waitUntil(() => procState(a.pid!) === "T" && link.isCut, { what: "a stopped and the link cut" });
      await waitUntil(() => player.applied().some((x) => x.action === "engine e0: http-503"), { what: "the engine fault on" });
      const err = await new EngineClient(proxy.url, { retries: 0 }).generate({ inputIds: prompt, sampling: { max_new_tokens: 2 } }).catch((e: unknown) => e);
      expect(engineFaultKind(err)).toBe("http-503");
      await waitUntil(() => player.applied().some((x) => x.action === "restart nats-server") && b.signalCode === "SIGKILL", { what: "the nats-server restarted and b killed", timeoutMs: 30_000 });
      const applied = await player.stop();
      expect(applied.filter((x) => !x.ok)).toEqual([]);
      expect(applied.map((x) => x.action).sort()).toEqual(
        ["SIGCONT a", "SIGKILL b", "SIGKILL nats-server", "SIGSTOP a", "cut bus", "engine e0: fault off", "engine e0: http-503", "heal bus", "restart nats-server"].sort(),
      );
      // Undone: a runs again, b is dead, the link carries traffic, the nats-server is back (another pid).
      await waitUntil(() => procState(a.pid!) !== "T", { what: "a continued" });
      await waitUntil(() => b.signalCode === "SIGKILL", { what: "b killed" });
      expect(nats.server.running).toBe(true);
      expect(nats.server.pid).not.toBe(oldNatsPid);
      await waitUntil(() => bus.isConnected() && viaLink.isConnected(), { what: "both buses reconnected", timeoutMs: 20_000 });
      const r = await new EngineClient(proxy.url, { retries: 0 }).generate({ inputIds: prompt, sampling: { max_new_tokens: 2 } });
      expect(r.outputIds.length).toBe(2);
    } finally {
      await player.stop();
      await proxy.close();
      await link.close();
    }
  }, 60_000);

  it("a fault is undone after its duration; a schedule naming a missing target injects nothing", async () => {
    const a = idleNode();
    const short = playFaults(parseFaultSchedule([{ kind: "pause", target: "a", at: 0, forMs: 100 }]), { processes: { a: () => a.pid! } });
    expect((await withDeadline(short.done, 30_000, "the short pause to end")).map((x) => x.action)).toEqual(["SIGSTOP a", "SIGCONT a"]);
    await waitUntil(() => procState(a.pid!) !== "T", { what: "a continued after 100 ms" });
    const player = playFaults(parseFaultSchedule([{ kind: "pause", target: "a", at: 0, forMs: 600_000 }]), { processes: { a: () => a.pid! } });
    await waitUntil(() => procState(a.pid!) === "T", { what: "a stopped" });
    const applied = await player.stop();
    expect(applied.map((x) => x.action)).toEqual(["SIGSTOP a", "SIGCONT a"]);
    await waitUntil(() => procState(a.pid!) !== "T", { what: "a continued by stop()" });
    expect(() => playFaults(parseFaultSchedule([{ kind: "pause", target: "a", at: 0, forMs: 10 }, { kind: "kill", target: "ghost", at: 5 }]), { processes: { a: () => a.pid! } })).toThrow(
      /schedule\[1\]\.target: no process named 'ghost' \(known: a\)/,
    );
    expect(procState(a.pid!)).not.toBe("T");
  });
});

describe("engine fault proxy", () => {
  const gen = (url: string, timeoutMs = 30_000) => new EngineClient(url, { retries: 0 }).generate({ inputIds: prompt, sampling: { max_new_tokens: 3, temperature: 0 }, timeoutMs });

  it("applies each kind to the requests its schedule names, and only on /generate", async () => {
    const ref = await gen(engine.url);
    const cases: [string, (e: unknown) => void][] = [
      ["http-503", (e) => expect(engineFaultKind(e)).toBe("http-503")],
      ["truncated-body", (e) => expect(engineFaultKind(e)).toBe("malformed-reply")],
      ["reset", (e) => expect(engineFaultKind(e)).toBe("connection-lost")],
      ["hang", (e) => expect(engineFaultKind(e)).toBe("timeout")],
    ];
    for (const [kind, expectFault] of cases) {
      const proxy = await startEngineFaultProxy(engine.url, { kind: kind as never, schedule: [1] });
      try {
        expect(Array.from((await gen(proxy.url)).outputIds)).toEqual(Array.from(ref.outputIds)); // request 0 passes
        // hang: the client's own deadline ends the wait (the proxy never answers)
        expectFault(await gen(proxy.url, kind === "hang" ? 500 : 30_000).catch((e: unknown) => e));
        expect(Array.from((await gen(proxy.url)).outputIds)).toEqual(Array.from(ref.outputIds)); // request 2 passes
        expect(await new EngineClient(proxy.url).health()).toBe(true); // other paths are never faulted
        expect(proxy.stats()).toMatchObject({ matching: 3, faulted: { [kind]: 1 } });
      } finally {
        await proxy.close();
      }
    }
  }, 60_000);

  it("records what the engine returned, streamed or not, and the whole reply also when a fault cut it", async () => {
    const record = join(dir, "outputs.jsonl");
    const proxy = await startEngineFaultProxy(engine.url, { kind: "truncated-body", schedule: [2] }, { record });
    try {
      const client = new EngineClient(proxy.url, { retries: 0 });
      const sampling = { max_new_tokens: 6, temperature: 1, sampling_seed: 5 };
      const plain = await client.generate({ inputIds: prompt, sampling });
      let streamed: number[] = [];
      for await (const c of client.generateStream({ inputIds: prompt, sampling: { ...sampling, sampling_seed: 6 } })) streamed = Array.from(c.outputIds);
      // request 2 is cut in half: the client fails, the record holds the whole reply the engine sent
      expect(await client.generate({ inputIds: [...prompt, 1], sampling }).catch((e: unknown) => engineFaultKind(e))).toBe("malformed-reply");
      const lines = readFileSync(record, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { input: number[]; output: number[] });
      expect(lines.map((l) => l.input)).toEqual([Array.from(prompt), Array.from(prompt), [...prompt, 1]]);
      expect(lines[0]!.output).toEqual(Array.from(plain.outputIds));
      expect(lines[1]!.output).toEqual(streamed);
      expect(lines[2]!.output.length).toBeGreaterThan(0);
    } finally {
      await proxy.close();
    }
  });

  it("slow delays and then forwards; a seeded rate faults the same request numbers again", async () => {
    const slow = await startEngineFaultProxy(engine.url, { kind: "slow", delayMs: 300 });
    try {
      const t0 = performance.now();
      expect((await gen(slow.url)).outputIds.length).toBe(3);
      expect(performance.now() - t0).toBeGreaterThanOrEqual(300);
    } finally {
      await slow.close();
    }
    const pattern = async () => {
      const p = await startEngineFaultProxy(engine.url, { kind: "http-503", rate: 0.5, seed: 9 });
      try {
        const out: boolean[] = [];
        for (let i = 0; i < 12; i++) out.push(await gen(p.url).then(() => true, () => false));
        return out;
      } finally {
        await p.close();
      }
    };
    const first = await pattern();
    expect(first).toContain(true);
    expect(first).toContain(false);
    expect(await pattern()).toEqual(first);
  }, 60_000);
});
