// One agent episode: a temporary directory (the agent's workdir, with the task's files), a gateway
// session, the agent command run in its own process group with the session's endpoints in its
// environment and the task on stdin, then the reward (a command in the workdir or the task's
// reward()), and the session's samples numbered in the episode's own index range. A crash, a
// timeout or a failing reward yields the episode's samples as `failed` (one
// placeholder when it produced none), the reason in metadata: never a thrown error, never a stuck step.
// Unless the topology says `sandbox: none`, the agent and the reward command run in a sandbox each
// (sandbox.ts): the workdir and the episode's own gateway session are all they reach.
import { chmod, chown, mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { counter, histogram, processMetrics } from "../../../src/metrics.ts";
import { markOwner } from "../../../src/owned-dirs.ts";
import type { Sample } from "../../../src/sample.ts";
import type { AgentConfig, RewardCommandConfig } from "../../protocol/agent-config.ts";
import { runProcess, type ProcessResult, type ProcessSpec } from "./process.ts";
import { programPaths, resolvePaths, sandboxArgv, sandboxIds, sandboxTools, type SandboxSettings } from "./sandbox.ts";
import { inCgroup, SandboxCgroup } from "./cgroup.ts";
import type { AgentPrompt, AgentTask, RewardResult, SampleReward, Transcript } from "./task.ts";

/** What an episode needs of the gateway (src/gateway Gateway): one session per episode. */
export interface SessionHost {
  openSession(s: { episodeId: string; groupIndex: number; maxTurns?: number; maxTokens?: number; temperature?: number; samplingSeed?: number }): {
    id: string;
    openaiBaseUrl: string;
    anthropicBaseUrl: string;
    apiKey: string;
  };
  closeSession(id: string): { samples: Sample[]; requests: number; error: string | null };
  /** Serves the session alone on a Unix socket (the sandbox's one endpoint); needed with `sandbox.network: gateway`. */
  listenSession?(id: string, path: string): Promise<void>;
}

/** Everything an episode runs with (one per rollout). */
export interface AgentDeps {
  sessions: SessionHost;
  task: AgentTask;
  agent: AgentConfig;
  /** Relative command paths resolve here (the topology's directory). */
  baseDir: string;
  /** Decodes token ids for the transcript's text (optional). */
  decode?: (ids: Int32Array) => string;
}

/** One episode's place in the job. */
export interface AgentEpisodeSpec {
  groupIndex: number;
  /** Episode number within its group (0 … samplesPerPrompt − 1). */
  episode: number;
  /** First of the agent.maxSegments sample indices this episode owns. */
  firstIndex: number;
  seed: number;
  temperature: number;
  samplingSeed: number;
  signal?: AbortSignal;
}

/** Environment variables an agent inherits from ooze's own (nothing else leaks, no keys). */
const INHERITED = ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "NODE_PATH", "SystemRoot"];

/** Replaces `{task}`, `{workdir}` and `{episode}` in an argument. */
function expand(arg: string, vars: Record<string, string>): string {
  return arg.replace(/\{(task|workdir|episode)\}/g, (_, k: string) => vars[k]!);
}

/** A command path: absolute, a bare name (PATH), or relative to the topology's directory. */
function commandPath(cmd: string, baseDir: string): string {
  return isAbsolute(cmd) || !cmd.includes("/") ? cmd : resolve(baseDir, cmd);
}

/** What a signal from a sandbox's limits means. */
const LIMIT_SIGNALS: Partial<Record<string, string>> = {
  SIGXCPU: " (its cpuSeconds limit)",
  SIGXFSZ: " (its fileSizeMB limit: a file too large)",
};

/** Why a process run counts as failed, or null. */
function processFailure(what: string, r: ProcessResult, timeoutS: number, sandbox: SandboxSettings | null = null): string | null {
  if (r.spawnError) return `${what} could not start: ${r.spawnError}`;
  if (r.outputExceeded) return `${what} printed more than ${sandbox?.outputMB ?? 64} MiB on stdout and stderr (stopped)`;
  if (r.timedOut) return `${what} timed out after ${timeoutS} s (${sandbox ? "sandbox" : "process group"} killed)`;
  if (r.aborted) return `${what} was abandoned (rollout stopping)`;
  if (r.signal) return `${what} was killed by ${r.signal}${LIMIT_SIGNALS[r.signal] ?? ""}${errorLine(r.stderr) ? `: ${errorLine(r.stderr)}` : ""}`;
  if (r.exitCode !== 0) return `${what} exited with code ${r.exitCode}${errorLine(r.stderr) ? `: ${errorLine(r.stderr)}` : ""}`;
  return null;
}

