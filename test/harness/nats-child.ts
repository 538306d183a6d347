// A child process for orphan tests: starts an embedded nats-server, prints one JSON line
// {natsPid, watchdogPid?, port}, then waits (mode "wait"), or exits on its own (mode "exit").
import { startNatsServer } from "../../src/transport/nats-server.ts";

const mode = process.argv[2] ?? "wait";
const server = await startNatsServer();
process.stdout.write(`${JSON.stringify({ natsPid: server.pid, port: server.port })}\n`);
if (mode === "exit") {
  process.exit(0);
} else {
  setInterval(() => {}, 1 << 30);
}
