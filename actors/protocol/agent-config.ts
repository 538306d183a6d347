// The `train.agent` section of a topology: a black-box agent run as a command once per episode
// (zod-validated; actors/protocol/config.ts embeds it in the train schema so errors name the field).
import { roleOf, type RoleConfig } from "./policies.ts";
import { z } from "zod";

/** A command with arguments and extra environment (the reward command shares the shape). */
const command = {
  /** Program to run (PATH lookup as in a shell; relative paths resolve against the topology's directory). */
  command: z.string().min(1),
  /** Arguments; `{task}`, `{workdir}` and `{episode}` are replaced per episode. */
  args: z.array(z.string()).default([]),
  /** Extra environment variables (the endpoint variables ooze sets win over these). */
  env: z.record(z.string(), z.string()).default({}),
};

/** A sandbox that is on: its limits and what it shows (defaults filled in by `sandboxSchema`). */
const sandboxOn = z
  .object({
    /** `gateway`: a network namespace where only the episode's gateway session is reachable; `host`: the machine's network. */
    network: z.enum(["gateway", "host"]).default("gateway"),
    /**
     * Memory per process (RLIMIT_DATA: heap and private writable mappings), MiB. Not RLIMIT_AS:
     * Node reserves gigabytes of address space it never touches (WebAssembly guard regions), and
     * undici's HTTP parser, which the `openai` and Anthropic SDKs use, fails to start under it.
     */
    memoryMB: z.number().int().min(64).default(4096),
    /** Processes and threads of the sandbox (RLIMIT_NPROC of its own uid). */
    pids: z.number().int().min(8).default(256),
    /**
     * CPU seconds per process (RLIMIT_CPU: SIGXCPU, then SIGKILL), and for all of the sandbox's
     * processes together where it gets a cgroup (read every 100 ms; past it the sandbox is killed).
     */
    cpuSeconds: z.number().int().min(1).default(600),
    /** Largest file a process may write (RLIMIT_FSIZE: SIGXFSZ), MiB. */
    fileSizeMB: z.number().int().min(1).default(1024),
    /** Open files per process (RLIMIT_NOFILE). */
    openFiles: z.number().int().min(16).default(1024),
    /** Size of the sandbox's private /tmp and of its /dev/shm (each a tmpfs, in memory), MiB. */
    tmpMB: z.number().int().min(1).default(256),
    /** Most bytes of stdout + stderr an episode may print before its sandbox is ended, MiB. */
    outputMB: z.number().int().min(1).default(64),
    /** More paths visible read-only (relative to the topology's directory): the system and the program's directory are. */
    readOnlyPaths: z.array(z.string().min(1)).default([]),
    /** Paths visible and writable besides the workdir and /tmp (relative to the topology's directory). */
    writablePaths: z.array(z.string().min(1)).default([]),
  })
  .strict();
/**
 * Schema of `train.agent.sandbox` (actors/environment/agent/sandbox.ts, docs/sandbox.md): the
 * confinement every agent and reward command runs in. Omitted: all defaults. `none` (written out)
 * runs them unconfined, as ooze's user, with a warning at start.
 */
export const sandboxSchema = z.union([z.literal("none"), sandboxOn]);

/** Schema of `train.agent.reward`: a command run in the episode's workdir after the agent exits. */
export const rewardCommandSchema = z
  .object({
    ...command,
    /** The reward command is killed (reward 0, recorded) after this many seconds. */
    timeoutS: z.number().positive().default(60),
  })
  .strict();

/** Schema of `train.agent`. */
export const agentSchema = z
  .object({
    ...command,
    /** Wall-clock limit of one episode; the agent's whole process group is killed after it (failed episode). */
    timeoutS: z.number().positive().default(120),
    /** Seconds between SIGTERM and SIGKILL of the process group on timeout. */
    killGraceS: z.number().min(0).default(2),
    /** Most chat requests one episode may make (the gateway refuses more). */
    maxTurns: z.number().int().min(1).default(8),
    /** Most tokens the model may sample over the episode (the gateway refuses requests after). */
    maxTokens: z.number().int().min(1).default(512),
    /**
     * Most samples (trajectory segments) one episode may yield: each episode owns this many sample
     * indices, so indices stay deterministic on redelivery. Segments past it are dropped, recorded.
     */
    maxSegments: z.number().int().min(1).max(1024).default(4),
    /** Reward from a command run in the workdir (exit 0 = 1, else 0; or the number on its last stdout line); else the task module's reward(). */
    reward: rewardCommandSchema.optional(),
    /** Keep each episode's temporary directory (workdir, transcript, agent output) for debugging; its path goes in the sample's metadata. */
    keepWorkdirs: z.boolean().default(false),
    /** The confinement of the agent and reward commands (on by default); `none` only when written out. */
    sandbox: sandboxSchema.default(() => sandboxOn.parse({})),
  })
  .strict();

/** The `train.agent` section, defaults filled in. */
export type AgentConfig = z.infer<typeof agentSchema>;
/** The `train.agent.sandbox` section, defaults filled in. */
export type SandboxConfig = z.infer<typeof sandboxSchema>;
/** The `train.agent.reward` section. */
export type RewardCommandConfig = z.infer<typeof rewardCommandSchema>;

/**
 * Sample indices a prompt owns: samplesPerPrompt episodes × maxSegments each with an agent, or ×
 * the task's roles (one context each), else samplesPerPrompt. The buffer hands out index ranges of this size per prompt group.
 */
export function slotsPerPrompt(train: { samplesPerPrompt: number; agent?: AgentConfig | undefined; roles?: Record<string, RoleConfig> | null }): number {
  return train.samplesPerPrompt * slotsPerEpisode(train);
}

/** Sample indices one episode owns: an agent's maxSegments, or one per role of a built-in task. */
export function slotsPerEpisode(train: { agent?: AgentConfig | undefined; roles?: Record<string, RoleConfig> | null }): number {
  return train.agent?.maxSegments ?? contextsPerEpisode(train);
}

/** Samples one episode of a built-in task may yield: each role's contexts (`train.roles`), else 1. */
export function contextsPerEpisode(train: { roles?: Record<string, RoleConfig> | null }): number {
  return Math.max(1, Object.values(train.roles ?? {}).reduce((n, r) => n + roleOf(r).contexts, 0));
}
