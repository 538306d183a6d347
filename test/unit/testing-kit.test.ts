// ooze/testing's pure parts: fault specs validated with errors naming the field, schedule
// arbitraries that shrink to the minimal failing schedule and replay from seed + path, the ready
// invariants over recorded job output (written here as a trainer would, with deliberate defects),
// and a report that round-trips through a file.
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import {
  checkInvariants,
  checkSchedules,
  createFaultyCommand,
  everyEpisodeOnce,
  everySampleOnce,
  faultArb,
  propertyRuns,
  finishesWithin,
  formatReport,
  noActorLeftCrashed,
  noFailedSamples,
  parseEngineFaultSpec,
  parseFaultSchedule,
  replaySchedule,
  stalenessWithin,
  versionsIncrease,
  writeReport,
  type FaultReport,
  type FaultSpec,
} from "../../src/testing/index.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-testing-kit-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("fault specs", () => {
  it("accepts a schedule as data and sorts it by time", () => {
    const s = parseFaultSchedule({
      faults: [
        { kind: "cut", link: "rollout-nats", at: 900, forMs: 300 },
        { kind: "kill", target: "buffer", at: 100 },
        { kind: "engine", engine: "e0", at: 200, forMs: 1000, fault: { kind: "hang", rate: 0.3, seed: 4 } },
        { kind: "nats-restart", at: 500 },
        { kind: "pause", target: "trainer", at: 50, forMs: 400 },
      ],
    });
    expect(s.map((f) => f.kind)).toEqual(["pause", "kill", "engine", "nats-restart", "cut"]);
    expect(s[1]).toEqual({ kind: "kill", target: "buffer", at: 100, signal: "SIGKILL" });
    expect(s[3]).toEqual({ kind: "nats-restart", at: 500, downMs: 0 });
  });

  it("a malformed spec fails naming the field", () => {
    expect(() => parseFaultSchedule({ faults: [{ kind: "kill", target: "a", at: 0 }, { kind: "pause", target: "b", at: 10, forMs: -5 }] })).toThrow(/schedule\.faults\[1\]\.forMs: /);
    expect(() => parseFaultSchedule([{ kind: "explode", at: 1 }])).toThrow(/schedule\[0\]\.kind: /);
    expect(() => parseFaultSchedule([{ kind: "cut", link: "x", at: 0, forMs: 1, extra: true }])).toThrow(/schedule\[0\]: .*extra/);
    expect(() => parseFaultSchedule([{ kind: "engine", engine: "e", at: 0, forMs: 1, fault: { kind: "boom" } }])).toThrow(/schedule\[0\]\.fault\.kind: /);
    expect(() => parseEngineFaultSpec({ kind: "http-503", rate: 2 }, "fault")).toThrow(/fault\.rate: /);
    expect(() => parseEngineFaultSpec({ kind: "http-503", rate: 0.5, schedule: [1] })).toThrow(/engine fault\.schedule: give either rate or schedule/);
  });
});

describe("schedule arbitraries", () => {
  const space = { processes: ["rollout", "buffer"], links: ["rollout-nats"], engines: ["e0"], nats: true, horizonMs: 5_000, maxFaults: 5 };
  /** A "bug": the job breaks when the buffer is killed at or after 2 s. */
  const property = async (s: FaultSpec[]) => {
    if (s.some((f) => f.kind === "kill" && f.target === "buffer" && f.at >= 2_000)) throw new Error("buffer lost a group");
  };

  it("shrinks a failing schedule to the minimal one, and replays it from seed and path", async () => {
    const r = await checkSchedules(space, property, { runs: 300, seed: 42 });
    expect(r.ok).toBe(false);
    expect(r.schedule).toEqual([{ kind: "kill", target: "buffer", at: 2_000, signal: "SIGKILL" }]);
    expect(r.error).toMatch(/buffer lost a group/);
    expect(r.path).not.toBeNull();
    const again = await checkSchedules(space, property, { seed: r.seed, path: r.path!, runs: 1 });
    expect(again.schedule).toEqual(r.schedule);
  });

  it("passes when no schedule breaks the property, drawing only kinds that have targets", async () => {
    const seen = new Set<string>();
    const r = await checkSchedules({ processes: ["a"], horizonMs: 1_000 }, async (s) => void s.forEach((f) => seen.add(f.kind)), { runs: 50, seed: 1 });
    expect(r).toMatchObject({ ok: true, runs: 50, schedule: null });
    expect([...seen].sort()).toEqual(["kill", "pause"]);
  });
});

/** A run directory as the trainer writes it. */
function job(name: string, batches: object[], metrics: object[], latest?: object) {
  const d = join(dir, name);
  mkdirSync(join(d, "checkpoints"), { recursive: true });
  writeFileSync(join(d, "batches.jsonl"), batches.map((b) => JSON.stringify(b)).join("\n") + "\n");
  writeFileSync(join(d, "metrics.jsonl"), metrics.map((m) => JSON.stringify(m)).join("\n") + "\n");
  if (latest) writeFileSync(join(d, "checkpoints", "latest.json"), JSON.stringify(latest));
  return { dir: d, finished: true, durationMs: 1_000 };
}

