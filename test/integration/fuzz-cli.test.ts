// `ooze fuzz` as a user runs it, on a tiny training topology: schedules drawn from a seed run the job
// (real nats-server, real `ooze serve` engines behind fault proxies, the trainer's worker process)
// and every invariant holds; a violated invariant exits 1 with the minimal schedule and a replay
// command whose report replays; bad flags and a malformed replay file are refused naming the field.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "ooze-fuzz-cli-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const topo = join(dir, "t.yaml");
writeFileSync(
  topo,
  [
    "name: tiny-fuzz",
    "actors: [{ name: trainer, kind: train.trainer }]",
    "engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }",
    "train: { task: addition, taskConfig: { digits: 1 }, preset: tiny, promptsPerStep: 3, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 10 }",
  ].join("\n"),
);

/** Runs `ooze fuzz`; resolves with its exit code and output. */
async function fuzz(args: string[]): Promise<{ code: number; out: string }> {
  try {
    const r = await run(process.execPath, ["bin/ooze.mjs", "fuzz", topo, ...args], { timeout: 240_000 });
    return { code: 0, out: r.stdout + r.stderr };
  } catch (e) {
    const x = e as { code?: number; stdout?: string; stderr?: string };
    return { code: x.code ?? -1, out: `${x.stdout ?? ""}${x.stderr ?? ""}` };
  }
}

describe("ooze fuzz", () => {
  it("runs the job under drawn schedules; every invariant holds and the report is written", async () => {
    const out = join(dir, "ok");
    const r = await fuzz(["--runs", "2", "--seed", "3", "--steps", "2", "--faults", "engine,kill,pause", "--horizon", "2000", "--out", out, "--verbose"]);
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/ooze fuzz: 2 runs, every invariant held/);
    expect(r.out).toMatch(/ok {3}every sample trained or dropped exactly once: 2 batches, 24 samples recorded/);
    expect(r.out.match(/ooze fuzz: run \d+ \(/g)).toHaveLength(2);
    const report = JSON.parse(readFileSync(join(out, "report.json"), "utf8")) as { seed: number; verdicts: { ok: boolean }[] };
    expect(report.seed).toBe(3);
    expect(report.verdicts.every((v) => v.ok)).toBe(true);
  }, 240_000);

  it("a violated invariant exits 1 with the minimal schedule and a replay command that replays it", async () => {
    const out = join(dir, "bad");
    // A 1 ms deadline: every job "hangs", whatever the schedule; the minimal schedule is the empty one.
    const r = await fuzz(["--runs", "1", "--seed", "5", "--steps", "2", "--deadline", "1", "--out", out]);
    expect(r.code, r.out).toBe(1);
    expect(r.out).toMatch(/a violation; minimal schedule after \d+ runs/);
    expect(r.out).toMatch(/FAIL finishes within 1 ms: still running after \d+ ms \(killed\)/);
    expect(r.out).toMatch(/schedule \(0 faults\):/);
    const replay = /replay: ooze fuzz (.*)$/m.exec(r.out)?.[1];
    expect(replay).toContain(`--replay ${join(out, "report.json")}`);
    expect(existsSync(join(out, "report.json"))).toBe(true);
    const again = await fuzz(["--replay", join(out, "report.json"), "--steps", "2", "--out", join(dir, "replayed")]);
    expect(again.code, again.out).toBe(0);
    expect(again.out).toMatch(/ooze fuzz: 1 runs, every invariant held/);
  }, 240_000);

  it("refuses an unknown fault kind and a malformed replay file, naming the field", async () => {
    const bad = await fuzz(["--faults", "kill,boom"]);
    expect(bad.code).toBe(78);
    expect(bad.out).toMatch(/--faults: unknown fault kind\(s\) 'boom'; choose from kill, pause, nats-restart, cut, engine/);
    const file = join(dir, "broken.json");
    writeFileSync(file, JSON.stringify({ schedule: [{ kind: "cut", link: "job-nats", at: 5 }] }));
    const r = await fuzz(["--replay", file, "--out", join(dir, "broken")]);
    expect(r.code).toBe(78);
    expect(r.out).toMatch(/broken\.json: schedule\[0\]\.forMs: /);
  }, 60_000);
});
