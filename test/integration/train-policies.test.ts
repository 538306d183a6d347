// Two policies in one job, end to end (`ooze train`'s job on a real nats-server and embedded engine):
// the referential game's describer is a full model of its own (starting from the base) and its
// guesser a LoRA adapter over the base — one of each kind, so both paths run. Each episode yields one
// sample per role, the guesser's context holds the describer's sampled ids verbatim and never the
// secret, each version directory holds both policies, and every sample's tokens were generated with
// its own role's weights of the version that made them: the rollout logprobs equal the trainer's
// under those weights, and not under the other role's or the base's. On both trainer workers (a
// worker per policy: two PyTorch processes on torch). An engine SIGKILLed mid-job
// comes back serving each policy's current version (nothing lost; later samples on-policy).
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { enginesSchema, trainSchema } from "../../actors/protocol/config.ts";
import { batchRegistry } from "../../actors/protocol/messages.ts";
import { readJsonl, type StepMetrics } from "../../actors/protocol/metrics.ts";
import { POLICY_FILE } from "../../actors/protocol/policies.ts";
import { scanStream } from "../../actors/protocol/streams.ts";
import { runTrainJob } from "../../app/job/train-job.ts";
import { encodeBytes } from "../../src/engine/tokenizer.ts";
import { jobNames } from "../../src/transport/names.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { rolloutLogprobGap, useNats } from "../harness/index.ts";

const nats = useNats();
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

const STEPS = 3;

/** The pids of the embedded engines (`ooze serve … --parent-pid PARENT`) process `parent` runs. */
function enginePidsOf(parent: number): number[] {
  const r = spawnSync("pgrep", ["-f", `serve .*--parent-pid ${parent}( |$)`], { encoding: "utf8" });
  if (r.error) throw r.error;
  if (r.status !== 0 && r.status !== 1) throw new Error(`pgrep exited with ${r.status}: ${r.stderr}`); // 1: none matches
  return r.stdout.trim().split("\n").filter(Boolean).map(Number);
}

/**
 * The pid of the one embedded engine process `parent` started since `before` was taken (other test
 * files share this vitest process, isolate: false: a job of theirs that outlived its test may still
 * have an engine).
 */
function enginePidOf(parent: number, before: ReadonlySet<number>): number {
  const pids = enginePidsOf(parent).filter((p) => !before.has(p));
  if (pids.length !== 1) throw new Error(`expected one engine of process ${parent}, found ${pids.length}`);
  return pids[0]!;
}
const lora = { lora: { rank: 4, targets: ["q_proj", "v_proj", "down_proj"] } };

