// Unit tests of the restart policy: range checks with field names, error classification from code and
// retryable only, the readable escalation error.
import { describe, expect, it } from "vitest";
import { OozeError } from "../../src/errors.ts";
import { crashError, escalationError, isRestartable, resolvePolicy, RestartTracker } from "../../src/supervisor/policy.ts";

describe("supervision policy", () => {
  it("fills defaults and rejects out-of-range values naming the field", () => {
    expect(resolvePolicy()).toMatchObject({ strategy: "one_for_one", maxRestarts: 5, periodMs: 10_000 });
    expect(() => resolvePolicy({ maxRestarts: -1 })).toThrow(/supervision.maxRestarts = -1/);
    expect(() => resolvePolicy({ backoffMinMs: 10, backoffMaxMs: 5 })).toThrow(/backoffMaxMs/);
    expect(() => resolvePolicy({ jitter: 2 })).toThrow(/jitter/);
  });

  it("classifies errors by code and retryable, never by message", () => {
    const p = resolvePolicy({ escalateCodes: ["CHECKPOINT_INVALID"] });
    expect(isRestartable(p, crashError(new Error("CONFIG_INVALID fatal do not restart"), "a"))).toBe(true);
    expect(isRestartable(p, new OozeError("TRANSPORT", "x", { retryable: true }))).toBe(true);
    expect(isRestartable(p, new OozeError("TRANSPORT", "x", { retryable: false }))).toBe(false);
    expect(isRestartable(p, new OozeError("CHECKPOINT_INVALID", "x", { retryable: true }))).toBe(false);
  });

  it("crashError tags the actor and keeps OozeErrors' code", () => {
    const e = crashError(new TypeError("bad"), "pool/1");
    expect(e).toMatchObject({ code: "ACTOR_CRASHED", retryable: true, actor: "pool/1" });
    expect(e.message).toBe("actor 'pool/1' threw: bad");
    expect(crashError(new OozeError("TIMEOUT", "t", { retryable: true }), "a")).toMatchObject({ code: "TIMEOUT", actor: "a" });
  });

  it("the escalation error names supervisor, actor, crash count and last error", () => {
    let now = 0;
    const p = resolvePolicy({ maxRestarts: 1, periodMs: 100 });
    const t = new RestartTracker(p, { now: () => now, random: () => 0 });
    const last = crashError(new Error("disk full"), "trainer");
    expect(t.onCrash(last).kind).toBe("restart");
    now = 50;
    const d = t.onCrash(last);
    expect(d).toEqual({ kind: "escalate", reason: "intensity", crashes: 2 });
    if (d.kind !== "escalate") return;
    const e = escalationError("job:root", "trainer", d, p, last);
    expect(e.code).toBe("ACTOR_ESCALATED");
    expect(e.message).toContain("supervisor 'job:root' gave up on actor 'trainer'");
    expect(e.message).toContain("crashed 2 times within 100 ms (limit: 1 restarts)");
    expect(e.message).toContain("[ACTOR_CRASHED] actor 'trainer' threw: disk full");
    now = 200; // the window moved on: restarts are allowed again
    expect(t.onCrash(last).kind).toBe("restart");
  });
});
