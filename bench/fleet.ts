// Fleet benchmark (`npm run bench -- fleet [--engines N] [--sessions S] [--turns T] [--group G]
// [--concurrency C] [--cache T] [--preset NAME] [--rounds R]`): a multi-turn agent trace — many sessions, each
// re-sending its whole growing conversation every turn, sessions in groups that share a long system
// prompt (as GRPO groups do) — over N embedded engine servers (native backend), through the Fleet with
// each routing policy: round_robin (the baseline), least_load, and cache_aware with and without
// session affinity.
// Reports per policy the prefill tokens computed, the prefix-cache hit rate and requests/s, cache_aware's
// ratios against round_robin measured in the same run, the least prefill any routing could compute on
// the run's requests (one unbounded cache: what routing can at best reach; the trace sets it), and the
// time from attaching a fresh engine to its first completed request. Each policy runs R times (default
// 3), the policies taking turns, and the figures are the median run's: one pass lasts a second or two,
// and a single pass's ratio moved by ±0.2 between runs on this machine. Progress on stderr; one JSON
// line last on stdout.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createNativeBackend } from "../native/engine.ts";
import { initModelDir } from "../native/model-dir.ts";
import type { InferenceBackend } from "../src/engine/backend.ts";
import { Fleet } from "../src/engine/fleet/fleet.ts";
import { ApproxPrefixTree, type RoutingPolicy } from "../src/engine/fleet/router.ts";
import { startEngineServer, type EngineServer } from "../src/engine/server.ts";

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? Number(process.argv[i + 1]) : fallback;
}
function sarg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const engines = arg("engines", 4);
const sessions = arg("sessions", 32);
const turns = arg("turns", 8);
const group = arg("group", 4);
const systemLen = arg("system", 128);
const userLen = arg("user", 24);
const maxNew = arg("max-new", 16);
const concurrency = arg("concurrency", 16);
const cacheTokens = arg("cache", 4096);
const preset = sarg("preset", "quickstart");
const rounds = Math.max(1, arg("rounds", 3));
const log = (msg: string): void => void process.stderr.write(`[bench fleet] ${msg}\n`);

/** Deterministic token streams: a system prompt per group, user turns per session. */
function trace() {
  let s = 12345;
  // the LCG's high bits: its low 8 bits repeat every 256 draws, which made every session's turns
  // the same few sequences (sessions shared prefixes no real trace shares; until Nov 29)
  const tok = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 16) % 256;
  const systems = Array.from({ length: Math.ceil(sessions / group) }, () => Array.from({ length: systemLen }, tok));
  return Array.from({ length: sessions }, (_, i) => ({
    id: `s${i}`,
    system: systems[Math.floor(i / group)]!,
    users: Array.from({ length: turns }, () => Array.from({ length: userLen }, tok)),
  }));
}

interface PolicyFigures {
  /**
   * The least prefill any routing could compute for this run's requests: each request's tokens past
   * the longest prefix computed before it anywhere (one engine with an unbounded cache; a request's
   * prompt counts as computed once dispatched, its sampled tokens but the last once answered: the
   * last is never fed back, so the next turn computes it).
   */
  idealPrefillTokens: number;
  requests: number;
  promptTokens: number;
  prefillTokensComputed: number;
  hitRate: number;
  seconds: number;
  requestsPerSecond: number;
  /** Share of the pass an engine had no request at all (sampled every 2 ms; mean over engines). */
  engineIdleShare: number;
}

async function runPolicy(policy: RoutingPolicy, affinity: boolean, servers: EngineServer[], backends: InferenceBackend[]): Promise<PolicyFigures> {
  for (const b of backends) b.flushCache();
  const fleet = new Fleet({ routing: policy, healthIntervalMs: 60_000 });
  for (const s of servers) await fleet.attach(s.url);
  const work = trace();
  let prompt = 0;
  let cached = 0;
  let requests = 0;
  let ideal = 0;
  const seen = new ApproxPrefixTree();
  const computedBefore = (ids: number[]) => Math.max(0, ...seen.match(ids).values());
  let next = 0;
  let samples = 0;
  let idle = 0;
  const sampler = setInterval(() => {
    samples++;
    for (const b of backends) if (b.running() === 0) idle++;
  }, 2);
  const t0 = performance.now();
  // Each worker runs whole sessions turn by turn: a turn's prompt is the conversation so far.
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < work.length) {
        const sess = work[next++]!;
        let convo: number[] = [256, ...sess.system];
        for (const user of sess.users) {
          convo = [...convo, ...user];
          ideal += convo.length - computedBefore(convo);
          seen.insert(convo, "all");
          const r = await fleet.generate({
            inputIds: Int32Array.from(convo),
            sampling: { max_new_tokens: maxNew, ignore_eos: true, temperature: 0 },
            ...(affinity ? { sessionId: sess.id } : {}),
          });
          prompt += convo.length;
          cached += r.cachedTokens;
          requests++;
          convo = [...convo, ...r.outputIds];
          if (r.outputIds.length > 1) seen.insert(convo.slice(0, -1), "all");
        }
        if (affinity) fleet.endSession(sess.id);
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  clearInterval(sampler);
  await fleet.close();
  return { idealPrefillTokens: ideal, requests, promptTokens: prompt, prefillTokensComputed: prompt - cached, hitRate: cached / prompt, seconds, requestsPerSecond: requests / seconds, engineIdleShare: samples > 0 ? idle / (samples * backends.length) : 0 };
}

