// The fleet in a process short of file descriptors (a real `ulimit -n`): the engine sockets' budget
// (src/engine/http.ts) keeps the process under its limit, so many generations at once wait for a
// socket and all complete; and where the budget is set past the limit, the EMFILE that follows is
// the process's own fault, so no engine leaves routing for it (found at 1,024 simulated engines,
// where every engine but one left and the last got every request: docs/experiments/scale.md).
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSimEngines, type SimEngines } from "../../src/engine/sim/sim-engines.ts";

const run = promisify(execFile);
const FIXTURE = fileURLToPath(new URL("../fixtures/fleet-fd-limit.ts", import.meta.url));
let engines: SimEngines;

beforeAll(async () => {
  engines = await startSimEngines({ count: 4 });
});
afterAll(async () => {
  await engines?.close();
});

/** Runs the fixture under `ulimit -n limit` with `env`; its JSON line. */
async function fleetUnder(limit: number, n: number, env: Record<string, string> = {}) {
  const { stdout } = await run("bash", ["-c", `ulimit -n ${limit} && exec "$0" --import tsx "$@"`, process.execPath, FIXTURE, String(n), ...engines.urls], {
    env: { ...process.env, ...env },
    timeout: 120_000,
  });
  return JSON.parse(stdout.trim().split("\n").at(-1)!) as { completed: number; failed: number; firstFailure: string | null; left: string[]; faults: Record<string, number> };
}

describe("a fleet short of file descriptors", () => {
  it("waits for sockets within its budget: 400 generations at once under ulimit -n 256 all complete, no engine leaves", async () => {
    const r = await fleetUnder(256, 400);
    expect(r).toMatchObject({ completed: 400, failed: 0, left: [] });
    expect(r.faults["local-limit"] ?? 0).toBe(0);
  });

  it("past the limit (the budget set too high), EMFILE counts as the process's own fault: every engine stays in routing", async () => {
    const r = await fleetUnder(256, 400, { OOZE_HTTP_MAX_SOCKETS: "5000" });
    expect(r.faults["local-limit"]).toBeGreaterThan(0); // the limit was hit
    expect(r.left).toEqual([]);
    expect(r.completed).toBe(400); // backed off and retried until sockets freed up
  });
});
