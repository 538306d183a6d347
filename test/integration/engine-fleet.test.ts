// Router + EngineClient over two real embedded engine servers (native tiny models): sessions keep
// their engine across turns and hit its prefix cache; cache-aware routing without keys follows the
// shared prefix; removing an engine moves its sessions to the other one.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createNativeBackend } from "../../native/engine.ts";
import { initModelDir } from "../../native/model-dir.ts";
import type { InferenceBackend } from "../../src/engine/backend.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { Router } from "../../src/engine/fleet/router.ts";
import { startEngineServer, type EngineServer } from "../../src/engine/server.ts";

let dir: string;
const backends: InferenceBackend[] = [];
const servers: EngineServer[] = [];
const clients = new Map<string, EngineClient>();

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "ooze-fleet-"));
  await initModelDir("tiny", dir, 3);
  for (let i = 0; i < 2; i++) {
    const backend = createNativeBackend({ modelDir: dir });
    const server = await startEngineServer({ backend, weightVersion: "v1" });
    backends.push(backend);
    servers.push(server);
    clients.set(server.url, new EngineClient(server.url, { retries: 0 }));
  }
});
afterAll(async () => {
  for (const s of servers) await s.close();
  for (const b of backends) b.close();
  rmSync(dir, { recursive: true, force: true });
});

async function turn(router: Router, ids: number[], key?: string) {
  const url = router.route(key === undefined ? { inputIds: ids } : { inputIds: ids, routingKey: key });
  try {
    const r = await clients.get(url)!.generate({ inputIds: ids, sampling: { max_new_tokens: 4, ignore_eos: true }, returnLogprob: true, ...(key ? { routingKey: key } : {}) });
    return { url, r };
  } finally {
    router.release(url);
  }
}

describe("fleet: Router over real engine servers", () => {
  it("multi-turn sessions stay on one engine and reuse its prefix cache", async () => {
    const router = new Router({ policy: "round_robin" });
    for (const s of servers) router.addEngine(s.url);
    const sessions = await Promise.all(
      [0, 1, 2, 3].map(async (s) => {
        let ids = [256, 10 + s, 20 + s, 30 + s];
        const urls: string[] = [];
        const cached: number[] = [];
        for (let t = 0; t < 3; t++) {
          const { url, r } = await turn(router, ids, `episode-${s}`);
          urls.push(url);
          cached.push(r.meta.cachedTokens);
          ids = [...ids, ...r.outputIds, 40 + t]; // model turn, then an observation token
        }
        return { urls, cached };
      }),
    );
    for (const s of sessions) {
      expect(new Set(s.urls).size).toBe(1);
      expect(s.cached[1]).toBeGreaterThan(0);
      expect(s.cached[2]).toBeGreaterThan(s.cached[1]!);
    }
    expect(new Set(sessions.map((s) => s.urls[0])).size).toBe(2); // round-robin spread the sessions
  });

  it("cache-aware routing without keys follows the shared prefix; removal moves traffic", async () => {
    const router = new Router({ policy: "cache_aware" });
    for (const s of servers) router.addEngine(s.url);
    const prefix = Array.from({ length: 40 }, (_, i) => (i * 7) % 256);
    const a = await turn(router, [...prefix, 1]);
    const b = await turn(router, [...prefix, 2]);
    expect(b.url).toBe(a.url);
    expect(b.r.meta.cachedTokens).toBeGreaterThanOrEqual(prefix.length);
    const other = await turn(router, Array.from({ length: 40 }, (_, i) => 100 + i));
    expect(other.url).not.toBe(a.url); // no match → the engine with the smaller tree
    router.removeEngine(a.url);
    const c = await turn(router, [...prefix, 3]);
    expect(c.url).not.toBe(a.url);
  });
});