/** Attaches one more engine to a fleet and times until its first request completes. */
async function attachToFirstRequest(url: string): Promise<number> {
  const fleet = new Fleet({ routing: "round_robin", healthIntervalMs: 60_000 });
  const t0 = performance.now();
  await fleet.attach(url);
  await fleet.generate({ inputIds: Int32Array.from([256, 1, 2, 3]), sampling: { max_new_tokens: 1, temperature: 0 } });
  const ms = performance.now() - t0;
  await fleet.close();
  return ms;
}

const dir = mkdtempSync(join(tmpdir(), "ooze-bench-fleet-"));
const backends: InferenceBackend[] = [];
const servers: EngineServer[] = [];
try {
  await initModelDir(preset, dir, 1);
  for (let i = 0; i < engines; i++) {
    const backend = createNativeBackend({ modelDir: dir, cacheTokens });
    backends.push(backend);
    servers.push(await startEngineServer({ backend }));
  }
  log(`${engines} engines (${preset}, KV ${cacheTokens} tokens each); ${sessions} sessions × ${turns} turns, groups of ${group} sharing a ${systemLen}-token system prompt, ${userLen} user + ${maxNew} sampled tokens per turn, concurrency ${concurrency}`);
  // The baselines route each request on their own (no session ids); cache_aware runs as ooze's rollout
  // uses it, with session affinity, and also without it (the prefix tree alone).
  const runs: [string, RoutingPolicy, boolean][] = [
    ["round_robin", "round_robin", false],
    ["least_load", "least_load", false],
    ["cache_aware", "cache_aware", true],
    ["cache_aware_no_affinity", "cache_aware", false],
  ];
  const passes: Record<string, PolicyFigures[]> = Object.fromEntries(runs.map(([name]) => [name, []]));
  const ratios: number[] = [];
  for (let round = 1; round <= rounds; round++) {
    for (const [name, policy, affinity] of runs) {
      const f = await runPolicy(policy, affinity, servers, backends);
      passes[name]!.push(f);
      log(`round ${round}/${rounds} ${name}: ${f.prefillTokensComputed} prefill tokens computed (the least any routing could: ${f.idealPrefillTokens}), hit rate ${(f.hitRate * 100).toFixed(1)}%, ${f.requestsPerSecond.toFixed(2)} req/s, engines idle ${(f.engineIdleShare * 100).toFixed(1)}%`);
    }
    ratios.push(passes.cache_aware!.at(-1)!.requestsPerSecond / passes.round_robin!.at(-1)!.requestsPerSecond);
  }
  // each policy's median pass by requests/s (its prefill counts come from that same pass)
  const median = (xs: PolicyFigures[]) => [...xs].sort((a, b) => a.requestsPerSecond - b.requestsPerSecond)[Math.floor(xs.length / 2)]!;
  const figures: Record<string, PolicyFigures> = Object.fromEntries(Object.entries(passes).map(([k, v]) => [k, median(v)]));
  const attachMs = await attachToFirstRequest(servers[0]!.url);
  log(`attach → first request: ${attachMs.toFixed(1)} ms`);
  const rr = figures.round_robin!;
  const ca = figures.cache_aware!;
  const r3 = (x: number) => Number(x.toFixed(3));
  console.log(
    JSON.stringify({
      bench: "fleet",
      engines,
      preset,
      sessions,
      turns,
      concurrency,
      rounds,
      round_robin: rr,
      least_load: figures.least_load,
      cache_aware: ca,
      cache_aware_no_affinity: figures.cache_aware_no_affinity,
      cache_aware_prefill_vs_round_robin: r3(ca.prefillTokensComputed / rr.prefillTokensComputed),
      cache_aware_throughput_vs_round_robin: r3(ca.requestsPerSecond / rr.requestsPerSecond),
      // each round's ratio (cache_aware's pass against the round_robin pass just before it)
      cache_aware_throughput_vs_round_robin_rounds: ratios.map(r3),
      cache_aware_hit_rate_vs_round_robin: rr.hitRate > 0 ? r3(ca.hitRate / rr.hitRate) : null,
      // against the least any routing could compute on this trace (1.0 = nothing left to gain by routing)
      cache_aware_prefill_vs_ideal: r3(ca.prefillTokensComputed / ca.idealPrefillTokens),
      round_robin_prefill_vs_ideal: r3(rr.prefillTokensComputed / rr.idealPrefillTokens),
      cache_aware_no_affinity_prefill_vs_round_robin: r3(figures.cache_aware_no_affinity!.prefillTokensComputed / rr.prefillTokensComputed),
      attach_to_first_request_ms: r3(attachMs),
    }),
  );
} finally {
  for (const s of servers) await s.close();
  for (const b of backends) b.close();
  rmSync(dir, { recursive: true, force: true });
}
