// Property: ask/tell between two OS processes under fault schedules of connection cuts drawn by
// ooze/testing (each side reaches NATS through its own cut proxy, the links `host` and `client`;
// played by playFaults while asks and tells are sent): every ask settles with its own reply or a
// TimeoutError, none hangs; after healing, asks get through again. Runs: propertyRuns(15).
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { attachBus, createSystem, type ActorRef, type ActorSystem } from "../../src/actor/index.ts";
import { TimeoutError } from "../../src/errors.ts";
import { connectBus, type Bus } from "../../src/transport/bus.ts";
import { checkSchedules, createCutProxy, type CutProxy, playFaults, propertyRuns, useNats, waitUntil, withDeadline } from "../harness/index.ts";
import { spawnHost, type HostChild } from "../fixtures/actors/spawn-host.ts";

const RUNS = propertyRuns(15);
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

/** The asks and tells sent while the schedule plays, each after a gap. */
const trafficArb = fc.array(
  fc.oneof(
    { weight: 4, arbitrary: fc.record({ op: fc.constant("ask" as const), timeoutMs: fc.integer({ min: 20, max: 400 }), sleepMs: fc.integer({ min: 0, max: 60 }), gapMs: fc.integer({ min: 0, max: 150 }) }) },
    { weight: 1, arbitrary: fc.record({ op: fc.constant("tell" as const), gapMs: fc.integer({ min: 0, max: 150 }) }) },
  ),
  { minLength: 2, maxLength: 8 },
);

let counter = 0;

describe("ask under connection cuts (property, ooze/testing schedules)", () => {
  it("every ask gets its reply or a TimeoutError; none hangs; asks get through after healing", async () => {
    const result = await checkSchedules(
      // Cuts of the host's link, the client's, or both (two overlapping faults), within 600 ms.
      { kinds: ["cut"], links: ["host", "client"], horizonMs: 600, maxForMs: 400, maxFaults: 4 },
      async (schedule, traffic) => {
        const player = playFaults(schedule, { links: { host: hostProxy, client: clientProxy } });
        const asks: Promise<void>[] = [];
        try {
          for (const s of traffic) {
            await new Promise((r) => setTimeout(r, s.gapMs));
            if (s.op === "tell") {
              echo.tell({ kind: "echo", n: ++counter });
              continue;
            }
            const n = ++counter;
            const p = echo.ask<{ n: number }>({ kind: "sleep", ms: s.sleepMs, n }, { timeoutMs: s.timeoutMs }).then(
              (r) => expect(r.n).toBe(n),
              (e: unknown) => {
                if (!(e instanceof TimeoutError)) throw new Error(`ask ${n} failed with ${String(e)} instead of a reply or TimeoutError`);
              },
            );
            // "None hangs": the ask must settle by its own deadline plus a generous margin.
            asks.push(withDeadline(p, s.timeoutMs + 3000, `ask ${n} (deadline ${s.timeoutMs} ms) to settle`));
          }
          await Promise.all(asks);
        } finally {
          await player.stop(); // heals what is still cut
        }
        // Liveness after healing: both sides reconnect and an ask gets through.
        await waitUntil(
          async () => {
            const n = ++counter;
            const r = await echo.ask<{ n: number }>({ kind: "echo", n }, { timeoutMs: 300 });
            return r.n === n;
          },
          { what: "an ask to succeed after healing", timeoutMs: 15_000, diagnostics: () => `host output: ${host.output()}` },
        );
      },
      { runs: RUNS, with: trafficArb, label: "actor ask/tell across processes under NATS link cuts" },
    );
    expect(result.error, `minimal failing schedule ${JSON.stringify(result.schedule)} with traffic ${JSON.stringify(result.drawn)} (seed ${result.seed}, path ${result.path})`).toBeNull();
  }, 30_000 + RUNS * 8000);
});
