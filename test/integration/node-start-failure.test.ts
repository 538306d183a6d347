// A node whose actors fail to start (here: a kind that cannot be resolved, after one that could) rejects
// and leaves nothing behind in the process: its metrics server is closed (the port is free again) and no
// control subject answers for the host; a node started next, on the same port, runs.
import { createServer } from "node:net";
import { describe, expect, it } from "vitest";
import { defineActor } from "../../src/actor/index.ts";
import { OozeError } from "../../src/errors.ts";
import { nodeStatus, startNode } from "../../src/topology/node.ts";
import { parseTopology } from "../../src/topology/load.ts";
import { useNats } from "../harness/index.ts";

const nats = useNats();

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const ok = defineActor<null, unknown>({ name: "ok", init: () => null, handle: (s) => s });
const resolveKind = async (spec: { kind: string }) => {
  if (spec.kind === "test.ok") return ok;
  throw new OozeError("TOPOLOGY_INVALID", `no actor kind '${spec.kind}'`);
};

describe("startNode", () => {
  it("that fails to start its actors closes its metrics server and serves nothing", async () => {
    const bus = await nats.connect({ name: "node-start-failure" });
    const port = await freePort();
    const topology = (kinds: string[]) =>
      parseTopology([`name: node-fail`, `metrics: { port: ${port} }`, `actors: [${kinds.map((k, i) => `{ name: a${i}, kind: ${k} }`).join(", ")}]`].join("\n"));
    await expect(startNode({ topology: topology(["test.ok", "test.broken"]), host: "main", job: "nf1", bus, resolveKind, log: () => {} })).rejects.toThrow(/no actor kind 'test.broken'/);
    await expect(fetch(`http://127.0.0.1:${port}/metrics`)).rejects.toThrow();
    await expect(nodeStatus(bus, "nf1", "main", 1_000)).rejects.toThrow();
    const node = await startNode({ topology: topology(["test.ok"]), host: "main", job: "nf2", bus, resolveKind, log: () => {} });
    expect((await fetch(`http://127.0.0.1:${port}/metrics`)).status).toBe(200);
    expect((await nodeStatus(bus, "nf2", "main")).actors.map((a) => a.path)).toEqual(["a0"]);
    await node.stop();
    await bus.close();
  });
});