/**
 * The line of an agent's stderr that says why it failed: the first naming an error or exception, else
 * the last that says anything. Lines that are only programs' prefixes ("sh: 1:", or several run
 * together: "sh: 1: sh: 1:") are passed over: several processes writing at once (a fork bomb's
 * shells, each killed mid-message) leave such fragments last.
 */
export function errorLine(s: string): string {
  const lines = s.split("\n").map((l) => l.trim()).filter((l) => /[A-Za-z]/.test(l.replace(/^([\w./-]+:(\s*\d+:)?\s*)+/, "")));
  return (lines.find((l) => /\b\w*(Error|Exception)\b/.test(l)) ?? lines[lines.length - 1] ?? "").slice(0, 300);
}

function lastLine(s: string): string {
  const lines = s.trim().split("\n");
  return (lines[lines.length - 1] ?? "").slice(0, 300);
}

/** Runs one agent episode; resolves with its samples (≥ 1), never rejects for the agent's failures. */
export async function runAgentEpisode(deps: AgentDeps, spec: AgentEpisodeSpec): Promise<Sample[]> {
  const { agent, task } = deps;
  const rolloutId = `r${spec.firstIndex}`;
  const prompt = task.prompt(spec.groupIndex, spec.seed);
  const t0 = performance.now();
  const root = await mkdtemp(join(tmpdir(), `ooze-agent-${spec.groupIndex}-${spec.episode}-`));
  markOwner(root); // a SIGKILLed job's episode directories are removed by the next start (rollout-hook.ts)
  const workdir = join(root, "work");
  const box = agent.sandbox === "none" ? null : agent.sandbox;
  // The sandbox's own uid (ooze as root), owner of the workdir; the episode directory only lets it through.
  const ids = box ? sandboxIds() : null;
  let failure: string | null = null;
  let samples: Sample[] = [];
  let requests = 0;
  let result: ProcessResult | null = null;
  let oomKills = 0;
  /** CPU seconds the sandbox had used when it went over its cpuSeconds budget and was killed, or null. */
  let cpuOver: number | null = null;
  let reward: Verdict | null = null;
  // A session the gateway ended early (turn or token limit spent, context too long) is the policy's
  // doing: the agent sees an API error, and if it still exits cleanly the reward decides (recorded).
  let gatewayError: string | null = null;
  try {
    await mkdir(workdir);
    for (const [rel, content] of Object.entries(prompt.files ?? {})) {
      const p = resolve(workdir, rel);
      if (!p.startsWith(workdir + "/")) throw new Error(`task file '${rel}' is outside the workdir`);
      await mkdir(dirname(p), { recursive: true });
      await writeFile(p, content);
    }
    if (ids) {
      await chmod(root, 0o711);
      await chownTree(workdir, ids.uid, ids.gid);
    }
    const session = deps.sessions.openSession({
      episodeId: rolloutId, groupIndex: spec.groupIndex, maxTurns: agent.maxTurns, maxTokens: agent.maxTokens,
      temperature: spec.temperature, samplingSeed: spec.samplingSeed,
    });
    try {
      const vars = { task: prompt.task, workdir, episode: rolloutId };
      const env: NodeJS.ProcessEnv = {};
      for (const k of INHERITED) if (process.env[k] !== undefined) env[k] = process.env[k];
      Object.assign(env, agent.env, box ? { HOME: "/tmp", TMPDIR: "/tmp" } : {}, {
        OPENAI_BASE_URL: session.openaiBaseUrl, OPENAI_API_KEY: session.apiKey,
        ANTHROPIC_BASE_URL: session.anthropicBaseUrl, ANTHROPIC_API_KEY: session.apiKey,
        OOZE_TASK: prompt.task, OOZE_WORKDIR: workdir, OOZE_EPISODE: rolloutId,
      });
      let gateway: { socket: string; port: number } | null = null;
      if (box?.network === "gateway") {
        if (!deps.sessions.listenSession) throw new Error("sandbox.network is 'gateway' but the session host serves no per-session socket");
        const socket = join(root, "gateway.sock");
        await deps.sessions.listenSession(session.id, socket);
        if (ids) await chown(socket, ids.uid, ids.gid);
        gateway = { socket, port: Number(new URL(session.openaiBaseUrl).port) };
      }
      const run = commandLine(agent.command, agent.args.map((a) => expand(a, vars)), deps.baseDir, box, workdir, gateway, [], ids);
      const ran = await runInCgroup(run, box, {
        ...run, cwd: workdir, env, stdin: prompt.task, timeoutMs: agent.timeoutS * 1000, killGraceMs: agent.killGraceS * 1000,
        ...(spec.signal ? { signal: spec.signal } : {}),
      });
      ({ result, oomKills, cpuOver } = ran);
    } finally {
      const closed = deps.sessions.closeSession(session.id);
      samples = closed.samples;
      requests = closed.requests;
      gatewayError = closed.error;
      failure = cpuOver !== null ? cpuFailure("agent", cpuOver, box!) : withOom(processFailure("agent", result ?? failedStart(), agent.timeoutS, box), oomKills, box);
    }
    if (!failure && samples.length === 0) failure = "the agent made no model request";
    if (!failure) {
      const transcript: Transcript = {
        samples, text: deps.decode ? samples.map((s) => deps.decode!(s.tokens)) : [],
        stdout: result!.stdout, stderr: result!.stderr, exitCode: result!.exitCode,
      };
      const r = agent.reward
        ? await rewardByCommand(agent.reward, deps.baseDir, root, workdir, prompt, transcript, box, ids)
        : task.reward
          ? await rewardByModule(task, workdir, prompt, transcript)
          : { error: `task '${task.name}' has no reward() and train.agent.reward is not set` };
      if ("error" in r) failure = r.error;
      else reward = r;
    }
  } catch (e) {
    failure = `episode setup: ${(e as Error).message}`;
  } finally {
    if (!agent.keepWorkdirs) await rm(root, { recursive: true, force: true }).catch(() => undefined);
  }
  recordEpisode(failure, (performance.now() - t0) / 1000);
  return numberSamples(samples, spec, rolloutId, agent.maxSegments, {
    failure, reward, requests, gatewayError,
    agent: result ? { exitCode: result.exitCode, signal: result.signal, seconds: result.seconds } : null,
    ...(agent.keepWorkdirs ? { workdir: root } : {}),
  }, prompt);
}

