// Starting actors from topology specs (placement, count, supervision, durable) and the node control
// plane over a real nats-server: ps lists actors with status/restarts/mailbox depth, down drains.
import { describe, expect, it } from "vitest";
import {
  attachBus,
  controlRequest,
  createSystem,
  defineActor,
  durableRef,
  serveControl,
  startActors,
  type CrashReply,
  type DownReply,
  type PsReply,
} from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();

const handled: string[] = [];
const worker = defineActor<{ id: string }, { op: "hello" } | { op: "slow" }>({
  name: "worker",
  init: (ctx) => ({ id: String(ctx.config.tag ?? "none") }),
  handle: async (s, m, ctx) => {
    if (m.op === "slow") await new Promise((r) => setTimeout(r, 5));
    handled.push(ctx.path);
    ctx.reply(`${s.id}:${ctx.path}`);
    return s;
  },
});
const resolve = (kind: string) => {
  if (kind === "test.worker") return worker;
  throw new OozeError("TOPOLOGY_INVALID", `unknown kind '${kind}'`);
};

describe("startActors and control", () => {
  it("starts the specs placed on this host, with counts, config, supervision and durable mailboxes", async () => {
    const job = "ctl-a";
    const sys = createSystem({ name: job, log: () => {} });
    await attachBus(sys, await nats.connect());
    const started = await startActors(
      sys,
      [
        { name: "solo", kind: "test.worker", config: { tag: "x" } },
        { name: "pool", kind: "test.worker", count: 3, supervision: { strategy: "one_for_all" } },
        { name: "inbox", kind: "test.worker", durable: true },
        { name: "elsewhere", kind: "test.worker", placement: "other" },
      ],
      resolve,
      { host: "main", defaultHost: "main" },
    );
    expect(started.map((s) => s.path)).toEqual(["solo", "pool/0", "pool/1", "pool/2", "inbox"]);
    expect(await sys.ref("solo").ask({ op: "hello" })).toBe("x:solo");
    expect(await sys.remoteRef("pool/2").ask({ op: "hello" })).toBe("none:pool/2");
    const d = await durableRef(sys, "inbox");
    await d.send({ op: "hello" });
    await waitUntil(() => handled.includes("inbox"), { what: "durable message handled" });
    await expect(startActors(sys, [{ name: "bad", kind: "nope" }], resolve)).rejects.toThrow(/unknown kind/);
    await sys.stop();
  });

  it("crash crashes one actor through its supervisor, which restarts it (ooze/testing's actor fault)", async () => {
    const job = "ctl-crash";
    const sys = createSystem({ name: job, supervision: { backoffMinMs: 1, backoffMaxMs: 5 }, log: () => {} });
    const conn = await nats.connect();
    await attachBus(sys, conn);
    await startActors(sys, [{ name: "w", kind: "test.worker" }], resolve);
    const events: string[] = [];
    sys.onEvent((e) => events.push(`${e.kind} ${e.actor}`));
    await serveControl(sys, "main"); // resolves once the server has the subscription: another connection's request finds it
    const client = await nats.connect();
    const r = await controlRequest<CrashReply>(client, job, "main", { op: "crash", actor: "w" });
    expect(r).toEqual({ node: "main", actor: "w", crashed: true });
    await waitUntil(() => sys.list()[0]?.status === "running" && sys.list()[0]?.restarts === 1, { what: "w restarted", diagnostics: () => JSON.stringify(sys.list()) });
    expect(events).toEqual(["crashed w", "restarted w"]);
    expect(sys.list()[0]!.lastError).toMatchObject({ code: "ACTOR_CRASHED", retryable: true });
    expect(await sys.ref<{ op: "hello" }>("w").ask({ op: "hello" })).toMatch(/w$/);
    const unknown = await controlRequest(client, job, "main", { op: "crash", actor: "nobody" }).catch((e: unknown) => e);
    expect((unknown as OozeError).code).toBe("ACTOR_NOT_FOUND");
    await sys.stop();
  });

  it("ps lists actors over NATS; down drains the mailboxes and stops the node", async () => {
    const job = "ctl-b";
    const sys = createSystem({ name: job, log: () => {} });
    const conn = await nats.connect();
    await attachBus(sys, conn);
    await startActors(sys, [{ name: "w", kind: "test.worker" }], resolve);
    let downCalled = false;
    await serveControl(sys, "main", { onDown: () => void (downCalled = true) });
    const client = await nats.connect();
    const ps = await controlRequest<PsReply>(client, job, "main", { op: "ps" });
    expect(ps).toMatchObject({ node: "main", system: job, pid: process.pid, failure: null });
    expect(ps.actors).toEqual([expect.objectContaining({ path: "w", status: "running", restarts: 0, mailboxDepth: 0 })]);
    const w = sys.ref<{ op: "slow" }>("w");
    const before = handled.filter((p) => p === "w").length;
    for (let i = 0; i < 20; i++) w.tell({ op: "slow" });
    const down = await controlRequest<DownReply>(client, job, "main", { op: "down", drainMs: 5000 }, 10_000);
    expect(down).toEqual({ node: "main", drained: true });
    expect(handled.filter((p) => p === "w").length - before).toBe(20);
    expect(sys.list()).toEqual([]);
    await waitUntil(() => downCalled, { what: "onDown called" });
    const bad = await controlRequest(client, job, "main", { op: "nope" } as never).catch((e: unknown) => e);
    expect((bad as OozeError).code).toBe("BAD_REQUEST");
  });
});
