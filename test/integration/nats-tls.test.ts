// TLS and credentials options passed through to NATS: a real nats-server with a certificate of a CA
// the test makes (openssl, for 127.0.0.1 and localhost: the client was seen checking the name localhost for a 127.0.0.1 server) and client verification on; the bus connects with the CA,
// certificate and key given as options or as OOZE_NATS_TLS_* environment variables, and without them
// it is refused with an error naming the servers. A missing credentials file is a clear error too.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectBus, natsSecurityFromEnv } from "../../src/transport/bus.ts";
import type { NatsServerHandle } from "../../src/transport/nats-server.ts";
import { makeTestCerts, startTestNats } from "../harness/index.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-nats-tls-"));
const f = (name: string) => join(dir, name);
let server: NatsServerHandle;

beforeAll(async () => {
  makeTestCerts(dir);
  server = await startTestNats({ tls: { certFile: f("server.pem"), keyFile: f("server.key"), caFile: f("ca.pem"), verify: true } });
}, 60_000);
afterAll(async () => {
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe("NATS over TLS", () => {
  it("connects with the CA, certificate and key (options or OOZE_NATS_TLS_*); refused without them", async () => {
    const tls = { caFile: f("ca.pem"), certFile: f("client.pem"), keyFile: f("client.key") };
    const bus = await connectBus({ url: server.url, token: server.token, tls, reconnect: false });
    await bus.ensureStream("TLS_T", ["tls-t.>"]);
    await bus.close();

    const env = { OOZE_NATS_TLS_CA: tls.caFile, OOZE_NATS_TLS_CERT: tls.certFile, OOZE_NATS_TLS_KEY: tls.keyFile };
    expect(natsSecurityFromEnv(env)).toEqual({ tls });
    const saved = { ...process.env };
    Object.assign(process.env, env);
    try {
      const viaEnv = await connectBus({ url: server.url, token: server.token, reconnect: false });
      await viaEnv.flush();
      await viaEnv.close();
    } finally {
      for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }

    await expect(connectBus({ url: server.url, token: server.token, tls: { caFile: tls.caFile }, reconnect: false, connectTimeoutMs: 3000 })).rejects.toThrow(
      new RegExp(`cannot connect to NATS at ${server.url}`),
    );
  });

  it("a credentials file that cannot be read is a configuration error naming it", async () => {
    await expect(connectBus({ url: server.url, credsFile: f("missing.creds"), reconnect: false })).rejects.toThrow(/cannot read the NATS credentials file .*missing\.creds \(OOZE_NATS_CREDS\)/);
  });
});
