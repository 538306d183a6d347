// Renewals from the heartbeat worker (src/transport/heartbeats.ts `keep`) against a real
// nats-server: a payload kept on a subject is republished while the process's event loop is blocked,
// up to the stall limit and no longer; unkeep stops it before the caller's next write; a keep that
// replaces another goes on after the other's renewal in flight is answered. And the use
// it was made for (actors/rollout/shard.ts): a rollout member stays listed through a stall longer
// than its entry's TTL, and one that leaves is not renewed after.
import { describe, expect, it } from "vitest";
import { RolloutMembers } from "../../actors/rollout/shard.ts";
import type { Bus } from "../../src/transport/bus.ts";
import type { Heartbeats } from "../../src/transport/heartbeats.ts";
import { useNats, waitUntil } from "../harness/index.ts";

const nats = useNats();

/** Blocks this thread's event loop for `ms` (the heartbeat worker's thread goes on). */
function block(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Runs `body` with a connection of its own and that bus's heartbeat worker, connected; closes both. */
async function withBeats(name: string, body: (bus: Bus, beats: Heartbeats) => Promise<void>): Promise<void> {
  const bus = await nats.connect({ name });
  try {
    const beats = bus.heartbeats();
    await beats.ready;
    await body(bus, beats);
  } finally {
    await bus.close();
  }
}

describe("heartbeat worker renewals", () => {
  it("republish while the event loop is blocked, up to the stall limit; unkeep stops them", async () => {
    await withBeats("keep", async (bus, beats) => {
      await bus.ensureStream("KEEPS", ["keep.>"]);
      const errors: string[] = [];
      beats.keep("keep.long", new TextEncoder().encode("l"), 100, 60_000, (m) => errors.push(m));
      beats.keep("keep.short", new TextEncoder().encode("s"), 100, 500, (m) => errors.push(m));
      const start = Date.now();
      block(3_000);
      const end = Date.now();
      await new Promise((r) => setTimeout(r, 600)); // the loop runs again: the short one's renewals resume
      await beats.unkeep("keep.long");
      await beats.unkeep("keep.short");
      const jsm = await bus.jsm();
      const last = (await jsm.streams.info("KEEPS")).state.last_seq;
      const times = { "keep.long": [] as number[], "keep.short": [] as number[] };
      for (let seq = 1; seq <= last; seq++) {
        const m = (await jsm.streams.getMessage("KEEPS", { seq }))!;
        times[m.subject as keyof typeof times].push(m.time.getTime());
      }
      const during = (ts: number[], from: number) => ts.filter((t) => t > from && t < end).length;
      // ~25 renewals in the block's middle second and a half on the long limit's subject…
      expect(during(times["keep.long"], start + 1_000)).toBeGreaterThanOrEqual(3);
      // …none on the short one's once its limit (and the main thread's 250-ms mark) had passed
      expect(during(times["keep.short"], start + 1_000)).toBe(0);
      expect(times["keep.short"].some((t) => t >= end)).toBe(true); // (and it went on once the loop ran again)
      // nothing after unkeep
      await new Promise((r) => setTimeout(r, 400));
      expect((await jsm.streams.info("KEEPS")).state.last_seq).toBe(last);
      expect(errors).toEqual([]);
    });
  }, 60_000);

  it("a keep that replaces one whose renewal is in flight goes on renewing once that one is answered", async () => {
    await withBeats("keep-again", async (bus, beats) => {
      let asked = 0;
      // a responder that answers each renewal after 300 ms, so the first is in flight when the keep is replaced
      const sub = bus.subscribe("slow.keep", { handler: (m) => void (asked++, setTimeout(() => m.respond(new TextEncoder().encode("{}")), 300)) });
      await bus.flush();
      beats.keep("slow.keep", new Uint8Array(1), 50, 60_000);
      await waitUntil(() => asked === 1, { timeoutMs: 5_000, what: "the first renewal" });
      beats.keep("slow.keep", new Uint8Array(2), 50, 60_000);
      await waitUntil(() => asked >= 3, { timeoutMs: 5_000, what: "renewals after the replaced keep's was answered" });
      await beats.unkeep("slow.keep");
      sub.unsubscribe();
    });
  }, 30_000);

  it("report a renewal the server refuses, once", async () => {
    await withBeats("keep-refused", async (_bus, beats) => {
      const errors: string[] = [];
      beats.keep("nowhere.keep", new Uint8Array(1), 100, 60_000, (m) => errors.push(m)); // no stream takes it (KEEPS above takes keep.>): no responders
      await waitUntil(() => errors.length > 0, { timeoutMs: 10_000, what: "a renewal's failure reported" });
      await new Promise((r) => setTimeout(r, 500));
      await beats.unkeep("nowhere.keep");
      expect(errors).toHaveLength(1);
      expect(errors[0]).toMatch(/^renewing nowhere\.keep: no responders/);
    });
  }, 30_000);
});

describe("rollout membership renewed from the heartbeat worker", () => {
  it("a member stays listed through a stall past its entry's TTL; one that left is not renewed after", async () => {
    await withBeats("members", async (bus) => {
      const job = "keep-members";
      const opts = { ttlMs: 1_000, graceMs: 0, missedReads: 1 };
      const m = await RolloutMembers.open(bus, job, "m", opts);
      await m.beat();
      const log: string[] = [];
      m.keep(100, (l) => log.push(l));
      block(3_000); // three TTLs without the event loop
      // a reader that never saw m (no grace) lists it only if its entry is in the bucket
      expect(await (await RolloutMembers.open(bus, job, "fresh", opts)).members()).toEqual(["m"]);
      await m.leave();
      const after = await RolloutMembers.open(bus, job, "after", opts);
      expect(await after.members()).toEqual([]);
      await new Promise((r) => setTimeout(r, 500)); // five renewal periods: none came after the entry said left
      expect(await after.members()).toEqual([]);
      expect(log).toEqual([]);
    });
  }, 60_000);
});
