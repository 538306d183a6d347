// The training loop as actors over JetStream, run as a user runs it: `ooze up` with three real node
// processes (rollout | buffer | fleet + trainer + weight-sync) on a real nats-server, the tiny preset.
// While the rollout holds a prompt group half published, the buffer node is SIGKILLed (restarted, it
// continues after the last batch and gets its unacked samples back), then the learner node (the
// trainer restarts from its checkpoint and trains the later batches again, replayed from BATCHES),
// then the rollout node (its unacked group is redelivered and regenerated with the same sample
// indices): the samples stream stores each sample once and every sample index ends trained or
// dropped exactly once, in one batch record per step. Malformed messages on the streams are
// dead-lettered with an error naming the field.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { groupMsg, promptGroup } from "../../actors/protocol/messages.ts";
import { VersionsKv } from "../../actors/protocol/streams.ts";
import { readJsonl, type BatchRecord, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { decode, type DeadLetter } from "../../src/codec/index.ts";
import { jobNames } from "../../src/transport/names.ts";
import { assertInvariants, everySampleOnce, stalenessWithin, useNats, versionsIncrease, waitUntil } from "../harness/index.ts";

const nats = useNats();
const dirs: string[] = [];
const children: ChildProcess[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "ooze-train-actors-"));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  dirs.forEach((d) => rmSync(d, { recursive: true, force: true }));
});

const PROMPTS = 3, N = 4, STEPS = 4;

/**
 * ooze/testing's invariants over the run (every sample index trained, dropped, requeued or pending
 * exactly once; versions only increase; the staleness bound), plus the exact shape of this run: one
 * batch record per step, every index below STEPS × PROMPTS × N recorded.
 */
async function expectAccounted(out: string, staleness: number, context: () => string, steps = STEPS): Promise<void> {
  await assertInvariants({ dir: out, finished: true, durationMs: 0 }, [everySampleOnce, versionsIncrease, stalenessWithin(staleness)], context());
  const batches = readJsonl<BatchRecord>(join(out, "batches.jsonl"));
  expect(batches.map((b) => b.step)).toEqual(Array.from({ length: steps }, (_, i) => i + 1));
}
/** The pid of the latest process of node `host` in an `ooze up` log. */
const nodePid = (log: string, host: string) => Number([...log.matchAll(new RegExp(`\\[${host}\\] running [^\\n]* \\(pid (\\d+)[,)]`, "g"))].at(-1)?.[1]);

const allIndices = Array.from({ length: STEPS * PROMPTS * N }, (_, i) => i);

function topology(dir: string, out: string, o: { mode?: string; rollouts?: number; rolloutConfig?: string; bufferHost?: string } = {}): string {
  const bufferHost = o.bufferHost ?? "buffer";
  const file = join(dir, "t.yaml");
  writeFileSync(
    file,
    `name: train-actors
hosts: [{ name: rollout }, { name: learner }${bufferHost === "buffer" ? ", { name: buffer }" : ""}]
actors:
  - { name: rollout, kind: train.rollout, count: ${o.rollouts ?? 1}, placement: rollout, config: ${o.rolloutConfig ?? "{}"} }
  - { name: fleet, kind: fleet, placement: learner, config: { embedded: { count: 1, preset: tiny, maxRunning: 32, cacheTokens: 4096 } } }
  - { name: buffer, kind: train.buffer, placement: ${bufferHost}, config: { ackWaitMs: 1500 } }
  - { name: trainer, kind: train.trainer, placement: learner, config: { out: ${JSON.stringify(out)}, ackWaitMs: 2000 } }
  - { name: weight-sync, kind: train.weight-sync, placement: learner, config: { ackWaitMs: 2000 } }
train: { mode: ${o.mode ?? "sync"}, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${STEPS}, promptsPerStep: ${PROMPTS}, samplesPerPrompt: ${N}, checkpointEvery: 2 }
`,
  );
  return file;
}

