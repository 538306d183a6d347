// The embedded nats-server: start/stop/kill/restart, the early-exit race, the missing-binary error,
// and no orphan server after its parent exits, is SIGTERMed, or is SIGKILLed.
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { OozeError } from "../../src/errors.ts";
import { connectBus } from "../../src/transport/bus.ts";
import { findNatsServer, startNatsServer } from "../../src/transport/nats-server.ts";
import { waitUntil } from "../harness/index.ts";

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("nats-server", () => {
  it("starts on a free loopback port with a token, restarts on the same port with the same store, stops", async () => {
    const server = await startNatsServer();
    try {
      expect(server.url).toMatch(/^nats:\/\/127\.0\.0\.1:\d+$/);
      expect(server.token).toMatch(/^[0-9a-f]{64}$/);
      expect(alive(server.pid)).toBe(true);
      // The token is not on the command line (visible to every local user through ps).
      expect(readFileSync(`/proc/${server.pid}/cmdline`, "utf8")).not.toContain(server.token);
      // The token is required.
      await expect(connectBus({ url: server.url, reconnect: false })).rejects.toMatchObject({ code: "TRANSPORT" });
      const bus = await connectBus({ url: server.authUrl, reconnectWaitMs: 50 });
      expect(bus.maxPayload).toBe(8 * 1024 * 1024);
      await bus.ensureStream("KEEP", ["keep.>"]);
      await bus.jsPublish("keep.a", new Uint8Array([1, 2, 3]));
      const port = server.port;
      const firstPid = server.pid;
      await server.restart();
      expect(server.port).toBe(port);
      expect(server.pid).not.toBe(firstPid);
      expect(alive(firstPid)).toBe(false);
      // The bus reconnects by itself and the stream survived in the store.
      await waitUntil(() => bus.isConnected(), { what: "the bus to reconnect after restart", diagnostics: server.logTail });
      const info = await (await bus.jsm()).streams.info("KEEP");
      expect(info.state.messages).toBe(1);
      await bus.close();
    } finally {
      await server.stop();
    }
    expect(server.running).toBe(false);
    expect(existsSync(server.storeDir)).toBe(false);
    await server.stop(); // idempotent
  });

  it("kill() simulates a crash; restart() brings it back", async () => {
    const server = await startNatsServer();
    try {
      const pid = server.pid;
      server.kill("SIGKILL");
      await server.waitExit();
      expect(server.running).toBe(false);
      expect(alive(pid)).toBe(false);
      await server.restart();
      expect(server.running).toBe(true);
      const bus = await connectBus({ url: server.url, token: server.token });
      await bus.flush();
      await bus.close();
    } finally {
      await server.stop();
    }
  });

  it("rejects with the server's own output when it exits before ready (port taken)", async () => {
    const blocker = createServer();
    await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", () => r()));
    const port = (blocker.address() as { port: number }).port;
    try {
      const err = await startNatsServer({ port }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OozeError);
      expect((err as OozeError).code).toBe("NATS_SERVER_FAILED");
      expect((err as OozeError).message).toMatch(/exited before it was ready[\s\S]*address already in use/);
    } finally {
      blocker.close();
    }
  });

  it("says how to install nats-server when the binary is missing", async () => {
    const saved = process.env.PATH;
    process.env.PATH = "";
    try {
      for (const attempt of [() => startNatsServer({ searchDirs: ["/nonexistent-dir"] }), () => startNatsServer({ binary: "/nonexistent-dir/nats-server" })]) {
        const err = await attempt().catch((e: unknown) => e);
        expect(err).toBeInstanceOf(OozeError);
        expect((err as OozeError).code).toBe("NATS_SERVER_MISSING");
        expect((err as OozeError).message).toContain("apt-get install nats-server");
        expect((err as OozeError).message).toContain("OOZE_NATS_URL");
      }
      expect(() => findNatsServer({ searchDirs: [] })).toThrow(/nats-server not found/);
    } finally {
      process.env.PATH = saved;
    }
    // With the PATH restored the default search finds it.
    expect(findNatsServer()).toMatch(/nats-server$/);
  });

  describe("no orphan server", () => {
    const child = fileURLToPath(new URL("../harness/nats-child.ts", import.meta.url));

    async function startChild(mode: "wait" | "exit") {
      const proc = spawn(process.execPath, ["--import", "tsx", child, mode], { stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      let err = "";
      proc.stdout.setEncoding("utf8").on("data", (s: string) => (out += s));
      proc.stderr.setEncoding("utf8").on("data", (s: string) => (err += s));
      const line = await waitUntil(() => out.split("\n").find((l) => l.startsWith("{")), {
        timeoutMs: 30_000,
        what: "the child to report its nats-server pid",
        diagnostics: () => `stdout: ${out}\nstderr: ${err}`,
      });
      const info = JSON.parse(line) as { natsPid: number; port: number };
      if (mode === "wait") expect(alive(info.natsPid)).toBe(true);
      return { proc, info, diagnostics: () => `child stderr: ${err}` };
    }

    for (const signal of ["SIGKILL", "SIGTERM"] as const) {
      it(`after the parent is ${signal}ed`, async () => {
        const { proc, info, diagnostics } = await startChild("wait");
        proc.kill(signal);
        await waitUntil(() => !alive(info.natsPid), { timeoutMs: 15_000, what: `nats-server ${info.natsPid} to exit after its parent got ${signal}`, diagnostics });
      });
    }

    it("after the parent exits on its own", async () => {
      const { info, diagnostics } = await startChild("exit");
      await waitUntil(() => !alive(info.natsPid), { timeoutMs: 15_000, what: `nats-server ${info.natsPid} to exit with its parent`, diagnostics });
    });
  });
});