/** Why an episode failed, as one of a few words (the `reason` label of ooze_agent_episodes_total). */
export function failureKind(failure: string | null): string {
  if (failure === null) return "none";
  const kinds: [RegExp, string][] = [
    [/timed out/, "timeout"], [/out of memory/, "memory"], [/CPU budget|cpuSeconds/, "cpu"], [/made no model request/, "no_request"],
    [/reward/, "reward"], [/could not start|episode setup/, "setup"], [/abandoned/, "stopped"], [/killed by|exited with code|printed more than/, "agent"],
  ];
  return kinds.find(([re]) => re.test(failure))?.[1] ?? "other";
}

/** An episode's outcome and time in this process's metrics (ooze_agent_episodes_total, ooze_agent_episode_seconds). */
function recordEpisode(failure: string | null, seconds: number): void {
  const r = processMetrics(), outcome = failure === null ? "completed" : "failed";
  counter(r, "ooze_agent_episodes_total", "Agent episodes run, by outcome and why they failed.", ["outcome", "reason"]).inc({ outcome, reason: failureKind(failure) });
  histogram(r, "ooze_agent_episode_seconds", "Wall time of an agent episode (workdir, agent, reward).", ["outcome"]).observe({ outcome }, seconds);
}

/**
 * Runs a command line (its cgroup, if any, closed after) with the sandbox's CPU budget watched: when
 * its processes together pass cpuSeconds of CPU, every one of them is killed at once and the run is
 * stopped like a timeout (`cpuOver`: the seconds they had used).
 */
async function runInCgroup(
  run: { cgroup?: SandboxCgroup }, box: SandboxSettings | null, spec: ProcessSpec,
): Promise<{ result: ProcessResult; oomKills: number; cpuOver: number | null }> {
  const cg = run.cgroup;
  let cpuOver: number | null = null;
  const stop = new AbortController();
  const unwatch = cg && box
    ? cg.watchCpu(box.cpuSeconds, (used) => {
        cpuOver = used;
        cg.kill();
        stop.abort();
      })
    : () => undefined;
  const signal = spec.signal ? AbortSignal.any([spec.signal, stop.signal]) : stop.signal;
  try {
    const result = await runProcess({ ...spec, signal });
    return { result, oomKills: cg?.oomKills() ?? 0, cpuOver };
  } finally {
    unwatch();
    await cg?.close();
  }
}

