// A real nats-server for tests and fault schedules: JetStream on a free 127.0.0.1 port with a temp
// store and a generated token; its handle restarts it (same port, same store) or stops it.
import { type NatsServerHandle, type NatsServerOptions, startNatsServer } from "../transport/nats-server.ts";

export type { NatsServerHandle, NatsServerOptions } from "../transport/nats-server.ts";

/** Starts nats-server on a free loopback port with a temp JetStream store. */
export function startTestNats(opts: NatsServerOptions = {}): Promise<NatsServerHandle> {
  return startNatsServer({ host: "127.0.0.1", ...opts });
}
