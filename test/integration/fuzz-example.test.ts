// examples/fuzz-buggy-env under `ooze fuzz`, as its README runs it: with the deliberate bug on
// (OOZE_EXAMPLE_BUG=1: a user's quiz task whose rounds close on the wall clock, kept in state shared
// by episodes) the drawn engine faults make episodes fail, `no sample lost to a failed episode`
// breaks, and the run exits 1 with a shrunk schedule of at least one fault and a replay command;
// with the bug off the same seed's first two schedules pass (exit 0), the one that broke it among
// them. Real nats-server, real `ooze serve` engine behind the fault proxy, real job; the seed is one
// whose first schedule slows a third of the engine's replies (2 s each) for over a second from the
// job's start. The example's fuzz.ts, the same check through ooze/testing's API with an invariant
// of the user's own, finds it too.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "ooze-fuzz-example-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const ARGS = ["--seed", "3", "--faults", "engine", "--steps", "4", "--horizon", "2500", "--shrink-runs", "4", "--verbose"];

/** `ooze fuzz examples/fuzz-buggy-env/topology.yaml --runs RUNS …` with the bug on or off: exit code and output. */
async function fuzz(bug: boolean, runs: number, out: string): Promise<{ code: number; out: string }> {
  const env = { ...process.env };
  delete env.OOZE_EXAMPLE_BUG;
  if (bug) env.OOZE_EXAMPLE_BUG = "1";
  try {
    const r = await run(process.execPath, ["bin/ooze.mjs", "fuzz", "examples/fuzz-buggy-env/topology.yaml", "--runs", String(runs), ...ARGS, "--out", out], { env, timeout: 240_000 });
    return { code: 0, out: r.stdout + r.stderr };
  } catch (e) {
    const x = e as { code?: number; stdout?: string; stderr?: string };
    return { code: x.code ?? -1, out: `${x.stdout ?? ""}${x.stderr ?? ""}` };
  }
}

describe("ooze fuzz on examples/fuzz-buggy-env", () => {
  it("finds the deliberate bug: exit 1, a shrunk schedule with a fault, the violated invariant and a replay command", async () => {
    const out = join(dir, "bug");
    const r = await fuzz(true, 5, out);
    expect(r.code, r.out).toBe(1);
    const runs = Number(/ooze fuzz: a violation; minimal schedule after (\d+) runs:/.exec(r.out)?.[1]);
    expect(runs, r.out).toBeLessThanOrEqual(5 + 4); // --shrink-runs 4: at most 4 job runs after the first failure
    expect(r.out.match(/ooze fuzz: run \d+ \(/g)).toHaveLength(runs);
    expect(r.out).toMatch(/FAIL no sample lost to a failed episode: \d+ failed episode\(s\), dropped from training: step \d+/);
    expect(r.out).toMatch(/ok {3}every sample trained or dropped exactly once/); // the old invariants accept a failed episode
    const faults = Number(/schedule \((\d+) faults?\):/.exec(r.out)?.[1]);
    expect(faults, r.out).toBeGreaterThanOrEqual(1); // no fault, no failure: the bug needs one
    expect(r.out).toMatch(/^ {2}- engine engine-0: /m);
    expect(r.out).toContain(`replay: ooze fuzz examples/fuzz-buggy-env/topology.yaml --replay ${join(out, "report.json")}`);
    const report = JSON.parse(readFileSync(join(out, "report.json"), "utf8")) as { seed: number; path: string | null; schedule: unknown[] };
    expect(report.seed).toBe(3);
    expect(report.path).not.toBeNull();
    expect(report.schedule.length).toBe(faults);
  }, 240_000);

  it("without the bug the same seed's schedules pass: exit 0", async () => {
    // two schedules: the first is the one that breaks the buggy task; each run is a whole job
    const r = await fuzz(false, 2, join(dir, "ok"));
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/ooze fuzz: 2 runs, every invariant held/);
    expect(r.out).toMatch(/ok {3}no sample lost to a failed episode: 4 steps, no failed episode/);
    // the first schedule is the one that broke the buggy task, drawn from the same seed
    expect(r.out).toMatch(/ooze fuzz: run 0 \([^)]*\): \[engine engine-0: slow on 30 % at \d+ ms for \d+ ms/);
  }, 240_000);

  it("the same check written with ooze/testing's API (fuzz.ts: runJobSchedule + checkSchedules, an invariant of the user's own) finds the bug", async () => {
    const env = { ...process.env, OOZE_EXAMPLE_BUG: "1" };
    const args = ["--conditions=ooze-source", "--import", "tsx", "examples/fuzz-buggy-env/fuzz.ts", "--runs", "1", "--seed", "3", "--shrink-runs", "0", "--out", join(dir, "api")];
    const r = await run(process.execPath, args, { env, timeout: 240_000 }).then(
      (x) => ({ code: 0, out: x.stdout + x.stderr }),
      (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? -1, out: `${e.stdout ?? ""}${e.stderr ?? ""}` }),
    );
    expect(r.code, r.out).toBe(1);
    expect(r.out).toMatch(/FAIL every step trains 12 samples: short steps: step \d+: \d+/); // the user's invariant
    expect(r.out).toMatch(/FAIL no sample lost to a failed episode/); // and ooze's
    expect(r.out).toMatch(/ok {3}every trained token is one an engine sampled/);
  }, 240_000);
});

