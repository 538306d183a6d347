// A loopback TCP proxy that can cut its connections for real: point one client at it, call cut()
// and the client's socket is reset (and new connections refused) until heal().
import { createServer, type Socket, connect as tcpConnect } from "node:net";

/** A cuttable proxy in front of a TCP port. */
export interface CutProxy {
  /** `nats://127.0.0.1:PORT` of the proxy. */
  readonly url: string;
  readonly port: number;
  /** Connections currently proxied. */
  readonly connections: number;
  /** Whether the proxy is cut. */
  readonly isCut: boolean;
  /** Destroys every proxied connection and refuses new ones until heal(). */
  cut(): void;
  /** Accepts connections again. */
  heal(): void;
  /** Cuts everything and stops listening. */
  close(): Promise<void>;
}

/** Starts a proxy on a free loopback port forwarding to `host:targetPort`. */
export async function createCutProxy(targetPort: number, host = "127.0.0.1"): Promise<CutProxy> {
  const pairs = new Set<[Socket, Socket]>();
  let isCut = false;
  const server = createServer((client) => {
    if (isCut) {
      client.destroy();
      return;
    }
    const upstream = tcpConnect({ host, port: targetPort });
    const pair: [Socket, Socket] = [client, upstream];
    pairs.add(pair);
    const drop = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("cut proxy: no TCP address");
  const port = address.port;
  const cutAll = () => {
    for (const [a, b] of pairs) {
      a.resetAndDestroy();
      b.destroy();
    }
    pairs.clear();
  };
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    get connections() {
      return pairs.size;
    },
    get isCut() {
      return isCut;
    },
    cut: () => {
      isCut = true;
      cutAll();
    },
    heal: () => {
      isCut = false;
    },
    close: async () => {
      isCut = true;
      cutAll();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
