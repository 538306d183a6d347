// Owners of JetStream watches stop them before the bus closes, so a process that stopped its actors
// and closed its bus exits by itself (docs/reliability.md, finding 10). Each owner runs in a child
// process on a real nats-server (test/fixtures/watch-owner.ts) and is stopped while a JetStream
// request of its is in flight: the versions watch making its consumer again (nats.js arms a
// consumer's heartbeat timer before it subscribes, so a consumer made once the connection drains
// leaves that timer armed for good and the child never exits), the registry follower listing the
// engines bucket (a stream info: it makes no consumer since src/transport/stored.ts). The deadline
// only bounds a hang: the child exits in about a second.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { useNats, withDeadline } from "../harness/index.ts";

const nats = useNats();
const OWNER = fileURLToPath(new URL("../fixtures/watch-owner.ts", import.meta.url));

describe("a process whose watch owners stopped before its bus closed exits by itself", () => {
  for (const owner of ["follower", "versions"] as const) {
    it(`${owner === "follower" ? "the rollout's engine-registry follower" : "a VersionsKv watch"}, stopped while ${owner === "follower" ? "a pass lists the bucket" : "its consumer is being made"}`, async () => {
      const child = spawn(process.execPath, ["--import", "tsx", OWNER, nats.server.authUrl, `watch-${owner}`, owner], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      child.stdout.setEncoding("utf8").on("data", (s: string) => (out += s));
      child.stderr.setEncoding("utf8").on("data", (s: string) => (out += s));
      const exited = new Promise<number | string>((r) => child.on("exit", (code, signal) => r(code ?? String(signal))));
      const code = await withDeadline(exited, 45_000, `the ${owner} child to exit by itself`).catch((e: Error) => {
        child.kill("SIGKILL");
        throw new Error(`${e.message}\nchild output:\n${out}`);
      });
      expect(out, "the fault engaged: a JetStream API reply was held across the stop").toMatch(owner === "follower" ? /held the reply to \$JS\.API\.STREAM\.INFO\./ : /held the reply to \$JS\.API\.CONSUMER\./);
      expect(code, out).toBe(0);
    });
  }
});
