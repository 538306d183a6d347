// The trajectory explorer's files: what the trainer writes (actors/trainer/explorer-log.ts) reads back
// in the dashboard (app/dash/explorer.ts) with the sample's ids, loss mask, logprobs (bit for bit)
// and weight-version spans intact; an agent episode's segments come back as one episode with its
// group; retention keeps the newest keepSteps steps; a resumed run's later steps are cut; a
// malformed line is named with its file and line.
import { appendFileSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ExplorerLog, explorerStepFile } from "../../actors/trainer/explorer-log.ts";
import { ExplorerReader } from "../../app/dash/explorer.ts";
import { encodeBytes } from "../../src/engine/tokenizer.ts";
import { SampleBuilder, type Sample } from "../../src/sample.ts";

const root = mkdtempSync(join(tmpdir(), "ooze-explorer-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A sample built the way episodes build them: prompt, model turn under two versions (a partial rollout), an observation, a model turn. */
function sample(index: number, group: number, rolloutId: string, metadata: Record<string, unknown> = {}): Sample {
  const b = new SampleBuilder(index, group, rolloutId, `task ${group}`, encodeBytes("go:", true));
  b.appendModel(encodeBytes("ab"), [-0.1, -2.5], "3");
  b.appendModel(encodeBytes("c"), [Math.fround(-0.123456789)], "4");
  b.appendEnv(encodeBytes(" ok\n"));
  b.appendModel(encodeBytes("d"), [-7], "4");
  return b.build(index % 2, "completed", { turns: 2, ...metadata });
}

describe("explorer files", () => {
  it("round-trips a step's samples: ids, mask, logprobs and spans as trained", async () => {
    const out = join(root, "a");
    const log = new ExplorerLog(out, 5, null, (l) => expect.fail(l));
    const trained = [0, 1].map((i) => ({ ...sample(i, 0, `r${i}`), advantage: i === 0 ? -0.5 : 0.5 }));
    const failed: Sample = { ...sample(2, 0, "r2", { error: "agent exited with code 3" }), status: "failed", reward: null };
    log.write(1, trained, [failed]);
    await log.flush();
    const reader = new ExplorerReader();
    const t = reader.table(out);
    expect(t.error).toBeNull();
    expect(t.tokenizer).toBe("bytes");
    expect(t.rows.map((r) => [r.index, r.trained, r.advantage, r.status, r.partial, r.versions])).toEqual([
      [0, true, -0.5, "completed", true, ["3", "4"]],
      [1, true, 0.5, "completed", true, ["3", "4"]],
      [2, false, null, "failed", true, ["3", "4"]],
    ]);
    expect(t.rows[2]!.error).toBe("agent exited with code 3");
    expect(t.rows[0]!.response).toBe("abc ok\nd");
    const ep = reader.episode(out, 1, 0);
    const [seg] = ep.segments;
    const s = trained[0]!;
    expect(seg!.ids).toEqual(Array.from(s.tokens));
    expect(seg!.lossMask).toEqual(Array.from(s.lossMask));
    expect(seg!.logprobs).toEqual(Array.from(s.rolloutLogprobs)); // float32, bit for bit
    expect(seg!.spans).toEqual(s.weightVersions);
    expect(seg!.pieces.join("")).toBe("<bos>go:abc ok\nd");
    expect(ep.group.map((r) => r.index)).toEqual([0, 1, 2]);
  });

  it("gathers an agent episode's trajectory segments into one episode", async () => {
    const out = join(root, "b");
    const log = new ExplorerLog(out, 5, null, (l) => expect.fail(l));
    const segs = [0, 1].map((k) => ({ ...sample(10 + k, 3, "r10", { segment: k, segments: 2 }), advantage: 1 }));
    log.write(2, [...segs, { ...sample(13, 3, "r13"), advantage: -1 }], []);
    await log.flush();
    const ep = new ExplorerReader().episode(out, 2, 11);
    expect(ep.segments.map((s) => [s.index, s.segment, s.segments])).toEqual([[10, 0, 2], [11, 1, 2]]);
    expect(ep.group.map((r) => r.index)).toEqual([10, 11, 13]);
  });

  it("keeps the newest keepSteps steps, cuts a resumed run's later steps, and names a malformed line", async () => {
    const out = join(root, "c");
    const log = new ExplorerLog(out, 3, null, (l) => expect.fail(l));
    expect(log.takeSeconds()).toEqual({ total: 0, encode: 0 });
    for (let step = 1; step <= 6; step++) log.write(step, [{ ...sample(step, step, `r${step}`), advantage: 0 }], []);
    await log.flush();
    // the writes' time is counted (the trainer's explorer_seconds), then taken
    const took = log.takeSeconds();
    expect(took.total).toBeGreaterThan(0);
    expect(took.encode).toBeGreaterThan(0);
    expect(took.encode).toBeLessThanOrEqual(took.total);
    expect(log.takeSeconds()).toEqual({ total: 0, encode: 0 });
    const dir = join(out, "explorer");
    expect(readdirSync(dir).filter((f) => f.startsWith("step-")).sort()).toEqual(["step-00000004.jsonl", "step-00000005.jsonl", "step-00000006.jsonl"]);
    log.cutAfter(4);
    expect(existsSync(explorerStepFile(dir, 5))).toBe(false);
    appendFileSync(explorerStepFile(dir, 4), "{not json\n");
    const t = new ExplorerReader().table(out);
    expect(t.steps).toEqual([4]);
    expect(t.rows).toHaveLength(1);
    expect(t.error).toMatch(/step-00000004\.jsonl line 2: /);
    expect(() => new ExplorerReader().episode(out, 9, 1)).toThrow(/step 9 is not in/);
    expect(new ExplorerReader().table(join(root, "none")).error).toMatch(/no explorer files/);
  });
});
