// Durable mailboxes on a real nats-server: persisted before handled, acked after the handler,
// crashes redelivered with their effect once, msgID dedup on re-send, malformed entries
// dead-lettered and terminated, messages sent while no consumer runs wait in the stream.
import { afterEach, describe, expect, it } from "vitest";
import { attachBus, createSystem, defineActor, durableRef, serveDurable, type ActorSystem } from "../../src/actor/index.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();
const systems: ActorSystem[] = [];
afterEach(async () => {
  for (const s of systems.splice(0)) await s.stop();
});

type Msg = { n: number; crash?: boolean };

/** Records each message id's effect in a shared map (the "outside world"), once per id. */
function recorder(effects: Map<string, number>, crashes: { left: number }) {
  return defineActor<{ done: Set<string> }, Msg>({
    name: "rec",
    init: () => ({ done: new Set(effects.keys()) }),
    handle: (s, m, ctx) => {
      if (m.crash && crashes.left > 0 && ctx.deliveryCount === 1) {
        crashes.left--;
        throw new Error(`crash on ${m.n}`);
      }
      const id = ctx.messageId!;
      if (!s.done.has(id)) {
        effects.set(id, (effects.get(id) ?? 0) + 1);
        s.done.add(id);
      }
      return s;
    },
  });
}

async function system(job: string): Promise<ActorSystem> {
  const s = createSystem({ name: job, supervision: { backoffMinMs: 1, backoffMaxMs: 10, maxRestarts: 100 }, log: () => {} });
  systems.push(s);
  await attachBus(s, await nats.connect());
  return s;
}

describe("durable mailboxes", () => {
  it("every message has its effect exactly once despite crashes; acked messages leave the work queue", async () => {
    const job = "dur-a";
    const effects = new Map<string, number>();
    const host = await system(job);
    host.spawn(recorder(effects, { left: 5 }));
    const mb = await serveDurable(host, "rec", { ackWaitMs: 10_000, nakDelayMs: () => 10 });
    const sender = await system(job);
    const ref = await durableRef<Msg>(sender, "rec");
    const ids: string[] = [];
    for (let i = 0; i < 40; i++) ids.push((await ref.send({ n: i, crash: i % 7 === 3 })).id);
    await waitUntil(() => effects.size === 40 && mb.stats.acked === 40, {
      what: "40 effects and acks",
      diagnostics: () => JSON.stringify({ effects: effects.size, stats: mb.stats, ps: host.list() }),
    });
    expect([...effects.values()].every((c) => c === 1)).toBe(true);
    expect(new Set(ids)).toEqual(new Set(effects.keys()));
    expect(mb.stats.naked).toBe(5);
    expect(host.list()[0]).toMatchObject({ restarts: 5 });
    const jsm = await (await nats.connect()).jsm();
    await waitUntil(async () => (await jsm.streams.info(jobNames(job).streamMailboxes)).state.messages === 0, { what: "work queue empty" });
  });

  it("a re-send with the same id is stored once (duplicate window)", async () => {
    const job = "dur-b";
    const sender = await system(job);
    const ref = await durableRef<Msg>(sender, "rec");
    const a = await ref.send({ n: 1 }, { id: "fixed-id-1" });
    const b = await ref.send({ n: 1 }, { id: "fixed-id-1" });
    expect(a.duplicate).toBe(false);
    expect(b.duplicate).toBe(true);
    expect(b.seq).toBe(a.seq);
  });

  it("messages sent while no consumer runs are handled when one starts; malformed ones are dead-lettered", async () => {
    const job = "dur-c";
    const sender = await system(job);
    const ref = await durableRef<Msg>(sender, "rec");
    for (let i = 0; i < 10; i++) await ref.send({ n: i });
    const bus = await nats.connect();
    await bus.jsPublish(jobNames(job).mailbox("rec"), new Uint8Array([1, 2, 3]));
    const effects = new Map<string, number>();
    const host = await system(job);
    host.spawn(recorder(effects, { left: 0 }));
    const mb = await serveDurable(host, "rec", { ackWaitMs: 2000 });
    await waitUntil(() => effects.size === 10 && mb.stats.malformed === 1, { what: "10 effects and 1 malformed", diagnostics: () => JSON.stringify(mb.stats) });
    expect(host.list()[0]).toMatchObject({ malformed: 1, crashes: 0 });
  });
});
