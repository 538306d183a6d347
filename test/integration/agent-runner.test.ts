// The agent runner with real child processes: an agent that crashes, one that hangs past its
// timeout (its whole process group, grandchild included, is gone afterwards), one that writes the
// file the reward checks (a reward command and a reward module), and the sample numbering of
// episodes that yield more segments than their index range holds.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentSchema } from "../../actors/protocol/agent-config.ts";
import { runAgentEpisode, type SessionHost } from "../../actors/environment/agent/episode.ts";
import { runAgentGroup } from "../../actors/environment/agent/group.ts";
import { loadAgentTask } from "../../actors/environment/agent/task.ts";
import { SampleBuilder, type Sample } from "../../src/sample.ts";
import { episodeDirsOf, waitUntil } from "../harness/index.ts";

const fixtures = resolve(import.meta.dirname, "../fixtures/agents");
const scratch = mkdtempSync(join(tmpdir(), "ooze-agent-test-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/**
 * Stands for the gateway boundary (src/gateway's Gateway, built on another branch): sessions with
 * endpoint URLs and a key; closing one returns `segments` samples as if the agent had made requests.
 * The agents in this file never call the model; what is under test is the process side.
 */
function standInGateway(segments = 1): SessionHost & { opened: string[]; closed: string[] } {
  const opened: string[] = [];
  const closed: string[] = [];
  const sockets = new Map<string, Server>();
  return {
    opened, closed,
    // The sandbox's endpoint: a socket that answers nothing (these agents make no request).
    async listenSession(id, path) {
      const srv = createServer((c) => c.end());
      await new Promise<void>((r) => srv.listen(path, r));
      sockets.set(id, srv);
    },
    openSession(s) {
      opened.push(s.episodeId);
      const id = `sess-${s.episodeId}`;
      return { id, openaiBaseUrl: `http://127.0.0.1:9999/s/${id}/v1`, anthropicBaseUrl: `http://127.0.0.1:9999/s/${id}`, apiKey: `key-${id}` };
    },
    closeSession(id) {
      closed.push(id);
      sockets.get(id)?.close();
      const samples: Sample[] = [];
      for (let k = 0; k < segments; k++) {
        const b = new SampleBuilder(0, 0, "gw", null, [1, 2, 3]);
        b.appendModel([10 + k, 11], [-0.5, -0.25], "0");
        b.appendEnv([4]);
        samples.push(b.build(null, "completed", { gatewaySegment: k }));
      }
      return { samples, requests: segments, error: null };
    },
  };
}

const task = await loadAgentTask(join(fixtures, "write-task.ts"), {}, fixtures);
const spec = (groupIndex: number, firstIndex: number) => ({ groupIndex, episode: 0, firstIndex, seed: 0, temperature: 1, samplingSeed: 1 });
/**
 * The episode directories this file's episodes left: this process's (other processes run agents at
 * the same time), less those there before the file began (other test files share this vitest process,
 * isolate: false, and a job of theirs that outlived its test may still have some).
 */
let dirsBefore = new Set<string>();
beforeAll(() => void (dirsBefore = new Set(episodeDirsOf())));
const agentDirs = () => episodeDirsOf().filter((d) => !dirsBefore.has(d));

describe("runAgentEpisode", () => {
  it("records a crashing agent as a failed episode with its exit code and stderr, and closes its session", async () => {
    const gw = standInGateway();
    const agent = agentSchema.parse({ command: process.execPath, args: [join(fixtures, "crash.mjs")] });
    const samples = await runAgentEpisode({ sessions: gw, task, agent, baseDir: fixtures }, spec(90, 40));
    expect(samples).toHaveLength(1);
    expect(samples[0]!.status).toBe("failed");
    expect(samples[0]!.reward).toBeNull();
    expect(String(samples[0]!.metadata.error)).toContain("exited with code 3: crash agent: giving up on purpose");
    expect(gw.closed).toEqual(["sess-r40"]);
    expect(agentDirs()).toEqual([]); // the episode's directory is removed
  });

  it("kills the whole process group of an agent that hangs past its timeout (SIGTERM ignored → SIGKILL)", async () => {
    const gw = standInGateway();
    const pidfile = join(scratch, "hang-pids.json");
    // Unconfined (the process-group path); the sandboxed one is test/integration/sandbox-hostile.test.ts's.
    const agent = agentSchema.parse({ command: process.execPath, args: [join(fixtures, "hang.mjs")], env: { PIDFILE: pidfile }, timeoutS: 4, killGraceS: 0.2, sandbox: "none" });
    const samples = await runAgentEpisode({ sessions: gw, task, agent, baseDir: fixtures }, spec(91, 0));
    expect(samples[0]!.status).toBe("failed");
    expect(String(samples[0]!.metadata.error)).toContain("timed out after 4 s");
    expect(samples[0]!.metadata.agent).toMatchObject({ signal: "SIGKILL" });
    const pids = JSON.parse(readFileSync(pidfile, "utf8")) as { leader: number; grandchild: number };
    const alive = (pid: number) => {
      try {
        process.kill(pid, 0);
        return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "Z"; // a zombie is dead
      } catch {
        return false;
      }
    };
    await waitUntil(() => !alive(pids.leader) && !alive(pids.grandchild), {
      what: "the hung agent and its grandchild to be gone", timeoutMs: 10_000,
      diagnostics: () => `leader ${pids.leader} alive=${alive(pids.leader)}, grandchild ${pids.grandchild} alive=${alive(pids.grandchild)}`,
    });
    expect(gw.closed).toEqual(["sess-r0"]);
  });

  it("gives the agent its task on stdin, argv and env with the session's endpoints; a reward command checks the file it wrote", async () => {
    const gw = standInGateway();
    const agent = agentSchema.parse({
      command: process.execPath, args: [join(fixtures, "writer.mjs"), "--task", "{task}", "--episode", "{episode}"], env: { EXTRA: "x", OPENAI_API_KEY: "not-this-one" },
      reward: { command: process.execPath, args: [join(fixtures, "check-answer.mjs"), "21"] }, keepWorkdirs: true,
    });
    const samples = await runAgentEpisode({ sessions: gw, task, agent, baseDir: fixtures }, spec(3, 24));
    expect(samples).toHaveLength(1);
    const s = samples[0]!;
    expect(s.status).toBe("completed");
    expect(s.reward).toBe(1);
    expect(s.metadata.success).toBe(true);
    expect(s.metadata.error).toBeUndefined();
    const root = String(s.metadata.workdir);
    expect(readFileSync(join(root, "work", "notes/readme.txt"), "utf8")).toBe("task files land here\n");
    const seen = JSON.parse(readFileSync(join(root, "work", "env.json"), "utf8")) as { env: Record<string, string>; argv: string[]; cwd: string };
    expect(seen.env).toEqual({
      OPENAI_BASE_URL: "http://127.0.0.1:9999/s/sess-r24/v1", OPENAI_API_KEY: "key-sess-r24", ANTHROPIC_BASE_URL: "http://127.0.0.1:9999/s/sess-r24",
      ANTHROPIC_API_KEY: "key-sess-r24", OOZE_TASK: "write 21 to answer.txt", OOZE_WORKDIR: join(root, "work"), OOZE_EPISODE: "r24", EXTRA: "x",
    });
    expect(seen.argv).toEqual(["--task", "write 21 to answer.txt", "--episode", "r24"]);
    rmSync(root, { recursive: true, force: true });
  });

  it("scores with the task module's reward when no reward command is set, and 0 when the file is wrong", async () => {
    const agent = agentSchema.parse({ command: process.execPath, args: [join(fixtures, "writer.mjs")] });
    const good = await runAgentEpisode({ sessions: standInGateway(), task, agent, baseDir: fixtures }, spec(5, 0));
    expect(good[0]).toMatchObject({ reward: 1, status: "completed", metadata: { success: true } });
    // the same agent on a task whose prompt it answers with the wrong number
    const wrong = { ...task, prompt: (i: number, s: number) => ({ ...task.prompt(i, s), data: -1 }) };
    const bad = await runAgentEpisode({ sessions: standInGateway(), task: wrong, agent, baseDir: fixtures }, spec(5, 0));
    expect(bad[0]).toMatchObject({ reward: 0, status: "completed", metadata: { success: false } });
    expect(agentDirs()).toEqual([]);
  });

  it("rewards samples one by one when the task says so: each its own trajectory, grouped by prompt", async () => {
    const agent = agentSchema.parse({ command: process.execPath, args: [join(fixtures, "writer.mjs")], maxSegments: 3 });
    const each = { ...task, reward: () => ({ samples: [{ reward: 0.5, success: null }, { reward: 1, success: true }, { reward: 0 }] }) };
    const samples = await runAgentEpisode({ sessions: standInGateway(3), task: each, agent, baseDir: fixtures }, spec(5, 40));
    expect(samples.map((s) => [s.index, s.rolloutId, s.reward, s.metadata.context, s.metadata.success])).toEqual([
      [40, "r40", 0.5, 0, null], [41, "r40.1", 1, 1, true], [42, "r40.2", 0, 2, undefined],
    ]);
    // one reward per sample of the transcript, or the episode fails saying so
    const short = { ...task, reward: () => ({ samples: [{ reward: 1 }] }) };
    const failed = await runAgentEpisode({ sessions: standInGateway(3), task: short, agent, baseDir: fixtures }, spec(5, 40));
    expect(failed.every((s) => s.status === "failed" && s.reward === null)).toBe(true);
    expect(String(failed[0]!.metadata.error)).toMatch(/returned samples of length 1; the transcript has 3 samples/);
    const nan = { ...task, reward: () => ({ samples: [{ reward: 1 }, { reward: Number.NaN }, { reward: 0 }] }) };
    const bad = await runAgentEpisode({ sessions: standInGateway(3), task: nan, agent, baseDir: fixtures }, spec(5, 40));
    expect(String(bad[0]!.metadata.error)).toMatch(/samples\[1\] = \{"reward":null\}, not \{reward: a finite number/);
  });

  it("reports an agent command that does not exist as a failed episode naming it", async () => {
    const agent = agentSchema.parse({ command: "./no-such-agent.sh" });
    const samples = await runAgentEpisode({ sessions: standInGateway(), task, agent, baseDir: fixtures }, spec(6, 0));
    expect(samples[0]!.status).toBe("failed");
    expect(String(samples[0]!.metadata.error)).toMatch(/agent could not start: .*no-such-agent\.sh: No such file or directory/);
  });
});

describe("runAgentGroup numbering", () => {
  it("gives episode k of a group the indices firstSample + k·maxSegments + segment, drops segments past maxSegments, one rolloutId per episode", async () => {
    const agent = agentSchema.parse({ command: process.execPath, args: [join(fixtures, "writer.mjs")], maxSegments: 2 });
    const three = await runAgentGroup({ sessions: standInGateway(3), task, agent, baseDir: fixtures }, { groupIndex: 7, firstSample: 100, episodes: 2, seed: 0, temperature: 1 });
    expect(three.map((s) => [s.index, s.rolloutId, s.metadata.segment])).toEqual([[100, "r100", 0], [101, "r100", 1], [102, "r102", 0], [103, "r102", 1]]);
    expect(three.every((s) => s.groupIndex === 7 && s.reward === 1 && s.metadata.droppedSegments === 1)).toBe(true);
    const one = await runAgentGroup({ sessions: standInGateway(1), task, agent, baseDir: fixtures }, { groupIndex: 7, firstSample: 100, episodes: 2, seed: 0, temperature: 1 });
    expect(one.map((s) => s.index)).toEqual([100, 102]); // the same episode keeps the same index on a rerun
  });
});

describe("train.agent config", () => {
  it("names the field that is wrong", () => {
    const r = agentSchema.safeParse({ command: "x", timeoutS: -1, extra: 1 });
    expect(r.success).toBe(false);
    const msg = r.error!.issues.map((i) => `${i.path.join(".") || "(section)"}: ${i.message}`).join("; ");
    expect(msg).toContain("timeoutS");
    expect(msg).toContain("extra");
  });
});

it("leaves no episode directories behind", () => {
  expect(existsSync(scratch)).toBe(true);
  expect(agentDirs()).toEqual([]);
});
