// Property: ask/tell between two OS processes under random schedules of connection cuts (each side
// reaches NATS through its own cut proxy): every ask settles with its own reply or a TimeoutError,
// none hangs; after healing, asks get through again. Cases: OOZE_PROPERTY_RUNS (default 5).
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, type ActorRef, type ActorSystem } from "../../src/actor/index.ts";
import { TimeoutError } from "../../src/errors.ts";
import { connectBus, type Bus } from "../../src/transport/bus.ts";
import { createCutProxy, type CutProxy, useNats, waitUntil, withDeadline } from "../harness/index.ts";
import { spawnHost, type HostChild } from "../fixtures/actors/spawn-host.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 5);
const nats = useNats();
const job = "prop-ask";
type EchoMsg = { kind: "echo"; n: number } | { kind: "sleep"; ms: number; n: number };

let hostProxy: CutProxy;
let clientProxy: CutProxy;
let host: HostChild;
let bus: Bus;
let sys: ActorSystem;
let echo: ActorRef<EchoMsg>;

beforeAll(async () => {
  hostProxy = await createCutProxy(nats.server.port);
  clientProxy = await createCutProxy(nats.server.port);
  host = await spawnHost({ url: hostProxy.url, token: nats.server.token, job, echo: true });
  bus = await connectBus({ url: clientProxy.url, token: nats.server.token, reconnectWaitMs: 50 });
  sys = createSystem({ name: job, log: () => {} });
  await attachBus(sys, bus);
  echo = sys.remoteRef<EchoMsg>("echo");
});

afterAll(async () => {
  await sys?.stop();
  await bus?.close();
  await host?.kill();
  await hostProxy?.close();
  await clientProxy?.close();
});

type Step =
  | { op: "ask"; timeoutMs: number; sleepMs: number }
  | { op: "tell" }
  | { op: "cut"; side: "host" | "client" | "both" }
  | { op: "heal" }
  | { op: "pause"; ms: number };

const stepArb: fc.Arbitrary<Step> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ op: fc.constant("ask" as const), timeoutMs: fc.integer({ min: 20, max: 400 }), sleepMs: fc.integer({ min: 0, max: 60 }) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("tell" as const) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("cut" as const), side: fc.constantFrom("host" as const, "client" as const, "both" as const) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("heal" as const) }) },
  { weight: 2, arbitrary: fc.record({ op: fc.constant("pause" as const), ms: fc.integer({ min: 0, max: 150 }) }) },
);

let counter = 0;

describe("ask under connection cuts (property)", () => {
  it("every ask gets its reply or a TimeoutError; none hangs", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(stepArb, { minLength: 3, maxLength: 10 }), async (steps) => {
        const asks: Promise<void>[] = [];
        for (const s of steps) {
          if (s.op === "ask") {
            const n = ++counter;
            const p = echo.ask<{ n: number }>({ kind: "sleep", ms: s.sleepMs, n }, { timeoutMs: s.timeoutMs }).then(
              (r) => expect(r.n).toBe(n),
              (e: unknown) => {
                if (!(e instanceof TimeoutError)) throw new Error(`ask ${n} failed with ${String(e)} instead of a reply or TimeoutError`);
              },
            );
            // "None hangs": the ask must settle by its own deadline plus a generous margin.
            asks.push(withDeadline(p, s.timeoutMs + 3000, `ask ${n} (deadline ${s.timeoutMs} ms) to settle`));
          } else if (s.op === "tell") {
            echo.tell({ kind: "echo", n: ++counter });
          } else if (s.op === "cut") {
            if (s.side !== "client") hostProxy.cut();
            if (s.side !== "host") clientProxy.cut();
          } else if (s.op === "heal") {
            hostProxy.heal();
            clientProxy.heal();
          } else {
            await new Promise((r) => setTimeout(r, s.ms));
          }
        }
        await Promise.all(asks);
        hostProxy.heal();
        clientProxy.heal();
        // Liveness after healing: both sides reconnect and an ask gets through.
        await waitUntil(
          async () => {
            const n = ++counter;
            const r = await echo.ask<{ n: number }>({ kind: "echo", n }, { timeoutMs: 300 });
            return r.n === n;
          },
          { what: "an ask to succeed after healing", timeoutMs: 15_000, diagnostics: () => `host output: ${host.output()}` },
        );
      }),
      { numRuns: RUNS },
    );
  }, 30_000 + RUNS * 8000);
});