describe("invariants over a job's output", () => {
  const m = (step: number, v: number, st = 0) => ({ step, weight_version: v, staleness_max: st });
  const invs = [everySampleOnce, versionsIncrease, stalenessWithin(1), finishesWithin(5_000)];

  it("hold on a sound run (fully_async pending groups counted)", async () => {
    const j = job("good", [{ step: 1, trained: [0, 1, 2], dropped: [3] }, { step: 2, trained: [4, 6], dropped: [], requeued: [5, 7] }], [m(1, 1), m(2, 2, 1)], {
      nextSample: 10,
      pending: [{ firstSample: 8, count: 2 }],
    });
    const vs = await checkInvariants(j, invs);
    expect(vs.filter((v) => !v.ok)).toEqual([]);
    expect(vs[0]!.detail).toMatch(/position 10/);
  });

  it("each names what it saw when violated", async () => {
    const j = { ...job("bad", [{ step: 1, trained: [0, 1, 2], dropped: [] }, { step: 2, trained: [2, 4], dropped: [] }], [m(1, 1), m(2, 1, 3)]), finished: false, durationMs: 9_000 };
    const vs = await checkInvariants(j, invs);
    expect(vs.map((v) => v.ok)).toEqual([false, false, false, false]);
    expect(vs[0]!.detail).toMatch(/recorded twice: 2; lost: 3/);
    expect(vs[1]!.detail).toMatch(/step 2: weight version 1 after 1/);
    expect(vs[2]!.detail).toMatch(/steps 2 \(staleness 3\) beyond 1/);
    expect(vs[3]!.detail).toMatch(/still running after 9000 ms/);
  });

  it("no sample lost to a failed episode: a step's failed count breaks it though every sample is accounted for", async () => {
    const batches = [{ step: 1, trained: [0, 1], dropped: [2, 3] }, { step: 2, trained: [4, 5, 6, 7], dropped: [] }];
    const good = job("no-failed", batches, [{ ...m(1, 1), failed: 0 }, { ...m(2, 2), failed: 0 }]);
    const [ok] = await checkInvariants(good, [noFailedSamples]);
    expect(ok).toMatchObject({ ok: true, detail: "2 steps, no failed episode" });
    const bad = job("failed", batches, [{ ...m(1, 1), failed: 2 }, { ...m(2, 2), failed: 0 }]);
    const [once, lost] = await checkInvariants(bad, [everySampleOnce, noFailedSamples]);
    expect(once!.ok).toBe(true); // dropped failures are accounted for…
    expect(lost).toMatchObject({ ok: false, detail: "2 failed episode(s), dropped from training: step 1: 2" }); // …but lost to training
  });

  it("no actor left crashed: an escalation's error breaks it; a job that did not record one is refused", async () => {
    const j = job("crash", [{ step: 1, trained: [0], dropped: [] }], [m(1, 1)]);
    const [ok] = await checkInvariants({ ...j, error: null }, [noActorLeftCrashed]);
    expect(ok!.ok).toBe(true);
    const [bad] = await checkInvariants({ ...j, error: "actor 'buffer' escalated: restart intensity spent" }, [noActorLeftCrashed]);
    expect(bad).toMatchObject({ ok: false, detail: "actor 'buffer' escalated: restart intensity spent" });
    const [unknown] = await checkInvariants(j, [noActorLeftCrashed]);
    expect(unknown!.ok).toBe(false);
    expect(unknown!.detail).toMatch(/needs JobOutcome\.error/);
  });

  it("a malformed line is reported with its file and line", async () => {
    const j = job("torn", [{ step: 1, trained: [0], dropped: [] }], [m(1, 1)]);
    writeFileSync(join(j.dir, "batches.jsonl"), '{"step":1,"trained":[0],"dropped":[]}\n{"step":2,"trai\n');
    const [v] = await checkInvariants(j, [everySampleOnce]);
    expect(v).toMatchObject({ ok: false });
    expect(v!.detail).toMatch(/batches\.jsonl:2: not a JSON line/);
  });
});