describe("ooze up: the loop as actors on JetStream", () => {
  it("trains N steps across three node processes; SIGKILLed buffer, learner and rollout nodes lose and duplicate no sample; malformed messages are dead-lettered", async () => {
    const dir = tmp();
    const out = join(dir, "run");
    const job = "train-actors-kill";
    const names = jobNames(job);
    const bus = await nats.connect();
    const letters: DeadLetter[] = [];
    bus.subscribe(names.deadLetterAll, { handler: (m) => void letters.push(decode(m.data) as DeadLetter) });
    await bus.flush();

    const { server } = nats;
    const natsUrl = server.url.replace("nats://", `nats://${server.token}@`);
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", topology(dir, out, { rolloutConfig: "{ concurrency: 4, ackWaitMs: 1500, holdGroup: 4 }" }), "--job", job, "--nats", natsUrl, "--quiet"], {
      env: { ...process.env, OOZE_HOME: dir },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (code) => r(code)));
    const diagnostics = () => log.slice(-6000);

    // Malformed frames on the prompts and samples streams, once the rollout consumes them.
    await waitUntil(() => log.includes("rollout: consuming"), { timeoutMs: 60_000, what: "the rollout consuming prompts", diagnostics });
    await bus.jsPublish(names.trainPrompts, promptGroup.encode({ groupIndex: "seven", firstSample: 0, samples: N, step: 1 } as never));
    await bus.jsPublish(names.trainSamples, new Uint8Array([0xc1, 0x01, 0x02]));
    const bad = { index: 999, groupIndex: 999, rolloutId: "r999", prompt: "x", tokens: new Int32Array([1, 2, 3]), responseLength: 2, lossMask: new Uint8Array(1),
      rolloutLogprobs: new Float32Array(2), reward: 0, status: "completed", weightVersions: [], metadata: {} };
    await bus.jsPublish(names.trainSamples, groupMsg.encode({ groupIndex: 999, firstSample: 999, attempt: 0, samples: [bad], promptTokens: 0, cachedTokens: 0 } as never));
    await waitUntil(() => letters.length >= 3, { timeoutMs: 30_000, what: "three dead letters", diagnostics });
    const errors = letters.map((l) => `${l.actor}: ${l.error.code}: ${l.error.message}`);
    expect(errors.filter((e) => /^buffer: MALFORMED_MESSAGE: message 'train.group' v1 .*lossMask has 1 entries, not 2/.test(e))).toHaveLength(1);
    expect(errors.filter((e) => /^buffer: MALFORMED_MESSAGE: frame /.test(e))).toHaveLength(1);
    expect(errors.filter((e) => /^rollout: MALFORMED_MESSAGE: message 'train.prompt-group' v1 .*field 'body.groupIndex'/.test(e))).toHaveLength(1);

    // While the rollout holds group 4 unpublished (step 2), kill the buffer: its round's groups are
    // unacked, so the restarted buffer gets them back and continues after batch 1. Then kill the
    // rollout node: group 4 is redelivered and generated again with the same sample indices.
    await waitUntil(() => log.includes("holding group 4"), { timeoutMs: 60_000, what: "the rollout holding group 4", diagnostics });
    const pidOf = (host: string) => nodePid(log, host);
    process.kill(pidOf("buffer"), "SIGKILL");
    await waitUntil(() => log.includes("buffer: continuing after batch 1"), { timeoutMs: 60_000, what: "the restarted buffer", diagnostics });
    // Kill the learner (fleet, trainer, weight-sync) after step 1, before any checkpoint: the restarted
    // trainer starts again at version 0 and trains batch 1 again, replayed from BATCHES.
    process.kill(pidOf("learner"), "SIGKILL");
    await waitUntil(() => log.match(/trainer: step 1\/4/g)?.length === 2, { timeoutMs: 60_000, what: "the restarted trainer to train batch 1 again", diagnostics });
    process.kill(pidOf("rollout"), "SIGKILL");

    // The trainer stops the job after the last step; `ooze up` exits 0.
    expect(await exited, diagnostics()).toBe(0);
    expect(log).toContain("node buffer killed by SIGKILL; restarting");
    expect(log).toContain("node learner killed by SIGKILL; restarting");
    expect(log).toContain(`trainer: resuming job ${job} at step 0`);
    expect(log).toContain("node rollout killed by SIGKILL; restarting");

    await expectAccounted(out, 0, diagnostics);
    expect(readJsonl<BatchRecord>(join(out, "batches.jsonl")).flatMap((b) => [...b.trained, ...b.dropped]).sort((a, b) => a - b)).toEqual(allIndices);
    const metrics = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(metrics.map((m) => m.weight_version)).toEqual([1, 2, 3, 4]);
    expect(metrics.every((m) => typeof m.reward_mean === "number")).toBe(true);
    expect(readFileSync(join(out, "reward.svg"), "utf8")).toMatch(/^<svg/);
    expect(JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8"))).toMatchObject({ step: 4, weightVersion: 4 });

    // The samples stream stored each group once (one message with its samples) and the two malformed
    // frames; all acked and gone now.
    const info = await (await bus.jsm()).streams.info(names.streamSamples);
    expect(info.state.last_seq).toBe(STEPS * PROMPTS + 2);
    expect(info.state.messages).toBe(0);
    const versions = await (await VersionsKv.open(bus, names)).get();
    expect(versions).toMatchObject({ version: 4, step: 4 });
  }, 120_000);

  it("async mode, two processes, two rollout instances on one prompts work queue, nats-server restarted mid-run: every sample once, at most one version stale", async () => {
    const dir = tmp();
    const out = join(dir, "run");
    const { server } = nats;
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", topology(dir, out, { mode: "async", rollouts: 2, bufferHost: "learner", rolloutConfig: "{ ackWaitMs: 1500 }" }), "--job", "train-actors-async", "--nats", server.url.replace("nats://", `nats://${server.token}@`), "--quiet"], {
      env: { ...process.env, OOZE_HOME: dir },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));
    // The nats-server restarts (same port and store) in the middle of the run.
    await waitUntil(() => log.includes("trainer: step 1/4"), { timeoutMs: 60_000, what: "step 1", diagnostics: () => log.slice(-6000) });
    await server.restart();
    const code = await exited;
    expect(code, log.slice(-6000)).toBe(0);
    expect(log).toContain("running rollout/0, rollout/1");
    await expectAccounted(out, 1, () => log.slice(-6000));
    expect(readJsonl<BatchRecord>(join(out, "batches.jsonl")).flatMap((b) => [...b.trained, ...b.dropped]).sort((a, b) => a - b)).toEqual(allIndices);
    const metrics = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(metrics.map((m) => m.weight_version)).toEqual([1, 2, 3, 4]);
  }, 120_000);

  it("fully_async, three processes: SIGKILLed buffer, rollout and learner nodes and a nats-server restart lose and duplicate no sample; staleness bounded", async () => {
    const dir = tmp();
    const out = join(dir, "run");
    const file = topology(dir, out, { mode: "fully_async", rolloutConfig: "{ ackWaitMs: 1500 }" });
    writeFileSync(file, readFileSync(file, "utf8").replace("steps: 4,", "steps: 8,"));
    const { server } = nats;
    const up = spawn(process.execPath, ["bin/ooze.mjs", "up", file, "--job", "train-actors-fully-async", "--nats", server.url.replace("nats://", `nats://${server.token}@`), "--quiet"], {
      env: { ...process.env, OOZE_HOME: dir },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(up);
    let log = "";
    up.stdout!.on("data", (d) => (log += d));
    up.stderr!.on("data", (d) => (log += d));
    const exited = new Promise<number | null>((r) => up.on("exit", (c) => r(c)));
    const diagnostics = () => log.slice(-6000);
    const pidOf = (host: string) => nodePid(log, host);
    const afterStep = (n: number) => waitUntil(() => new RegExp(`trainer: step ${n}/8`).test(log), { timeoutMs: 60_000, what: `step ${n}`, diagnostics });
    await afterStep(1);
    process.kill(pidOf("buffer"), "SIGKILL");
    await afterStep(3);
    process.kill(pidOf("rollout"), "SIGKILL");
    await afterStep(4);
    process.kill(pidOf("learner"), "SIGKILL");
    await waitUntil(() => (log.match(/trainer: step 5\/8/g)?.length ?? 0) >= 1, { timeoutMs: 60_000, what: "step 5 after the learner restart", diagnostics });
    await server.restart();
    expect(await exited, diagnostics()).toBe(0);
    expect(log).toContain("node buffer killed by SIGKILL; restarting");
    expect(log).toContain("node rollout killed by SIGKILL; restarting");
    expect(log).toContain("node learner killed by SIGKILL; restarting");

    // Every sample index below the data position: trained, dropped, requeued or pending at the end, once.
    await expectAccounted(out, 2, diagnostics, 8);
    const metrics = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    expect(metrics.map((m) => m.weight_version)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  }, 180_000);

  it("the versions record only moves forward", async () => {
    const bus = await nats.connect();
    const kv = await VersionsKv.open(bus, jobNames("versions-cas"));
    expect(await kv.get()).toBeNull();
    await kv.advance({ version: 2, modelDir: "/w/v2", step: 2, at: 1 });
    await kv.advance({ version: 2, modelDir: "/w/v2", step: 1, at: 2 }); // an older step: ignored
    expect(await kv.get()).toMatchObject({ version: 2, step: 2 });
    await expect(kv.advance({ version: 1, modelDir: "/w/v1", step: 3, at: 3 })).rejects.toThrow(/versions only increase/);
    const waited = kv.waitForStep(3);
    await kv.advance({ version: 3, modelDir: "/w/v3", step: 3, at: 4 });
    expect(await waited).toMatchObject({ version: 3, step: 3 });
  });
});
