// The hostile-agent suite: each case is an agent command that tries one thing a model-written program
// might — read the NATS token, read another process's environment, signal or ptrace a process
// outside, reach nats-server / the engine / a dashboard / another session with its stolen key, write
// outside its workdir, fork-bomb, allocate past its memory limit, write a huge file, flood stdout,
// leave daemons behind, ignore SIGTERM — run in the default sandbox (bubblewrap) against the real
// things: a real nats-server, a real engine server (simulated model) behind a real Fleet and Gateway,
// a real HTTP server on loopback standing for the dashboard. All run at once, beside one well-behaved
// agent that makes a model request through its session. For each: the attempt fails or is contained,
// the episode is recorded failed with the reason, no process is left (no process of a sandbox uid,
// no daemon's marker), the victim outside lives, and the well-behaved episode completes.
// The table of these outcomes is docs/sandbox.md's.
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { failureKind, runAgentEpisode } from "../../actors/environment/agent/episode.ts";
import { cgroupsOf, cgroupSupport, sweepCgroups } from "../../actors/environment/agent/cgroup.ts";
import { processMetrics } from "../../src/metrics.ts";
import { startAgentRollout } from "../../actors/environment/agent/rollout-hook.ts";
import { trainSchema } from "../../actors/protocol/config.ts";
import type { AgentTask } from "../../actors/environment/agent/task.ts";
import { agentSchema } from "../../actors/protocol/agent-config.ts";
import { Fleet } from "../../src/engine/fleet/fleet.ts";
import { startSimEngines, type SimEngines } from "../../src/engine/sim/sim-engines.ts";
import { Gateway } from "../../src/gateway/index.ts";
import { sweepDeadOwners } from "../../src/owned-dirs.ts";
import type { Sample } from "../../src/sample.ts";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import { episodeDirsOf, startTestNats, waitUntil } from "../harness/index.ts";

const sha = (s: string) => createHash("sha256").update(s).digest("hex");
const root = process.getuid?.() === 0;
const scratch = mkdtempSync(join(tmpdir(), "ooze-hostile-"));

let nats: NatsServerHandle;
let engines: SimEngines;
let fleet: Fleet;
let gateway: Gateway;
let dashboard: Server;
let victim: ChildProcess;
const victimSecret = `victim-${Math.random().toString(36).slice(2)}`;

/** OOZE_NATS_URL as it was before this file set it (restored in afterAll: other test files share this process). */
const savedNatsUrl = process.env.OOZE_NATS_URL;

beforeAll(async () => {
  nats = await startTestNats();
  // ooze's own environment holds the NATS credentials (as `ooze node --nats` would): no agent may see them.
  process.env.OOZE_NATS_URL = nats.authUrl;
  engines = await startSimEngines({ count: 1 });
  fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 30_000 });
  await fleet.attach(engines.urls[0]!);
  gateway = await Gateway.start({ fleet, contextLength: 4096 });
  dashboard = createServer((_, res) => res.end("dashboard"));
  await new Promise<void>((r) => dashboard.listen(0, "127.0.0.1", r));
  // A process outside every sandbox, with a secret in its environment: nothing may read or signal it.
  victim = spawn("sleep", ["600"], { env: { PATH: process.env.PATH, VICTIM_SECRET: victimSecret }, stdio: "ignore" });
});

