// Fleet benchmark (`npm run bench -- fleet [--engines N] [--groups G] [--per-group M] [--prefix P]
// [--concurrency C] [--cache T] [--preset NAME]`): embedded engine servers over the native backend,
// a workload of prompt groups sharing long prefixes (as GRPO groups do), routed by round_robin
// (the baseline), least_load and cache_aware. Reports each policy's prefix-cache hit rate and
// throughput, and cache_aware's ratios against round_robin, measured in the same run.
// Progress on stderr; one JSON line last on stdout.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createNativeBackend } from "../native/engine.ts";
import { initModelDir } from "../native/model-dir.ts";
import type { InferenceBackend } from "../src/engine/backend.ts";
import { EngineClient } from "../src/engine/client.ts";
import { Router, type RoutingPolicy } from "../src/engine/router.ts";
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
const groups = arg("groups", 8);
const perGroup = arg("per-group", 8);
const prefixLen = arg("prefix", 300);
const concurrency = arg("concurrency", 8);
const cacheTokens = arg("cache", 1024);
const maxNew = arg("max-new", 8);
const preset = sarg("preset", "quickstart");
const log = (msg: string): void => void process.stderr.write(`[bench fleet] ${msg}\n`);

/** Deterministic workload: groups × perGroup prompts (shared prefix + own suffix), shuffled. */
function workload(): number[][] {
  let s = 12345;
  const rnd = () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32);
  const out: number[][] = [];
  for (let g = 0; g < groups; g++) {
    const prefix = Array.from({ length: prefixLen }, () => Math.floor(rnd() * 256));
    for (let m = 0; m < perGroup; m++) out.push([256, ...prefix, ...Array.from({ length: 16 }, () => Math.floor(rnd() * 256))]);
  }
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

interface PolicyFigures {
  hitRate: number;
  seconds: number;
  requestsPerSecond: number;
  prefillTokensComputed: number;
}

async function runPolicy(policy: RoutingPolicy, servers: EngineServer[], backends: InferenceBackend[], prompts: number[][]): Promise<PolicyFigures> {
  for (const b of backends) b.flushCache();
  const router = new Router({ policy });
  const clients = new Map(servers.map((s) => [s.url, new EngineClient(s.url)]));
  for (const s of servers) router.addEngine(s.url);
  let next = 0;
  let prompt = 0;
  let cached = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < prompts.length) {
        const ids = prompts[next++]!;
        const url = router.route({ inputIds: ids });
        try {
          const r = await clients.get(url)!.generate({ inputIds: ids, sampling: { max_new_tokens: maxNew, ignore_eos: true, temperature: 0 } });
          prompt += r.meta.promptTokens;
          cached += r.meta.cachedTokens;
        } finally {
          router.release(url);
        }
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  return { hitRate: cached / prompt, seconds, requestsPerSecond: prompts.length / seconds, prefillTokensComputed: prompt - cached };
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
  const prompts = workload();
  log(`${engines} engines (${preset}, KV ${cacheTokens} tokens each), ${prompts.length} requests in ${groups} groups, prefix ${prefixLen}, concurrency ${concurrency}`);
  const figures: Record<string, PolicyFigures> = {};
  for (const policy of ["round_robin", "least_load", "cache_aware"] as RoutingPolicy[]) {
    figures[policy] = await runPolicy(policy, servers, backends, prompts);
    log(`${policy}: hit rate ${(figures[policy]!.hitRate * 100).toFixed(1)}%, ${figures[policy]!.requestsPerSecond.toFixed(2)} req/s`);
  }
  const rr = figures.round_robin!;
  const ca = figures.cache_aware!;
  console.log(
    JSON.stringify({
      bench: "fleet",
      engines,
      preset,
      requests: prompts.length,
      policies: figures,
      cacheAwareHitRateVsRoundRobin: rr.hitRate > 0 ? ca.hitRate / rr.hitRate : null,
      cacheAwareThroughputVsRoundRobin: ca.requestsPerSecond / rr.requestsPerSecond,
    }),
  );
} finally {
  for (const s of servers) await s.close();
  for (const b of backends) b.close();
  rmSync(dir, { recursive: true, force: true });
}
