// `ooze fuzz` on every topology shipped in topologies/, one schedule of one small step each (one
// prompt, two samples, a referential game's eight games: `--set` overrides, so a topology sized for
// learning costs seconds): a topology either is fuzzed with every invariant checked and holding
// (engines embedded in a fleet actor are proxied and recorded like `engines:` ones), or is refused
// before anything starts with the reason (no train: section; a train.model that has to be made
// first) — never a false violation.
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { loadTopology } from "../../src/topology/load.ts";

const run = promisify(execFile);
const dir = mkdtempSync(join(tmpdir(), "ooze-fuzz-topologies-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const files = readdirSync("topologies").filter((f) => f.endsWith(".yaml")).sort();

async function fuzz(file: string, extra: string[]): Promise<{ code: number; out: string }> {
  const args = ["bin/ooze.mjs", "fuzz", join("topologies", file), "--runs", "1", "--seed", "11", "--steps", "1", "--set", "train.promptsPerStep=1", "--set", "train.samplesPerPrompt=2", ...extra, "--faults", "engine,pause", "--out", join(dir, file)];
  try {
    const r = await run(process.execPath, args, { timeout: 150_000 });
    return { code: 0, out: r.stdout + r.stderr };
  } catch (e) {
    const x = e as { code?: number; stdout?: string; stderr?: string };
    return { code: x.code ?? -1, out: `${x.stdout ?? ""}${x.stderr ?? ""}` };
  }
}

describe("ooze fuzz on the shipped topologies", () => {
  it("finds them", () => expect(files.length).toBeGreaterThanOrEqual(8));

  for (const file of files) {
    it(`${file}: fuzzed with every invariant held, or refused with the reason`, async () => {
      const topo = loadTopology(join("topologies", file));
      const train = topo.train as { model?: string; taskConfig?: { games?: number } } | undefined;
      // a referential game's episode plays taskConfig.games games (64 in the SDK game's: 18 s of the
      // file's ~40); 8 play each secret once
      const r = await fuzz(file, train?.taskConfig?.games !== undefined ? ["--set", "train.taskConfig.games=8"] : []);
      if (train === undefined) {
        expect(r.code, r.out).toBe(78);
        expect(r.out).toMatch(/no train: section; ooze fuzz runs a topology's training job/);
      } else if (train.model !== undefined && !existsSync(join(resolve(dirname(join("topologies", file)), train.model), "config.json"))) {
        expect(r.code, r.out).toBe(78);
        expect(r.out).toContain(`train.model: ${resolve("topologies", train.model)} is not a model directory`);
      } else {
        expect(r.code, r.out).toBe(0);
        expect(r.out).toMatch(/ooze fuzz: 1 runs, every invariant held/);
        // every engine the job used was recorded: the token invariant is checked, not skipped
        expect(r.out).toMatch(/ok {3}every trained token is one an engine sampled: [1-9]\d* trained samples, \d+ model tokens against [1-9]\d* engine outputs/);
      }
    }, 180_000);
  }
});