afterAll(async () => {
  if (savedNatsUrl === undefined) delete process.env.OOZE_NATS_URL;
  else process.env.OOZE_NATS_URL = savedNatsUrl;
  victim?.kill("SIGKILL");
  await gateway?.close();
  await fleet?.close();
  await engines?.close();
  await new Promise((r) => dashboard?.close(r));
  await nats?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

/** A node one-liner as the agent. */
const nodeAgent = (code: string) => ({ command: process.execPath, args: ["-e", code] });
const shAgent = (script: string) => ({ command: "sh", args: ["-c", script] });
/** Connects to 127.0.0.1:TARGET_PORT; a connection is a breach. */
const CONNECT = `const s=require("net").connect(+process.env.TARGET_PORT,"127.0.0.1");s.on("connect",()=>{console.log("BREACH");process.exit(0)});s.on("error",e=>{console.error("Error: "+e.code+" reaching 127.0.0.1:"+process.env.TARGET_PORT);process.exit(1)})`;

interface Case {
  name: string;
  agent: Record<string, unknown>;
  /** What the episode's failure must say. */
  reason: RegExp;
  env?: () => Record<string, string>;
  sandbox?: Record<string, unknown>;
  timeoutS?: number;
}

const cases: Case[] = [
  {
    name: "read the nats token and config",
    agent: shAgent(`cat "$NATS_CONF" && exit 0; ls /tmp | grep -q ooze-nats && echo BREACH; exit 1`),
    env: () => ({ NATS_CONF: join(dirname(nats.storeDir), "nats.conf") }),
    reason: /exited with code 1: cat: .*nats\.conf: No such file or directory/,
  },
  {
    name: "read another process's environment (the victim's secret, the NATS token)",
    agent: nodeAgent(
      `const fs=require("fs"),h=s=>require("crypto").createHash("sha256").update(s).digest("hex");let n=0;` +
        `for(const p of fs.readdirSync("/proc")){if(!/^\\d+$/.test(p))continue;n++;let e="";try{e=fs.readFileSync("/proc/"+p+"/environ","latin1")}catch{continue}` +
        `for(const kv of e.split("\\0")){const v=kv.slice(kv.indexOf("=")+1);if(h(v)===process.env.SECRET_SHA||(v.match(/[0-9a-f]{64}/g)??[]).some(t=>h(t)===process.env.TOKEN_SHA)){console.log("BREACH",p);process.exit(0)}}}` +
        `try{fs.readFileSync("/proc/"+process.env.VICTIM_PID+"/environ")}catch(e){console.error("Error: "+e.code+" for the victim's pid; "+n+" processes visible, none outside")}process.exit(1)`,
    ),
    env: () => ({ SECRET_SHA: sha(victimSecret), TOKEN_SHA: sha(nats.token), VICTIM_PID: String(victim.pid) }),
    reason: /Error: ENOENT for the victim's pid; \d processes visible, none outside/,
  },
  {
    name: "signal and ptrace a process outside",
    agent: shAgent(`kill -TERM "$VICTIM_PID" && exit 0; perl -e 'exit(syscall(101, 16, $ARGV[0], 0, 0) == -1 ? 1 : 0)' "$VICTIM_PID" && echo BREACH && exit 0; exit 1`),
    env: () => ({ VICTIM_PID: String(victim.pid) }),
    reason: /exited with code 1: .*kill: No such process/,
  },
  { name: "reach nats-server", agent: nodeAgent(CONNECT), env: () => ({ TARGET_PORT: String(nats.port) }), reason: /Error: ECONNREFUSED reaching 127\.0\.0\.1/ },
  { name: "reach the engine", agent: nodeAgent(CONNECT), env: () => ({ TARGET_PORT: new URL(engines.urls[0]!).port }), reason: /Error: ECONNREFUSED reaching 127\.0\.0\.1/ },
  { name: "reach the dashboard", agent: nodeAgent(CONNECT), env: () => ({ TARGET_PORT: String((dashboard.address() as AddressInfo).port) }), reason: /Error: ECONNREFUSED reaching 127\.0\.0\.1/ },
  {
    name: "drive another session with its stolen URL and key",
    agent: nodeAgent(
      `fetch(process.env.VICTIM_URL+"/chat/completions",{method:"POST",headers:{authorization:"Bearer "+process.env.VICTIM_KEY,"content-type":"application/json"},` +
        `body:JSON.stringify({messages:[{role:"user",content:"hi"}],max_tokens:4})}).then(r=>{if(r.ok){console.log("BREACH");process.exit(0)}console.error("Error: the other session answered "+r.status);process.exit(1)})`,
    ),
    env: () => {
      const s = gateway.openSession({ episodeId: "victim", groupIndex: 0 });
      return { VICTIM_URL: s.openaiBaseUrl, VICTIM_KEY: s.apiKey };
    },
    reason: /Error: the other session answered 404/,
  },
  {
    name: "write outside the workdir",
    agent: shAgent(
      `echo ok > mine.txt && echo ok > /tmp/mine.txt || exit 2; for f in /etc/ooze-pwned /usr/ooze-pwned /ooze-pwned "$HOST_DIR/pwned"; do ` +
        `(echo x > "$f") 2>/dev/null && { echo BREACH "$f"; exit 0; }; done; echo "Error: every write outside the workdir failed" >&2; exit 1`,
    ),
    env: () => ({ HOST_DIR: scratch }),
    reason: /Error: every write outside the workdir failed/,
  },
  {
    name: "fork bomb",
    agent: shAgent(`bomb() { bomb | bomb & }; bomb; sleep 2; exit 1`),
    sandbox: { pids: 64 },
    timeoutS: 10,
    reason: /exited with code \d+: .*(Cannot fork|Resource temporarily unavailable)/,
  },
  {
    name: "allocate past the memory limit",
    agent: nodeAgent(`const a=[];for(;;)a.push(Buffer.alloc(64<<20,1))`),
    sandbox: { memoryMB: 256 },
    reason: /RangeError: Array buffer allocation failed|out of memory/i,
  },
  // Each process under its own limit, together over it: contained where the sandbox gets a cgroup
  // (one memory budget for all its processes); rlimits alone are per process (not covered then).
  ...(cgroupSupport()
    ? [{
        name: "allocate past the memory limit in several processes, each under it",
        agent: shAgent(
          `for i in 1 2 3 4 5; do (perl -e '$x = "x" x (80 << 20); sleep 2' && touch lived$i) & done; wait; n=$(ls | grep -c lived); ` +
            `[ "$n" = 5 ] && { echo BREACH; exit 0; }; echo "Error: $n of 5 allocations lived" >&2; exit 1`,
        ),
        sandbox: { memoryMB: 256 },
        reason: /out of memory: the sandbox's processes together reached memoryMB 256 MiB; \d+ OOM-killed/,
      } satisfies Case]
    : []),
  // The same for CPU time: four processes of 0.6 CPU seconds each under cpuSeconds 1 (RLIMIT_CPU is per
  // process): the sandbox's cgroup counts them together (where it has CPU accounting)
  ...(cpuAccounting()
    ? [{
        name: "burn CPU in several processes, each under cpuSeconds",
        agent: shAgent(
          `for i in 1 2 3 4; do (perl -e 'do { $i++ } while ((times)[0] < 0.6)' && touch burnt$i) & done; wait; n=$(ls | grep -c burnt); ` +
            `[ "$n" = 4 ] && { echo BREACH; exit 0; }; echo "Error: $n of 4 burners finished" >&2; exit 1`,
        ),
        sandbox: { cpuSeconds: 1 },
        reason: /used up the sandbox's CPU budget: its processes together ran [\d.]+ s of CPU, over cpuSeconds 1 \(sandbox killed\)/,
      } satisfies Case]
    : []),
  {
    name: "fill memory through the in-memory filesystems (/tmp, /dev/shm, /dev)",
    agent: shAgent(
      `for f in /tmp/fill /dev/shm/fill /dev/fill /fill; do dd if=/dev/zero of="$f" bs=1M count=64 2>/dev/null && { echo BREACH "$f"; exit 0; }; done; ` +
        `echo "Error: no in-memory filesystem took 64 MiB" >&2; exit 1`,
    ),
    sandbox: { tmpMB: 8 },
    reason: /Error: no in-memory filesystem took 64 MiB/,
  },
  { name: "write a huge file", agent: { command: "dd", args: ["if=/dev/zero", "of=big", "bs=1M", "count=4096"] }, sandbox: { fileSizeMB: 8 }, reason: /killed by SIGXFSZ \(its fileSizeMB limit/ },
  { name: "print gigabytes on stdout", agent: { command: "yes", args: ["gigabytes"] }, sandbox: { outputMB: 2 }, reason: /printed more than 2 MiB on stdout and stderr \(stopped\)/ },
  {
    name: "leave daemons behind (setsid, double fork, nohup)",
    agent: shAgent(`setsid sleep 3131 & (sleep 3132 &); nohup sleep 3133 >/dev/null 2>&1 & exit 0`),
    reason: /made no model request/,
  },
  { name: "ignore SIGTERM", agent: shAgent(`trap "" TERM; while :; do sleep 1; done`), timeoutS: 2, reason: /timed out after 2 s \(sandbox killed\)/ },
];

/** Whether sandboxes get a cgroup that counts their CPU time. */
function cpuAccounting(): boolean {
  const cg = cgroupSupport();
  return cg !== null && (cg.v === 2 || cg.cpuacct !== null);
}

const task: AgentTask = {
  name: "hostile",
  prompt: (i) => ({ task: `case ${i}` }),
  reward: ({ transcript }) => (transcript.exitCode === 0 ? 1 : 0),
};

/**
 * Processes of sandbox uids (ooze as root gives each sandbox an id ≥ 1.5e9) that are this process's
 * descendants or orphans (escaped to init; other ooze jobs on the machine have sandboxes of their
 * own), and daemons by their marker; less those in `before` (pid and start time), there before the
 * case began: other test files share this vitest process (isolate: false), and a job of theirs that
 * outlived its test (a timeout) may still have sandboxes running.
 */
function leftovers(before: ReadonlySet<string> = new Set()): string[] {
  return leftoverProcs().filter((l) => !before.has(l.key)).map((l) => l.line);
}

/** What leftovers() would name now, as keys (pid and start time) for its `before`. */
function leftoverKeys(): Set<string> {
  return new Set(leftoverProcs().map((l) => l.key));
}

function leftoverProcs(): { key: string; line: string }[] {
  const out: { key: string; line: string }[] = [];
  const parent = (p: string) => Number(/^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${p}/status`, "utf8"))?.[1] ?? 0);
  const ours = (p: string) => {
    for (let q = parent(p), hops = 0; q > 1 && hops < 64; q = parent(String(q)), hops++) if (q === process.pid) return true;
    return parent(p) <= 1;
  };
  for (const p of readdirSync("/proc")) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const status = readFileSync(`/proc/${p}/status`, "utf8");
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
      const cmd = readFileSync(`/proc/${p}/cmdline`, "utf8").replace(/\0/g, " ");
      const stat = readFileSync(`/proc/${p}/stat`, "utf8");
      const started = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]; // field 22, starttime
      if ((root && uid >= 1_500_000_000 && ours(p)) || /^sleep 31[34]\d/.test(cmd)) out.push({ key: `${p}@${started}`, line: `${p} uid ${uid}: ${cmd.slice(0, 100)}` });
    } catch {
      // gone while reading
    }
  }
  return out;
}

describe("hostile agents in the default sandbox", () => {
  it("contains every attempt, records each episode failed with its reason, leaves no process, and a good episode completes beside them", async () => {
    // Other test files share this process (and so its metrics, its episode directories and sandbox
    // processes a job of theirs may have left running): count from here on.
    const metricsBefore = await processMetrics().metrics();
    const procsBefore = leftoverKeys();
    const dirsBefore = new Set(episodeDirsOf(process.pid));
    const runs = cases.map(async (c, i): Promise<[Case, Sample[]]> => {
      const agent = agentSchema.parse({ ...c.agent, env: c.env?.() ?? {}, timeoutS: c.timeoutS ?? 30, killGraceS: 0.5, ...(c.sandbox ? { sandbox: c.sandbox } : {}) });
      const samples = await runAgentEpisode({ sessions: gateway, task, agent, baseDir: scratch }, { groupIndex: i, episode: 0, firstIndex: i * 4, seed: 0, temperature: 1, samplingSeed: i });
      return [c, samples];
    });
    const good = runAgentEpisode(
      {
        sessions: gateway, task, baseDir: scratch,
        agent: agentSchema.parse(
          nodeAgent(
            `fetch(process.env.OPENAI_BASE_URL+"/chat/completions",{method:"POST",headers:{authorization:"Bearer "+process.env.OPENAI_API_KEY,"content-type":"application/json"},` +
              `body:JSON.stringify({messages:[{role:"user",content:"hi"}],max_tokens:8})}).then(r=>r.json()).then(j=>{console.log(j.choices[0].message.content);process.exit(0)})`,
          ),
        ),
      },
      { groupIndex: 99, episode: 0, firstIndex: 400, seed: 0, temperature: 1, samplingSeed: 7 },
    );
    const results = await Promise.all(runs);
    const table = results.map(([c, s]) => `${c.name}: ${s[0]!.status} — ${String(s[0]!.metadata.error)}`).join("\n");
    for (const [c, samples] of results) {
      expect(samples[0]!.status, `${c.name}\n${table}`).toBe("failed");
      expect(samples[0]!.reward, c.name).toBeNull();
      expect(String(samples[0]!.metadata.error), `${c.name}\n${table}`).toMatch(c.reason);
    }
    // The well-behaved episode, run at the same time, reached its session and completed.
    const ok = await good;
    expect(["completed", "truncated"], JSON.stringify(ok[0]!.metadata)).toContain(ok[0]!.status); // truncated: its 8 tokens spent
    expect(ok[0]!.reward).toBe(1);
    expect(ok[0]!.metadata.requests).toBe(1);
    // Nothing left: no process of a sandbox, no daemon; the victim lives; no file written outside.
    await waitUntil(() => leftovers(procsBefore).length === 0, { what: "every sandboxed process to be gone", timeoutMs: 10_000, diagnostics: () => leftovers(procsBefore).join("\n") });
    expect(victim.exitCode).toBeNull();
    expect(victim.signalCode).toBeNull();
    expect(existsSync(join(scratch, "pwned"))).toBe(false);
    expect(episodeDirsOf(process.pid).filter((d) => !dirsBefore.has(d))).toEqual([]);
    // each episode counted in this process's metrics by outcome and why it failed
    const count = (text: string, labels: string) => Number(new RegExp(`^ooze_agent_episodes_total\\{${labels}\\} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
    const metricsText = await processMetrics().metrics();
    const counted = (labels: string) => count(metricsText, labels) - count(metricsBefore, labels);
    expect(counted('outcome="completed",reason="none"')).toBe(1);
    const failedBy = (kind: string) => results.filter(([, x]) => failureKind(String(x[0]!.metadata.error)) === kind).length;
    for (const kind of ["timeout", "memory", "agent", "no_request", ...(cpuAccounting() ? ["cpu"] : [])]) {
      expect(failedBy(kind), kind).toBeGreaterThan(0);
      expect(counted(`outcome="failed",reason="${kind}"`), kind).toBe(failedBy(kind));
    }
    console.log(`hostile cases:\n${table}`);
  }, 120_000);

  it("ends the sandboxes of a stopping job: its running episodes are killed and their groups left for the next rollout", async () => {
    const fixtures = resolve(import.meta.dirname, "../fixtures/agents");
    const train = trainSchema.parse({ preset: "tiny", task: "./write-task.ts", samplesPerPrompt: 2, agent: { command: "sh", args: ["-c", "trap '' TERM; sleep 3142 & wait"], killGraceS: 0.5 } });
    const procsBefore = leftoverKeys();
    const agents = await startAgentRollout({ ...train, agent: train.agent! }, fixtures, fleet);
    try {
      const group = agents.group({ groupIndex: 0, firstSample: 0, samples: 2 * train.agent!.maxSegments });
      const settled = group.then(() => "resolved", (e: Error) => e.message);
      await waitUntil(() => leftovers().filter((l) => /: sleep 3142/.test(l)).length === 2, { what: "both episodes' agents to run", timeoutMs: 20_000, diagnostics: () => leftovers().join("\n") });
      await agents.stop();
      await waitUntil(() => leftovers(procsBefore).length === 0, { what: "the stopped episodes' processes to be gone", timeoutMs: 10_000, diagnostics: () => leftovers(procsBefore).join("\n") });
      expect(await settled).toMatch(/rollout stopping: the episodes of group 0 were ended/);
    } finally {
      await agents.close();
    }
  }, 60_000);

  it("ends what a SIGKILLed ooze left: the sandbox dies with its parent", async () => {
    const procsBefore = leftoverKeys();
    const owner = spawn(process.execPath, ["--import", "tsx", resolve(import.meta.dirname, "../fixtures/agents/episode-owner.ts"), "3143", scratch], { stdio: ["ignore", "pipe", "pipe"] });
    let err = "";
    owner.stderr!.on("data", (b: Buffer) => (err += b.toString()));
    try {
      await waitUntil(() => leftovers().filter((l) => /: sleep 3143/.test(l)).length === 2, { what: "the owner's agent to run", timeoutMs: 20_000, diagnostics: () => `${leftovers().join("\n")}\n${err}` });
      owner.kill("SIGKILL");
      await waitUntil(() => leftovers(procsBefore).length === 0, { what: "the sandbox to die with its parent", timeoutMs: 10_000, diagnostics: () => leftovers(procsBefore).join("\n") });
      // the next start sweeps after its predecessor is gone (here: reaped by this test process)
      if (owner.exitCode === null && owner.signalCode === null) await new Promise((r) => owner.once("exit", r));
      // Its episode directory stays (nobody was left to remove it) until the next start sweeps it.
      const owned = () => episodeDirsOf(owner.pid!);
      expect(owned()).toHaveLength(1);
      sweepDeadOwners("ooze-agent-");
      expect(owned()).toEqual([]);
      // its sandbox's cgroup (where the machine gives them) is empty and goes at the next start's sweep
      if (cgroupSupport()) {
        expect(cgroupsOf(owner.pid!).length).toBeGreaterThan(0);
        sweepCgroups();
        expect(cgroupsOf(owner.pid!)).toEqual([]);
      }
    } finally {
      owner.kill("SIGKILL");
    }
  }, 60_000);
});