describe("fault kinds added for issue 13", () => {
  it("actor, command, disk-full and a cluster server's restart are data like the others; bad ones name the field", () => {
    const s = parseFaultSchedule([
      { kind: "disk-full", disk: "out", at: 30, forMs: 100 },
      { kind: "actor", target: "buffer", at: 10 },
      { kind: "command", command: "agent", at: 20, forMs: 50, fault: "hang" },
      { kind: "nats-restart", server: "s1", at: 0 },
    ]);
    expect(s.map((f) => f.kind)).toEqual(["nats-restart", "actor", "command", "disk-full"]);
    expect(() => parseFaultSchedule([{ kind: "command", command: "agent", at: 0, forMs: 1, fault: "explode" }])).toThrow(/schedule\[0\]\.fault: /);
    expect(() => parseFaultSchedule({ faults: [{ kind: "actor", at: 0 }] })).toThrow(/schedule\.faults\[0\]\.target: /);
  });

  it("the arbitraries draw them only where a target is named, with the kill signals asked for", () => {
    const drawn = fc.sample(faultArb({ actors: ["rollout"], commands: ["agent"], disks: ["out"], natsServers: ["s0", "s1"], processes: ["job"], signals: ["SIGTERM"], horizonMs: 100 }), { numRuns: 300, seed: 1 });
    expect(new Set(drawn.map((f) => f.kind))).toEqual(new Set(["actor", "command", "disk-full", "nats-restart", "kill", "pause"]));
    for (const f of drawn) {
      if (f.kind === "nats-restart") expect(["s0", "s1"]).toContain(f.server);
      if (f.kind === "kill") expect(f.signal).toBe("SIGTERM");
    }
  });

  it("a faulty command runs the real one until told to crash or hang, and counts the calls", async () => {
    const cmd = createFaultyCommand(dir, "echo-cmd");
    const { command, args } = cmd.wrap("echo", ["hello"]);
    const run = (timeoutMs: number) => new Promise<{ code: number | null; out: string }>((r) => {
      const c = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      c.stdout.on("data", (d) => (out += d));
      const t = setTimeout(() => c.kill("SIGKILL"), timeoutMs);
      c.once("exit", (code) => (clearTimeout(t), r({ code, out })));
    });
    expect(await run(10_000)).toEqual({ code: 0, out: "hello\n" });
    cmd.setFault("crash");
    expect((await run(10_000)).code).toBe(1);
    cmd.setFault("hang");
    expect(await run(300)).toEqual({ code: null, out: "" }); // killed by this test's own timeout
    cmd.setFault(null);
    expect((await run(10_000)).out).toBe("hello\n");
    expect(cmd.stats()).toEqual({ ok: 2, crash: 1, hang: 1 });
  });

  it("everyEpisodeOnce: unused slots of an episode are not lost; a missing first slot, a gap or a duplicate is", async () => {
    const m = (step: number, v: number) => ({ step, weight_version: v, staleness_max: 0 });
    const good = job("episodes", [{ step: 1, trained: [0, 3, 4], dropped: [6] }], [m(1, 1)], { nextSample: 9 });
    expect((await checkInvariants(good, [everyEpisodeOnce(3)]))[0]!.ok).toBe(true);
    expect((await checkInvariants(good, [everySampleOnce]))[0]!.ok).toBe(false);
    const bad = job("episodes-bad", [{ step: 1, trained: [0, 2, 4, 4], dropped: [] }], [m(1, 1)], { nextSample: 9 });
    const [v] = await checkInvariants(bad, [everyEpisodeOnce(3)]);
    expect(v!.detail).toMatch(/recorded twice: 4; lost: 1, 3, 6/);
  });

  it("propertyRuns: OOZE_PROPERTY_RUNS fixes every count, OOZE_PROPERTY_SCALE scales the defaults", () => {
    const env = { runs: process.env.OOZE_PROPERTY_RUNS, scale: process.env.OOZE_PROPERTY_SCALE };
    try {
      delete process.env.OOZE_PROPERTY_RUNS;
      process.env.OOZE_PROPERTY_SCALE = "2.5";
      expect(propertyRuns(4)).toBe(10);
      process.env.OOZE_PROPERTY_RUNS = "7";
      expect(propertyRuns(4)).toBe(7);
    } finally {
      for (const [k, v] of [["OOZE_PROPERTY_RUNS", env.runs], ["OOZE_PROPERTY_SCALE", env.scale]] as const) if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
});

describe("report", () => {
  it("prints verdicts, schedule, replay and log tails, and its schedule replays from the file", () => {
    const schedule = parseFaultSchedule([{ kind: "pause", target: "rollout", at: 1200, forMs: 800 }, { kind: "engine", engine: "e0", at: 10, forMs: 50, fault: { kind: "http-503", rate: 0.3 } }]);
    const r: FaultReport = {
      schedule,
      applied: [{ at: 12, index: 0, action: "engine e0: http-503", ok: true }],
      verdicts: [{ name: "every sample trained or dropped exactly once", ok: false, detail: "lost: 7" }],
      logs: { rollout: "a\nb\nc\n" },
      seed: 7,
      path: "3:1",
      replay: "ooze fuzz t.yaml --replay r.json",
    };
    const text = formatReport(r, { logLines: 2 });
    expect(text).toMatch(/^INVARIANT VIOLATED\n {2}FAIL every sample/);
    expect(text).toContain("engine e0: http-503 on 30 % at 10 ms for 50 ms");
    expect(text).toContain("pause rollout at 1200 ms for 800 ms");
    expect(text).toContain("seed 7, path 3:1");
    expect(text).toMatch(/--- rollout \(last 2 of 3 lines\)\nb\nc$/);
    const file = join(dir, "report.json");
    writeReport(file, r);
    expect(replaySchedule(file)).toEqual(schedule);
    writeFileSync(join(dir, "broken.json"), JSON.stringify({ schedule: [{ kind: "kill", at: "soon" }] }));
    expect(() => replaySchedule(join(dir, "broken.json"))).toThrow(/broken\.json: schedule\[0\]\.target: .*; .*schedule\[0\]\.at: /);
  });
});