describe("two policies in one job (the referential game)", () => {
  it.each(["native", "torch"] as const)("trains each role's policy (a full model, a LoRA adapter) on its own samples, generated with that role's weights (%s workers)", async (backend) => {
    const out = mkdtempSync(join(tmpdir(), "ooze-train-policies-"));
    dirs.push(out);
    const job = `train-policies-${backend}-${process.pid}`;
    const train = trainSchema.parse({
      task: "referential", taskConfig: { messageTokens: 2, prompt: "worded" }, preset: "tiny", initStd: 0.1, promptsPerStep: 4, samplesPerPrompt: 3,
      // an entropy bonus moves the adapters even while every guess is wrong (a tiny random model's are)
      lr: 0.02, entropyCoef: 0.05, steps: STEPS, checkpointEvery: 2, policies: { describer: { full: true }, guesser: lora }, roles: { describer: "describer", guesser: { policy: "guesser", contexts: 3 } },
      // one worker per policy: two PyTorch processes on torch
      trainer: backend === "torch" ? { backend, device: "cpu", threads: 1 } : {},
    });
    const summary = await runTrainJob({
      topology: parseTopology("name: game\nactors: [{ name: trainer, kind: train.trainer }]\n"),
      train, engines: enginesSchema.parse({ count: 1, maxRunning: 32, cacheTokens: 4096 }), out, job, verbose: false,
      nats: { url: nats.server.url, token: nats.server.token },
    });
    expect(summary.steps).toBe(STEPS);
    // each policy's figures of every step: its samples' rewards and its own update
    const metrics = readJsonl<StepMetrics>(join(out, "metrics.jsonl"));
    for (const m of metrics) {
      expect(m.policy_describer_samples! * 3).toBe(m.policy_guesser_samples);
      expect(m.policy_guesser_success_rate).toBeCloseTo(m.success_rate, 12); // the describer's success is a rate: not counted
      for (const k of ["loss", "entropy", "grad_norm", "clipfrac"]) expect(typeof m[`policy_describer_${k}`]).toBe("number");
    }

    // Each version holds both policies (the describer's whole model, the guesser's adapter), each
    // naming its policy; the base stays.
    const weightsFile = { describer: "model.safetensors", guesser: "adapter_model.safetensors" };
    for (const v of ["v0-policies", "v2", "v3"])
      for (const [p, file] of Object.entries(weightsFile)) {
        expect(existsSync(join(out, "weights", v, p, file))).toBe(true);
        expect(JSON.parse(readFileSync(join(out, "weights", v, p, POLICY_FILE), "utf8"))).toEqual({ policy: p });
      }
    expect(existsSync(join(out, "weights", "v0", "model.safetensors"))).toBe(true);
    // the adapter names the base it trains over (never pruned)
    expect(JSON.parse(readFileSync(join(out, "weights", "v3", "guesser", "adapter_config.json"), "utf8"))).toMatchObject({ r: 4, base_model_name_or_path: join(out, "weights", "v0") });
    const ckpt = JSON.parse(readFileSync(join(out, "checkpoints", "latest.json"), "utf8")) as { dir: string };
    expect(existsSync(join(ckpt.dir, "guesser", "adapter_config.json"))).toBe(true);
    expect(existsSync(join(ckpt.dir, "describer", "model.safetensors"))).toBe(true);

    const bus = await nats.connect();
    const batches = await scanStream(bus, jobNames(job).streamBatches, batchRegistry);
    const last = batches.find((m) => m.body.step === STEPS)!.body.samples;
    const of = (p: string) => last.filter((s) => s.policy === p);
    // Every episode gave one describer sample and three guesses of its message, at the indices that follow.
    expect(of("guesser").length).toBe(3 * of("describer").length);
    expect(of("describer").length).toBeGreaterThan(0);
    for (const d of of("describer")) {
      const gs = last.filter((s) => s.rolloutId.startsWith(`${d.rolloutId}.`));
      expect(gs.map((g) => g.index)).toEqual([d.index + 1, d.index + 2, d.index + 3]);
      expect(gs.every((g) => g.policy === "guesser")).toBe(true);
      // the describer's reward is the mean of its message's guesses
      expect(d.reward).toBeCloseTo(gs.reduce((a, g) => a + g.reward!, 0) / 3, 12);
      // each guesser's prompt: BOS, "message: ", the describer's sampled ids as they are, "\nsecret:"
      const message = Array.from(d.tokens.subarray(d.tokens.length - d.responseLength)).filter((t) => t !== 257).slice(0, 2);
      for (const g of gs) {
        const prompt = Array.from(g.tokens.subarray(0, g.tokens.length - g.responseLength));
        expect(prompt).toEqual([256, ...encodeBytes("message: "), ...message, ...encodeBytes("\nsecret:")]);
        expect(Buffer.from(prompt.filter((t) => t < 256)).toString("latin1")).not.toContain("secret: ");
      }
    }
    // Version 2 generated the last batch: each role's tokens are its own policy's (and not the other's, nor the base's).
    expect(last.every((s) => s.weightVersions.every((w) => w.version === "2"))).toBe(true);
    const v2 = join(out, "weights", "v2");
    expect(await rolloutLogprobGap(join(v2, "describer"), of("describer"))).toBeLessThan(1e-4);
    expect(await rolloutLogprobGap(join(v2, "guesser"), of("guesser"))).toBeLessThan(1e-4);
    expect(await rolloutLogprobGap(join(v2, "guesser"), of("describer"))).toBeGreaterThan(1e-3);
    expect(await rolloutLogprobGap(join(out, "weights", "v0"), of("describer"))).toBeGreaterThan(1e-3);
  }, 120_000);

  it("an engine SIGKILLed while it serves the policies comes back serving the current version of each: nothing lost, every later sample on-policy", async () => {
    const out = mkdtempSync(join(tmpdir(), "ooze-train-policies-kill-"));
    dirs.push(out);
    const steps = 3;
    const train = trainSchema.parse({
      task: "referential", preset: "tiny", initStd: 0.1, promptsPerStep: 4, samplesPerPrompt: 2, lr: 0.02, entropyCoef: 0.05, steps,
      policies: { describer: lora, guesser: { full: true } }, roles: { describer: "describer", guesser: { policy: "guesser", contexts: 2 } },
    });
    const lines: string[] = [];
    let killed: number | null = null;
    const enginesBefore = new Set(enginePidsOf(process.pid));
    const summary = await runTrainJob({
      topology: parseTopology("name: game\nactors: [{ name: trainer, kind: train.trainer }]\n"),
      train, engines: enginesSchema.parse({ count: 1, maxRunning: 32, cacheTokens: 4096 }), out, job: `train-policies-kill-${process.pid}`, verbose: true,
      nats: { url: nats.server.url, token: nats.server.token }, log: (l) => lines.push(l),
      onStep: (m) => {
        if (m.step !== 1) return;
        // the job's one engine (a child of this process, serving version 1's adapter and model by now or soon)
        killed = enginePidOf(process.pid, enginesBefore);
        process.kill(killed, "SIGKILL");
      },
    });
    expect(killed).not.toBeNull();
    expect(lines.some((l) => /embedded engine 0 .* exited \(SIGKILL\); restarting/.test(l)), lines.join("\n")).toBe(true);
    expect(summary.steps).toBe(steps);
    const batches = (await scanStream(await nats.connect(), jobNames(`train-policies-kill-${process.pid}`).streamBatches, batchRegistry)).map((m) => m.body);
    // every step trained all its episodes: 4 prompts × 2 episodes × (1 describer + 2 guesses)
    for (const b of batches) expect(b.samples.length).toBe(4 * 2 * 3);
    expect(new Set(batches.flatMap((b) => b.samples.map((x) => x.index))).size).toBe(steps * 24);
    // the last batch came from the restarted engine, under version 2: each role's own weights of that version
    const last = batches.find((b) => b.step === steps)!.samples;
    expect(last.every((x) => x.weightVersions.every((w) => w.version === String(steps - 1)))).toBe(true);
    const v = join(out, "weights", `v${steps - 1}`);
    expect(await rolloutLogprobGap(join(v, "describer"), last.filter((x) => x.policy === "describer"))).toBeLessThan(1e-4);
    expect(await rolloutLogprobGap(join(v, "guesser"), last.filter((x) => x.policy === "guesser"))).toBeLessThan(1e-4);
  });

  it("refuses roles and policies that do not fit", () => {
    expect(() => trainSchema.parse({ policies: { a: lora, b: lora } })).toThrow(/map the task's roles/);
    expect(() => trainSchema.parse({ policies: { a: lora, b: { full: true } }, roles: { x: "a", y: "b" }, weightSync: "delta" })).toThrow(/several policies are synced whole/);
    expect(() => trainSchema.parse({ policies: { a: lora }, roles: { x: "b" } })).toThrow(/policy 'b' is not one of policies \(a\)/);
  });
});