/** The failure of a sandbox killed for going over its CPU budget. */
function cpuFailure(what: string, used: number, box: SandboxSettings): string {
  return `${what} used up the sandbox's CPU budget: its processes together ran ${used.toFixed(2)} s of CPU, over cpuSeconds ${box.cpuSeconds} (sandbox killed)`;
}

/** A failure with the sandbox's OOM kills named (its processes together went over memoryMB). */
function withOom(failure: string | null, oomKills: number, box: SandboxSettings | null): string | null {
  if (!failure || oomKills === 0) return failure;
  return `${failure} (out of memory: the sandbox's processes together reached memoryMB ${box?.memoryMB ?? "?"} MiB; ${oomKills} OOM-killed)`;
}

function failedStart(): ProcessResult {
  return { exitCode: null, signal: null, timedOut: false, aborted: false, spawnError: "not started", stdout: "", stderr: "", pgid: null, seconds: 0, outputExceeded: false };
}

/** The program to spawn: the command itself, or (sandboxed) bwrap around it, with its output limit. */
function commandLine(
  command: string, args: string[], baseDir: string, box: SandboxSettings | null, workdir: string,
  gateway: { socket: string; port: number } | null, readOnly: string[], ids: { uid: number; gid: number } | null,
): { command: string; args: string[]; sandboxed?: boolean; maxTotalOutputBytes?: number; cgroup?: SandboxCgroup } {
  const cmd = commandPath(command, baseDir);
  if (!box) return { command: cmd, args };
  const boxed = sandboxArgv({
    settings: box, tools: sandboxTools(), workdir, gateway, ids,
    readOnly: [...programPaths(cmd, args, resolvePaths(box.readOnlyPaths, baseDir, "readOnlyPaths")), ...readOnly],
    writable: resolvePaths(box.writablePaths, baseDir, "writablePaths"),
  }, cmd, args);
  // one memory budget and process count for the whole sandbox, where the machine gives cgroups
  const cgroup = SandboxCgroup.make(box);
  const argv = cgroup ? inCgroup(cgroup, boxed) : boxed;
  return { command: argv[0]!, args: argv.slice(1), sandboxed: true, maxTotalOutputBytes: box.outputMB * 1024 * 1024, ...(cgroup ? { cgroup } : {}) };
}

/** Gives `dir` and everything in it to the sandbox's uid. */
async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  await chown(dir, uid, gid);
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) await chownTree(p, uid, gid);
    else await chown(p, uid, gid);
  }
}

/** A reward's verdict: the episode's reward and success, or (`samples`) one per sample. */
interface Verdict {
  reward: number;
  success: boolean | null;
  samples: SampleReward[] | null;
}

interface Outcome {
  failure: string | null;
  reward: Verdict | null;
  requests: number;
  gatewayError: string | null;
  agent: { exitCode: number | null; signal: string | null; seconds: number } | null;
  workdir?: string;
}

/**
 * The episode's samples with their indices (firstIndex + segment), group, episode id, reward and
 * status; segments beyond maxSegments are dropped (counted in metadata). No samples: one failed placeholder.
 * Samples rewarded one by one are trajectories of their own: rollout id `r<first>.<segment>` past
 * the first, and `metadata.context`, which groups them by prompt for advantages (as a role task's contexts).
 */
export function numberSamples(samples: Sample[], spec: AgentEpisodeSpec, rolloutId: string, maxSegments: number, o: Outcome, prompt: AgentPrompt): Sample[] {
  const kept = samples.slice(0, maxSegments);
  const meta = {
    episode: spec.episode, segments: samples.length, droppedSegments: samples.length - kept.length, requests: o.requests, agent: o.agent,
    ...(o.failure ? { error: o.failure } : {}),
    ...(o.gatewayError ? { gatewayError: o.gatewayError } : {}),
    ...(o.reward && o.reward.samples === null && o.reward.success !== null ? { success: o.reward.success } : {}),
    ...(o.workdir ? { workdir: o.workdir } : {}),
  };
  if (kept.length === 0)
    return [{
      index: spec.firstIndex, groupIndex: spec.groupIndex, rolloutId, prompt: prompt.task, tokens: new Int32Array(0), responseLength: 0,
      lossMask: new Uint8Array(0), rolloutLogprobs: new Float32Array(0), reward: null, status: "failed", weightVersions: [], metadata: { ...meta, segment: 0 },
    }];
  const each = o.failure ? null : o.reward!.samples;
  return kept.map((s, i) => ({
    ...s,
    index: spec.firstIndex + i,
    groupIndex: spec.groupIndex,
    rolloutId: each && i > 0 ? `${rolloutId}.${i}` : rolloutId,
    prompt: prompt.task,
    reward: o.failure ? null : each ? each[i]!.reward : o.reward!.reward,
    status: o.failure ? "failed" : s.status === "pending" || s.status === "aborted" ? "completed" : s.status,
    metadata: {
      ...s.metadata, ...meta, segment: i,
      ...(each ? { context: i, ...(each[i]!.success !== undefined ? { success: each[i]!.success } : {}) } : {}),
    },
  }));
}

