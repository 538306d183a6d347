// Agent sandbox benchmark: the per-episode cost of the sandbox (actors/environment/agent/sandbox.ts).
// One episode at a time through the real episode runner, gateway, fleet and a simulated engine
// server; what is timed is episode start (runAgentEpisode called: workdir, session, process) to the
// session's first model request reaching the fleet, for two agents — the `openai` SDK calculator
// example (a Node agent as users write them) and a one-line `curl` (the cheapest agent there is, so
// the sandbox's share is at its largest) — each with the default sandbox and with `sandbox: none`,
// the arms interleaved in rotating order. Progress goes to stderr; one JSON line is printed last.
// Usage: npm run bench -- agents [--episodes N] [--warmup W]
import { resolve } from "node:path";
import { runAgentEpisode, type SessionHost } from "../actors/environment/agent/episode.ts";
import { assertSandboxWorks } from "../actors/environment/agent/sandbox.ts";
import { loadAgentTask } from "../actors/environment/agent/task.ts";
import { agentSchema } from "../actors/protocol/agent-config.ts";
import { Fleet } from "../src/engine/fleet/fleet.ts";
import { startSimEngines } from "../src/engine/sim/sim-engines.ts";
import { Gateway, type Generator } from "../src/gateway/index.ts";

const args = process.argv.slice(2);
const opt = (name: string, d: number) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : d;
};
const episodes = opt("episodes", 20);
const warmup = opt("warmup", 3);
const log = (m: string) => process.stderr.write(`[bench agents] ${m}\n`);

assertSandboxWorks();
const examples = resolve(import.meta.dirname, "../examples/agents");
const engines = await startSimEngines({ count: 1 });
const fleet = new Fleet({ healthIntervalMs: 0, requestTimeoutMs: 30_000 });
await fleet.attach(engines.urls[0]!);
// The first generate call of each session is when its first request reached the fleet.
const firstRequest = new Map<string, number>();
const timed: Generator = {
  generate(req) {
    if (req.sessionId !== undefined && !firstRequest.has(req.sessionId)) firstRequest.set(req.sessionId, performance.now());
    return fleet.generate(req);
  },
  endSession: (id) => fleet.endSession?.(id),
};
const gateway = await Gateway.start({ fleet: timed, contextLength: 4096 });
let lastSession = "";
const sessions: SessionHost = {
  openSession: (s) => {
    const o = gateway.openSession(s);
    lastSession = o.id;
    return o;
  },
  closeSession: (id) => gateway.closeSession(id),
  listenSession: (id, path) => gateway.listenSession(id, path),
};
const task = await loadAgentTask("./calculator-task.ts", {}, examples);

const agents = {
  sdk: { command: process.execPath, args: [resolve(examples, "calculator-openai.mjs")] },
  curl: {
    command: "sh",
    args: ["-c", `curl -s -o /dev/null -H "authorization: Bearer $OPENAI_API_KEY" -H 'content-type: application/json' -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}' "$OPENAI_BASE_URL/chat/completions"`],
  },
} as const;
type Arm = { agent: keyof typeof agents; sandbox: boolean };
const arms: Arm[] = [
  { agent: "sdk", sandbox: false }, { agent: "sdk", sandbox: true },
  { agent: "curl", sandbox: false }, { agent: "curl", sandbox: true },
];
const times = new Map<string, number[]>(arms.map((a) => [key(a), []]));
function key(a: Arm): string {
  return `${a.agent}_${a.sandbox ? "sandbox" : "none"}`;
}

async function once(a: Arm, i: number): Promise<number> {
  const agent = agentSchema.parse({ ...agents[a.agent], maxTurns: 1, maxTokens: 32, timeoutS: 60, ...(a.sandbox ? {} : { sandbox: "none" }) });
  const t0 = performance.now();
  const samples = await runAgentEpisode({ sessions, task, agent, baseDir: examples }, { groupIndex: i, episode: 0, firstIndex: i * 4, seed: 0, temperature: 1, samplingSeed: i });
  const t1 = firstRequest.get(lastSession);
  if (t1 === undefined) throw new Error(`${key(a)}: the episode made no model request: ${JSON.stringify(samples[0]!.metadata)}`);
  return t1 - t0;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const pct = (xs: number[], p: number) => [...xs].sort((x, y) => x - y)[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;

try {
  for (let r = 0; r < warmup + episodes; r++) {
    // rotating order, so no arm always runs first (or right after another's process teardown)
    const order = arms.map((_, k) => arms[(k + r) % arms.length]!);
    for (const a of order) {
      const ms = await once(a, r);
      if (r >= warmup) times.get(key(a))!.push(ms);
    }
    if (r >= warmup && (r - warmup) % 5 === 4) log(`${r - warmup + 1}/${episodes} rounds: ${arms.map((a) => `${key(a)} p50 ${median(times.get(key(a))!).toFixed(1)} ms`).join(", ")}`);
  }
  const figures: Record<string, number> = {};
  for (const a of arms) {
    const xs = times.get(key(a))!;
    figures[`${key(a)}_p50_ms`] = +median(xs).toFixed(1);
    figures[`${key(a)}_p90_ms`] = +pct(xs, 0.9).toFixed(1);
  }
  const ratio = (agent: string) => +(figures[`${agent}_sandbox_p50_ms`]! / figures[`${agent}_none_p50_ms`]!).toFixed(3);
  const out = {
    bench: "agents", episodes, warmup,
    sdk_sandbox_vs_none: ratio("sdk"), curl_sandbox_vs_none: ratio("curl"),
    sdk_sandbox_added_ms: +(figures.sdk_sandbox_p50_ms! - figures.sdk_none_p50_ms!).toFixed(1),
    curl_sandbox_added_ms: +(figures.curl_sandbox_p50_ms! - figures.curl_none_p50_ms!).toFixed(1),
    ...figures,
    goal: "sdk_sandbox_vs_none <= 1.3",
  };
  console.log(JSON.stringify(out));
} finally {
  await gateway.close();
  await fleet.close();
  await engines.close();
}
