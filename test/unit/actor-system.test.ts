// Unit tests of the actor system on nact: tell/ask, replies, ask deadlines, restart keeps the
// mailbox and the ref, one_for_all, escalation to the root with a readable error, ps info, drain.
import { execFile } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { createSystem, defineActor, type ActorSystem, type LifecycleEvent } from "../../src/actor/index.ts";
import { OozeError, TimeoutError } from "../../src/errors.ts";
import { waitUntil } from "../harness/index.ts";

type CounterMsg = { kind: "add"; n: number } | { kind: "get" } | { kind: "boom"; retryable?: boolean } | { kind: "hang" };

const counter = defineActor<{ total: number }, CounterMsg>({
  name: "counter",
  init: () => ({ total: 0 }),
  handle: async (s, m, ctx) => {
    switch (m.kind) {
      case "add":
        return { total: s.total + m.n };
      case "get":
        ctx.reply(s.total);
        return s;
      case "boom":
        if (m.retryable === false) throw new OozeError("CONFIG_INVALID", "bad config", { retryable: false });
        throw new Error("boom");
      case "hang":
        await new Promise(() => {});
        return s;
    }
  },
});

const fast = { backoffMinMs: 1, backoffMaxMs: 5, jitter: 0 };
let sys: ActorSystem | null = null;
afterEach(async () => {
  await sys?.stop();
  sys = null;
});

async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