/** The reward command's verdict: its last stdout line if a number, else exit 0 → 1, other → 0. */
async function rewardByCommand(
  cmd: RewardCommandConfig, baseDir: string, root: string, workdir: string, prompt: AgentPrompt, transcript: Transcript,
  box: SandboxSettings | null, ids: { uid: number; gid: number } | null,
): Promise<Verdict | { error: string }> {
  const file = join(root, "transcript.json");
  await writeFile(file, JSON.stringify({ task: prompt.task, text: transcript.text, stdout: transcript.stdout, exitCode: transcript.exitCode }));
  const env: NodeJS.ProcessEnv = {};
  for (const k of INHERITED) if (process.env[k] !== undefined) env[k] = process.env[k];
  Object.assign(env, cmd.env, box ? { HOME: "/tmp", TMPDIR: "/tmp" } : {}, { OOZE_TASK: prompt.task, OOZE_WORKDIR: workdir, OOZE_TRANSCRIPT: file });
  const vars = { task: prompt.task, workdir, episode: "" };
  // Sandboxed like the agent, with no network at all; the transcript is shown read-only.
  const run = commandLine(cmd.command, cmd.args.map((a) => expand(a, vars)), baseDir, box ? { ...box, network: "gateway" } : null, workdir, null, [file], ids);
  const { result: r, cpuOver } = await runInCgroup(run, box, { ...run, cwd: workdir, env, stdin: "", timeoutMs: cmd.timeoutS * 1000, killGraceMs: 1000 });
  if (cpuOver !== null) return { error: cpuFailure("reward command", cpuOver, box!) };
  if (r.spawnError) return { error: `reward command could not start: ${r.spawnError}` };
  if (r.timedOut) return { error: `reward command timed out after ${cmd.timeoutS} s` };
  if (r.outputExceeded) return { error: `reward command printed more than ${box?.outputMB ?? 64} MiB (stopped)` };
  const last = lastLine(r.stdout);
  if (last !== "" && Number.isFinite(Number(last))) return { reward: Number(last), success: r.exitCode === 0, samples: null };
  return { reward: r.exitCode === 0 ? 1 : 0, success: r.exitCode === 0, samples: null };
}

async function rewardByModule(task: AgentTask, workdir: string, prompt: AgentPrompt, transcript: Transcript): Promise<Verdict | { error: string }> {
  let r: RewardResult;
  try {
    r = await task.reward!({ workdir, prompt, transcript });
  } catch (e) {
    return { error: `task '${task.name}' reward() threw: ${(e as Error).message}` };
  }
  if (typeof r === "object" && r !== null && "samples" in r) return perSample(task.name, r.samples, transcript.samples.length);
  const reward = typeof r === "number" ? r : r.reward;
  if (!Number.isFinite(reward)) return { error: `task '${task.name}' reward() returned ${String(reward)}, not a finite number` };
  return { reward, success: typeof r === "number" ? null : (r.success ?? null), samples: null };
}

/** A reward per sample, checked: one finite reward for each of the transcript's samples. */
function perSample(name: string, samples: unknown, n: number): Verdict | { error: string } {
  if (!Array.isArray(samples) || samples.length !== n)
    return { error: `task '${name}' reward() returned samples of length ${Array.isArray(samples) ? samples.length : String(samples)}; the transcript has ${n} samples (one reward each, in order)` };
  const bad = samples.findIndex((x: SampleReward | null) => typeof x !== "object" || x === null || !Number.isFinite(x.reward));
  if (bad >= 0) return { error: `task '${name}' reward() returned samples[${bad}] = ${JSON.stringify(samples[bad])}, not {reward: a finite number, success?}` };
  const rewards = (samples as SampleReward[]).map((x) => x.reward);
  return { reward: rewards.reduce((a, x) => a + x, 0) / n, success: null, samples: samples as SampleReward[] };
}
