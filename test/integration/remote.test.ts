// Remoting across two OS processes over a real nats-server: tell/ask through NATS, errors as wire
// records, deadlines, malformed frames dead-lettered (never crashing the actor), lifecycle events.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, type ActorRef, type ActorSystem, type LifecycleEvent } from "../../src/actor/index.ts";
import { decode } from "../../src/codec/index.ts";
import { OozeError, TimeoutError } from "../../src/errors.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats, waitUntil } from "../harness/index.ts";
import { spawnHost, type HostChild } from "../fixtures/actors/spawn-host.ts";

const nats = useNats();
const job = "remote-t";
let host: HostChild;
let sys: ActorSystem;
type EchoMsg = { kind: "echo"; n: number } | { kind: "sleep"; ms: number; n: number } | { kind: "crash" } | { kind: "count" };
let echo: ActorRef<EchoMsg>;

beforeAll(async () => {
  host = await spawnHost({ url: nats.server.url, token: nats.server.token, job, echo: true });
  const bus = await nats.connect();
  sys = createSystem({ name: job, log: () => {} });
  await attachBus(sys, bus);
  echo = sys.remoteRef<EchoMsg>("echo");
});

afterAll(async () => {
  await sys?.stop();
  await host?.kill();
});

describe("remote actors", () => {
  it("ask crosses processes and returns the reply; tells arrive in order before a later ask", async () => {
    const r = await echo.ask<{ n: number; pid: number }>({ kind: "echo", n: 7 }, { timeoutMs: 5000 });
    expect(r).toEqual({ n: 7, pid: host.proc.pid });
    const before = await echo.ask<number>({ kind: "count" });
    for (let i = 0; i < 50; i++) echo.tell({ kind: "echo", n: i });
    expect(await echo.ask<number>({ kind: "count" })).toBe(before + 1 + 50);
  });

  it("a crash comes back as the wire error record and the actor keeps serving", async () => {
    const e = (await echo.ask({ kind: "crash" }).catch((x: unknown) => x)) as OozeError;
    expect(e).toBeInstanceOf(OozeError);
    expect(e.code).toBe("ACTOR_CRASHED");
    expect(e.actor).toBe("echo");
    expect(e.retryable).toBe(true);
    expect(await echo.ask({ kind: "echo", n: 1 })).toMatchObject({ n: 1 });
  });

  it("a deadline that passes gives TimeoutError; an unknown actor too", async () => {
    const slow = await echo.ask({ kind: "sleep", ms: 300, n: 1 }, { timeoutMs: 50 }).catch((x: unknown) => x);
    expect(slow).toBeInstanceOf(TimeoutError);
    // Asks to nobody retry until their deadline (long enough that the server's no-responders status
    // answers the first try on a loaded machine); the last try, with little time left, can time out
    // before that status arrives (the CI failure of Dec 2): the error still says nothing answered.
    const asks = [10_000, ...Array.from({ length: 60 }, (_, i) => 3000 + i * 17)];
    const errors = await Promise.all(asks.map((t) => sys.remoteRef("nobody").ask({}, { timeoutMs: t }).catch((x: unknown) => x)));
    for (const e of errors) {
      expect(e).toBeInstanceOf(TimeoutError);
      expect((e as Error).message).toContain("no responder");
    }
  });

  it("malformed frames are dead-lettered and answered, never handled", async () => {
    const names = jobNames(job);
    const bus = await nats.connect();
    const dead: unknown[] = [];
    bus.subscribe(names.deadLetter("echo"), { handler: (m) => void dead.push(decode(m.data)) });
    await bus.flush();
    await bus.publish(names.actor("echo"), new Uint8Array([0xc1, 0xff, 0x00]));
    const bad = (await echo.ask({ kind: "echo", n: "not a number" } as never).catch((x: unknown) => x)) as OozeError;
    expect(bad.code).toBe("MALFORMED_MESSAGE");
    expect(bad.message).toContain("'n'");
    await waitUntil(() => dead.length === 2, { what: "two dead letters", diagnostics: () => JSON.stringify(dead) });
    expect(dead[0]).toMatchObject({ actor: "echo", error: { code: "MALFORMED_MESSAGE" } });
    expect(await echo.ask({ kind: "echo", n: 2 })).toMatchObject({ n: 2 });
  });

  it("lifecycle events of a local actor are published on the job's events subjects", async () => {
    const names = jobNames(job);
    const bus = await nats.connect();
    const seen: LifecycleEvent[] = [];
    bus.subscribe(names.eventsAll, {
      handler: (m) => {
        const env = decode(m.data) as { body: LifecycleEvent };
        if (env.body.system === job && env.body.actor === "local") seen.push(env.body);
      },
    });
    await bus.flush();
    const local = sys.spawn({ name: "local", init: () => 0, handle: () => { throw new Error("x"); } }, { name: "local" });
    local.tell(1);
    await waitUntil(() => seen.some((e) => e.kind === "restarted"), { what: "restarted event", diagnostics: () => JSON.stringify(seen) });
    expect(seen.map((e) => e.kind).slice(0, 3)).toEqual(["started", "crashed", "restarted"]);
    expect(seen[1]!.error).toMatchObject({ code: "ACTOR_CRASHED", actor: "local" });
  });
});
