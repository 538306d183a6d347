// `ooze train` with rollout hosts marked `start: external`: the job runs its own hosts and waits for
// the others, which join from `ooze node` processes; two rollout instances, each routing over its
// share of the job's two engines, train every sample once. Without a NATS server they can reach
// (the embedded one is private), the job refuses to start, naming the hosts and the fix.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { readJsonl, type BatchRecord } from "../../actors/protocol/metrics.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { loadTopology } from "../../src/topology/load.ts";
import { useNats } from "../harness/index.ts";

const nats = useNats();
const dir = mkdtempSync(join(tmpdir(), "ooze-train-external-"));
const children: ChildProcess[] = [];
afterAll(() => {
  children.forEach((c) => c.kill("SIGKILL"));
  rmSync(dir, { recursive: true, force: true });
});

const STEPS = 3, PROMPTS = 4, N = 4;
const file = join(dir, "t.yaml");
writeFileSync(
  file,
  `name: train-external
hosts: [{ name: main }, { name: r0, start: external }, { name: r1, start: external }]
actors:
  - { name: fleet, kind: fleet, config: { embedded: { count: 2, preset: tiny, maxRunning: 32, cacheTokens: 4096 } } }
  - { name: rollout-a, kind: train.rollout, placement: r0, config: { registryPollMs: 200 } }
  - { name: rollout-b, kind: train.rollout, placement: r1, config: { registryPollMs: 200 } }
train: { mode: async, task: addition, taskConfig: { digits: 1 }, preset: tiny, steps: ${STEPS}, promptsPerStep: ${PROMPTS}, samplesPerPrompt: ${N}, checkpointEvery: 10 }
`,
);

describe("ooze train with external hosts", () => {
  it("refuses to start on its private embedded server, naming the hosts and --nats", async () => {
    const topology = loadTopology(file);
    const { train, engines } = trainConfigOf(topology);
    await expect(runTrainJob({ topology, train, engines, out: join(dir, "refused"), log: () => undefined })).rejects.toThrow(/hosts r0, r1 are started elsewhere.*--nats/);
  });

  it("trains with two rollout nodes joined by ooze node, each over its share of the engines; every sample once", async () => {
    const { server } = nats;
    const url = server.url.replace("nats://", `nats://${server.token}@`);
    let log = "";
    for (const host of ["r0", "r1"]) {
      const c = spawn(process.execPath, ["bin/ooze.mjs", "node", "--nats", url, "--job", "ext", "--topology", file, "--host", host, "--parent-pid", String(process.pid)], { stdio: ["ignore", "pipe", "pipe"] });
      c.stdout!.on("data", (d) => (log += d));
      c.stderr!.on("data", (d) => (log += d));
      children.push(c);
    }
    const topology = loadTopology(file);
    const { train, engines } = trainConfigOf(topology);
    const out = join(dir, "run");
    const lines: string[] = [];
    const summary = await runTrainJob({ topology, train, engines, out, job: "ext", nats: { url: server.url, token: server.token }, log: (l) => lines.push(l) });
    const context = `${lines.slice(-20).join("\n")}\n${log.slice(-4000)}`;
    expect(summary.steps, context).toBe(STEPS);
    expect(lines.join("\n")).toContain("hosts r0, r1 are started elsewhere");
    const seen = readJsonl<BatchRecord>(join(out, "batches.jsonl")).flatMap((b) => [...b.trained, ...b.dropped]).sort((a, b) => a - b);
    expect(seen).toEqual(Array.from({ length: STEPS * PROMPTS * N }, (_, i) => i));
  }, 120_000);
});
