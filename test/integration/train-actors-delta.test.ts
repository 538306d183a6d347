// `train.weightSync: delta` in the actor topology, run as a user runs it: `ooze up` on a real
// nats-server with the fleet (one embedded `ooze serve` engine), buffer, rollout, trainer and
// weight-sync actors, the tiny preset. Version 0 goes to the engine in full, every later version as
// a delta through the job's object store that the fleet fetches, also after the node is SIGKILLed
// and restarted; the bucket keeps the newest deltas. Bad values of the fields involved are refused
// with errors naming them.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { actorConfig, trainOf } from "../../actors/protocol/context.ts";
import { VersionsKv } from "../../actors/protocol/streams.ts";
import { weightSyncActorConfig } from "../../actors/weight-sync/weight-sync-actor.ts";
import type { ActorContext } from "../../src/actor/index.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { jobNames } from "../../src/transport/names.ts";
import { useNats, withDeadline } from "../harness/index.ts";

const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-train-delta-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const STEPS = 3;

describe("ooze up with train.weightSync: delta", () => {
  it("syncs every trained version to the engine as a delta through the job's object store", async () => {
    const job = "train-delta";
    const names = jobNames(job);
    const file = join(dir, "t.yaml");
    writeFileSync(
      file,
      `name: train-delta
hosts: [{ name: learner }]
actors:
  - { name: fleet, kind: fleet, config: { embedded: { count: 1, preset: tiny, maxRunning: 16, cacheTokens: 4096 } } }
  - { name: rollout, kind: train.rollout, config: { concurrency: 4 } }
  - { name: buffer, kind: train.buffer }
  - { name: trainer, kind: train.trainer, config: { out: run } }
  - { name: weight-sync, kind: train.weight-sync, config: { keepDeltas: 2, dir: weight-sync } }
train: { mode: sync, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${STEPS}, promptsPerStep: 2, samplesPerPrompt: 2, weightSync: delta, weightSyncWire: fp32 }
`,
    );
    const natsUrl = nats.server.url.replace("nats://", `nats://${nats.server.token}@`);
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", job, "--nats", natsUrl, "--quiet"], {
      env: { ...process.env, OOZE_HOME: dir },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const timer = setTimeout(() => up.kill("SIGKILL"), 150_000);
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));
    const diagnostics = () => log.slice(-6000);

    // Once version 1 is recorded, kill the learner node (fleet, trainer, weight-sync): the restarted
    // fleet brings its new engine to version 1 in full, the restarted weight-sync takes version 1's
    // checkpoint as its base, and the next versions go as deltas again.
    const bus = await nats.connect();
    const versions = await VersionsKv.open(bus, names);
    await withDeadline(versions.waitForStep(1), 120_000, "version 1 recorded");
    const pid = Number([...log.matchAll(/\[learner\] running [^\n]* \(pid (\d+)\)/g)].at(-1)?.[1]);
    process.kill(pid, "SIGKILL");
    const code = await exited;
    clearTimeout(timer);
    expect(code, diagnostics()).toBe(0);
    expect(log).toContain("node learner killed by SIGKILL; restarting");

    // Version 0 (the trainer's starting weights; the engine started from the preset) goes in full.
    expect(log).toMatch(/weight-sync: engines serve version 0 \(step 0; full\)/);
    const after = log.slice(log.indexOf("node learner killed by SIGKILL"));
    for (let v = 2; v <= STEPS; v++) expect(after, diagnostics()).toMatch(new RegExp(`weight-sync: engines serve version ${v} \\(step ${v}; delta, delta \\d+ of \\d+ bytes`));

    const kept = (await (await bus.obj(names.objWeights)).list()).map((o) => o.name).sort();
    // keepDeltas 2 and keepFull 2: the newest deltas, and the full checkpoints fallbacks and late
    // engines load (stored with every version; the served one is never pruned).
    expect(kept).toEqual([`delta-v${STEPS - 2}-v${STEPS - 1}`, `delta-v${STEPS - 1}-v${STEPS}`, `full-v${STEPS - 1}`, `full-v${STEPS}`]);
    expect((await versions.get())?.version).toBe(STEPS);
  }, 180_000);

  it("refuses bad values with errors naming the field", () => {
    const topo = (train: Record<string, unknown>) => ({ file: "t.yaml", hosts: [{ name: "a" }], train }) as unknown as Topology;
    expect(() => trainOf(topo({ weightSync: "partial" }))).toThrow(/t\.yaml: train: weightSync: .*"full"\|"delta"/);
    expect(() => trainOf(topo({ weightSync: "delta", weightSyncWire: "fp8" }))).toThrow(/t\.yaml: train: weightSyncWire: .*"fp32"\|"bf16"/);
    const ctx = (config: Record<string, unknown>) => ({ path: "weight-sync", config }) as unknown as ActorContext<unknown>;
    expect(() => actorConfig(weightSyncActorConfig, ctx({ keepDeltas: 0 }))).toThrow(/actor 'weight-sync': config field 'keepDeltas'/);
    expect(() => actorConfig(weightSyncActorConfig, ctx({ dir: "" }))).toThrow(/actor 'weight-sync': config field 'dir'/);
  });
});
