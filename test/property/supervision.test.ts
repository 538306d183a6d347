// Property: restarts, backoff and escalation follow the declared policy. The RestartTracker runs on
// an injected clock and random source against an independent model of OTP restart intensity; one
// real run checks that a live system's events obey the same model. Cases: OOZE_PROPERTY_RUNS (default 10).
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createSystem, defineActor, type LifecycleEvent } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import { backoffDelay, resolvePolicy, RestartTracker, type SupervisionPolicy } from "../../src/supervisor/policy.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 10);

const policyArb = fc
  .record({
    maxRestarts: fc.integer({ min: 0, max: 6 }),
    periodMs: fc.integer({ min: 1, max: 1000 }),
    backoffMinMs: fc.integer({ min: 0, max: 100 }),
    extra: fc.integer({ min: 0, max: 5000 }),
    backoffFactor: fc.double({ min: 1, max: 4, noNaN: true }),
    jitter: fc.double({ min: 0, max: 1, noNaN: true }),
    strategy: fc.constantFrom("one_for_one" as const, "one_for_all" as const),
  })
  .map(({ extra, ...p }) => resolvePolicy({ ...p, backoffMaxMs: p.backoffMinMs + extra }));

const crashArb = fc.record({
  gapMs: fc.integer({ min: 0, max: 400 }),
  retryable: fc.boolean(),
  u: fc.double({ min: 0, max: 0.999999, noNaN: true }),
});

/** The model: restart timestamps in the window (t - period, t]; escalate when full or not retryable. */
function model(p: SupervisionPolicy, crashes: { t: number; retryable: boolean }[]) {
  const restarts: number[] = [];
  return crashes.map(({ t, retryable }) => {
    const inWindow = restarts.filter((r) => r > t - p.periodMs).length;
    if (!retryable) return { kind: "escalate" as const };
    if (inWindow >= p.maxRestarts) return { kind: "escalate" as const };
    restarts.push(t);
    return { kind: "restart" as const, attempt: inWindow + 1 };
  });
}

describe("supervision policy (property)", () => {
  it("the tracker's decisions equal the model's; delays stay within [min·(1-jitter), max]", () => {
    fc.assert(
      fc.property(policyArb, fc.array(crashArb, { minLength: 1, maxLength: 30 }), (p, schedule) => {
        let now = 1_000_000;
        let u = 0;
        const tracker = new RestartTracker(p, { now: () => now, random: () => u });
        const times: { t: number; retryable: boolean }[] = [];
        let t = now;
        for (const c of schedule) {
          t += c.gapMs;
          times.push({ t, retryable: c.retryable });
        }
        const want = model(p, times);
        schedule.forEach((c, i) => {
          now = times[i]!.t;
          u = c.u;
          const err = new OozeError("ACTOR_CRASHED", "x", { retryable: c.retryable });
          const got = tracker.onCrash(err);
          const w = want[i]!;
          expect(got.kind).toBe(w.kind);
          if (got.kind === "restart" && w.kind === "restart") {
            expect(got.attempt).toBe(w.attempt);
            expect(got.delayMs).toBeCloseTo(backoffDelay(p, w.attempt, c.u), 9);
            expect(got.delayMs).toBeLessThanOrEqual(p.backoffMaxMs + 1e-9);
            const base = Math.min(p.backoffMaxMs, p.backoffMinMs * p.backoffFactor ** (w.attempt - 1));
            expect(got.delayMs).toBeGreaterThanOrEqual(base * (1 - p.jitter) - 1e-9);
          }
        });
        // Intensity: no window of periodMs ever holds more than maxRestarts restarts.
        const rs = times.filter((_, i) => want[i]!.kind === "restart").map((x) => x.t);
        for (const r of rs) expect(rs.filter((x) => x > r - p.periodMs && x <= r).length).toBeLessThanOrEqual(p.maxRestarts);
      }),
      { numRuns: RUNS * 10 },
    );
  });

  it("without jitter the backoff grows by the factor and is capped at max", () => {
    fc.assert(
      fc.property(policyArb, fc.integer({ min: 1, max: 20 }), (p0, n) => {
        const p = { ...p0, jitter: 0 };
        const d = backoffDelay(p, n, 0.5);
        const next = backoffDelay(p, n + 1, 0.5);
        expect(next).toBeGreaterThanOrEqual(d);
        expect(next).toBeLessThanOrEqual(p.backoffMaxMs);
        if (p.backoffMinMs * p.backoffFactor ** n <= p.backoffMaxMs) expect(next).toBeCloseTo(d * p.backoffFactor, 6);
      }),
      { numRuns: RUNS * 10 },
    );
  });

  it("a real system escalates after exactly maxRestarts restarts in the window, with delays as declared", async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 0, max: 4 }), fc.integer({ min: 0, max: 3 }), async (maxRestarts, backoffMinMs) => {
        const sys = createSystem({
          name: "prop-c",
          supervision: { maxRestarts, periodMs: 60_000, backoffMinMs, backoffMaxMs: 10, backoffFactor: 2, jitter: 0.5 },
          log: () => {},
        });
        const events: LifecycleEvent[] = [];
        sys.onEvent((e) => events.push(e));
        const bomb = defineActor<null, "go">({ name: "bomb", init: () => null, handle: () => { throw new Error("always"); } });
        const ref = sys.spawn(bomb);
        for (let i = 0; i <= maxRestarts; i++) await ref.ask("go").catch(() => {});
        const err = await sys.escalation;
        await sys.stop();
        expect(err.code).toBe("ACTOR_ESCALATED");
        expect(err.message).toContain(`crashed ${maxRestarts + 1} times`);
        const crashed = events.filter((e) => e.kind === "crashed");
        expect(crashed).toHaveLength(maxRestarts + 1);
        expect(events.filter((e) => e.kind === "restarted")).toHaveLength(maxRestarts);
        crashed.slice(0, maxRestarts).forEach((e, i) => {
          const base = Math.min(10, backoffMinMs * 2 ** i);
          expect(e.delayMs!).toBeGreaterThanOrEqual(base * 0.5 - 1e-9);
          expect(e.delayMs!).toBeLessThanOrEqual(base);
        });
        expect(crashed[maxRestarts]!.delayMs).toBeNull();
        expect(events.at(-2)!.kind).toBe("escalated");
      }),
      { numRuns: Math.max(3, Math.ceil(RUNS / 2)) },
    );
  });
});