describe("actor system", () => {
  it("tells and asks in order, replies typed values", async () => {
    sys = createSystem({ name: "t1", log: () => {} });
    const c = sys.spawn(counter);
    for (let i = 1; i <= 10; i++) c.tell({ kind: "add", n: i });
    expect(await c.ask<number>({ kind: "get" })).toBe(55);
    expect(sys.list()).toEqual([expect.objectContaining({ path: "counter", status: "running", processed: 11, mailboxDepth: 0 })]);
  });

  it("ask past its deadline rejects with TimeoutError", async () => {
    sys = createSystem({ name: "t2", log: () => {} });
    const c = sys.spawn(counter);
    const e = await c.ask({ kind: "hang" }, { timeoutMs: 30 }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(TimeoutError);
    expect((e as TimeoutError).code).toBe("TIMEOUT");
  });

  it("restarts a crashed actor with fresh state, keeps ref and queued messages, rejects the failing ask", async () => {
    sys = createSystem({ name: "t3", supervision: fast, log: () => {} });
    const events: LifecycleEvent[] = [];
    sys.onEvent((e) => events.push(e));
    const c = sys.spawn(counter);
    c.tell({ kind: "add", n: 5 });
    const crashed = c.ask({ kind: "boom" }).catch((x: unknown) => x);
    c.tell({ kind: "add", n: 2 });
    const e = await crashed;
    expect((e as OozeError).code).toBe("ACTOR_CRASHED");
    expect(await c.ask<number>({ kind: "get" })).toBe(2);
    const info = sys.list()[0]!;
    expect(info).toMatchObject({ status: "running", restarts: 1, crashes: 1 });
    expect(info.lastError?.code).toBe("ACTOR_CRASHED");
    expect(events.map((x) => x.kind)).toEqual(["started", "crashed", "restarted"]);
  });

  it("one_for_all restarts every sibling", async () => {
    sys = createSystem({ name: "t4", log: () => {} });
    const sup = sys.supervisor({ name: "g", supervision: { ...fast, strategy: "one_for_all" } });
    const a = sup.spawn(counter, { name: "a" });
    const b = sup.spawn(counter, { name: "b" });
    a.tell({ kind: "add", n: 1 });
    b.tell({ kind: "add", n: 7 });
    expect(await b.ask({ kind: "get" })).toBe(7);
    await a.ask({ kind: "boom" }).catch(() => {});
    expect(await b.ask({ kind: "get" })).toBe(0);
    expect(sys.list().map((i) => [i.path, i.restarts])).toEqual([
      ["g/a", 1],
      ["g/b", 1],
    ]);
  });

  it("one_for_one leaves siblings alone", async () => {
    sys = createSystem({ name: "t5", log: () => {} });
    const sup = sys.supervisor({ name: "g", supervision: fast });
    const a = sup.spawn(counter, { name: "a" });
    const b = sup.spawn(counter, { name: "b" });
    b.tell({ kind: "add", n: 7 });
    await a.ask({ kind: "boom" }).catch(() => {});
    expect(await a.ask({ kind: "get" })).toBe(0);
    expect(await b.ask({ kind: "get" })).toBe(7);
  });

  it("escalates to the root after maxRestarts with a readable ACTOR_ESCALATED", async () => {
    sys = createSystem({ name: "t6", supervision: { ...fast, maxRestarts: 2, periodMs: 60_000 }, log: () => {} });
    const c = sys.spawn(counter, { name: "worker" });
    for (let i = 0; i < 3; i++) await c.ask({ kind: "boom" }).catch(() => {});
    const err = await sys.escalation;
    expect(err.code).toBe("ACTOR_ESCALATED");
    expect(err.actor).toBe("worker");
    expect(err.message).toContain("'worker'");
    expect(err.message).toContain("crashed 3 times");
    expect(err.message).toContain("[ACTOR_CRASHED]");
    expect(sys.list()[0]!.status).toBe("escalated");
    const after = await c.ask({ kind: "get" }).catch((x: unknown) => x);
    expect((after as OozeError).code).toBe("ACTOR_STOPPED");
  });

  it("a non-retryable error escalates at once", async () => {
    sys = createSystem({ name: "t7", supervision: fast, log: () => {} });
    const c = sys.spawn(counter);
    await c.ask({ kind: "boom", retryable: false }).catch(() => {});
    const err = await sys.escalation;
    expect(err.message).toContain("[CONFIG_INVALID]");
    expect(sys.list()[0]!.restarts).toBe(0);
  });

  it("a nested supervisor's escalation restarts the subtree under its parent", async () => {
    sys = createSystem({ name: "t8", supervision: { ...fast, maxRestarts: 3 }, log: () => {} });
    const inner = sys.supervisor({ name: "inner", supervision: { ...fast, maxRestarts: 0 } });
    const a = inner.spawn(counter, { name: "a" });
    a.tell({ kind: "add", n: 3 });
    await a.ask({ kind: "boom" }).catch(() => {});
    await until(() => sys!.list()[0]?.status === "running" && sys!.list()[0]!.restarts === 1, "inner/a revived");
    expect(await a.ask({ kind: "get" })).toBe(0);
    expect(sys.failure).toBeNull();
  });

  it("children spawned by an actor stop when it restarts; init failures count as crashes", async () => {
    sys = createSystem({ name: "t9", supervision: fast, log: () => {} });
    let inits = 0;
    const parent = defineActor<null, "boom" | "ping">({
      name: "parent",
      init: (ctx) => {
        inits++;
        if (inits === 2) throw new Error("init failed once");
        ctx.spawn(counter, { name: "kid" });
        return null;
      },
      handle: (s, m, ctx) => {
        if (m === "boom") throw new Error("x");
        ctx.reply("pong");
        return s;
      },
    });
    const p = sys.spawn(parent);
    await until(() => sys!.list().length === 2, "child spawned");
    expect(sys.list().map((i) => i.path).sort()).toEqual(["parent", "parent/kid"]);
    await p.ask("boom").catch(() => {});
    expect(await p.ask("ping")).toBe("pong");
    expect(inits).toBe(3);
    expect(sys.list().find((i) => i.path === "parent")).toMatchObject({ crashes: 2, restarts: 2 });
    expect(sys.list().map((i) => i.path).sort()).toEqual(["parent", "parent/kid"]);
  });

  it("drain handles queued messages then stops; tell after stop is a dead letter", async () => {
    sys = createSystem({ name: "t10", log: () => {} });
    const slow = defineActor<number[], number>({
      name: "slow",
      init: () => [],
      handle: async (s, m) => {
        await new Promise((r) => setImmediate(r));
        return [...s, m];
      },
      onStop: (s) => {
        seen.push(...s);
      },
    });
    const seen: number[] = [];
    const r = sys.spawn(slow);
    for (let i = 0; i < 20; i++) r.tell(i);
    expect(await sys.drain({ timeoutMs: 5000 })).toBe(true);
    expect(seen).toHaveLength(20);
    expect(sys.list()).toEqual([]);
    r.tell(99);
    expect(((await r.ask(1).catch((x: unknown) => x)) as OozeError).code).toBe("ACTOR_STOPPED");
  });
});

describe("drain while an actor restarts", () => {
  it("waits for the restart on the event loop: the restart's timers run and drain returns", async () => {
    // In a child process under a small heap: before the fix, the drain loop raced the restarting
    // actor's whenIdle (resolved at once) and never let a timer run — the restart never finished,
    // and the process ran out of memory in about two seconds (a job under test did so in CI).
    const { stdout, code } = await new Promise<{ stdout: string; code: number | null }>((resolve) => {
      const child = execFile(process.execPath, ["--max-old-space-size=64", "--import", "tsx", "test/fixtures/drain-restarting.ts"], { timeout: 30_000 }, (_e, out) =>
        resolve({ stdout: String(out), code: child.exitCode }),
      );
    });
    expect(stdout.trim()).toBe("drained true after 2 inits");
    expect(code).toBe(0);
  });
});

describe("fault injection and stops during init", () => {
  it("crash(path) crashes a running actor as if its handler threw; its supervisor restarts it", async () => {
    const sys = createSystem({ name: "crash-inject", supervision: { backoffMinMs: 1, backoffMaxMs: 2 }, log: () => {} });
    const events: string[] = [];
    sys.onEvent((e) => events.push(e.kind));
    let inits = 0;
    sys.spawn(defineActor<number, "n">({ name: "a", init: () => ++inits, handle: (s, _m, ctx) => (ctx.reply(s), s) }));
    await waitUntil(() => sys.list()[0]?.status === "running", { what: "a running" });
    expect(sys.crash("a", "test")).toBe(true);
    await waitUntil(() => sys.list()[0]?.status === "running" && sys.list()[0]?.restarts === 1, { what: "a restarted", diagnostics: () => JSON.stringify(sys.list()) });
    expect(await sys.ref<"n">("a").ask("n")).toBe(2);
    expect(events).toContain("crashed");
    expect(() => sys.crash("nobody")).toThrow(/no actor 'nobody'/);
    await sys.stop();
  });

  it("an actor stopped while its init runs gets onStop for the state that init returns (nothing leaks)", async () => {
    const sys = createSystem({ name: "stop-in-init", log: () => {} });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const stopped: string[] = [];
    sys.spawn(defineActor<string, never>({ name: "slow", init: async () => (await gate, "resources"), handle: (s) => s, onStop: (s) => void stopped.push(s) }));
    const done = sys.stop();
    release();
    await done;
    await waitUntil(() => stopped.length > 0, { what: "onStop for the abandoned init" });
    expect(stopped).toEqual(["resources"]);
  });
});

