// A real nats-server per vitest file: useNats() gets one (src/testing/nats.ts) started in beforeAll
// and stopped (with every bus connected through it) in afterAll.
import { afterAll, beforeAll } from "vitest";
import { type Bus, type BusOptions, connectBus } from "../../src/transport/bus.ts";
import type { NatsServerHandle, NatsServerOptions } from "../../src/transport/nats-server.ts";
import { startTestNats } from "../../src/testing/nats.ts";

/** What `useNats` gives a test file. */
export interface TestNats {
  /** The server (available inside tests and hooks, after beforeAll). */
  readonly server: NatsServerHandle;
  /** Connects a bus to the server (or to `url`, e.g. a cut proxy); closed in afterAll. */
  connect(opts?: Partial<BusOptions>): Promise<Bus>;
}

/** Registers beforeAll/afterAll hooks that start and stop one nats-server for the calling file. */
export function useNats(opts: NatsServerOptions = {}): TestNats {
  let server: NatsServerHandle | null = null;
  const buses: Bus[] = [];
  beforeAll(async () => {
    server = await startTestNats(opts);
  });
  afterAll(async () => {
    await Promise.all(buses.map((b) => b.close().catch(() => {})));
    await server?.stop();
  });
  return {
    get server() {
      if (server === null) throw new Error("useNats: the server is available only inside tests and hooks (after beforeAll)");
      return server;
    },
    async connect(o: Partial<BusOptions> = {}) {
      if (server === null) throw new Error("useNats: connect() called before beforeAll ran");
      const bus = await connectBus({ url: server.url, token: server.token, reconnectWaitMs: 100, ...o });
      buses.push(bus);
      return bus;
    },
  };
}
