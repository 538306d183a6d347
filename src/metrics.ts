// Prometheus metrics (the text exposition format, through prom-client): the process registry that the
// actors of a node record into, get-or-create helpers so that many instances in one process share one
// metric (told apart by labels), registries of their own for servers that serve their own /metrics
// (engine, gateway, dashboard), and the small HTTP server a node process exposes its registry on.
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import client, { type Counter, type Gauge, type Histogram, Registry } from "prom-client";
import { OozeError } from "./errors.ts";

export { Registry };
export type { Counter, Gauge, Histogram };

let processRegistry: Registry | null = null;

/** The registry of this process: its actors' metrics and the process's own (CPU, memory, event loop). */
export function processMetrics(): Registry {
  if (!processRegistry) {
    processRegistry = new Registry();
    client.collectDefaultMetrics({ register: processRegistry, prefix: "ooze_process_" });
  }
  return processRegistry;
}

/**
 * Counts a JetStream message delivered again (delivery count > 1: its handler failed, was nak'ed, or
 * its ack was lost or late) into this process's `ooze_jetstream_redeliveries_total{stream, consumer}`.
 */
export function countDelivery(stream: string, consumer: string, deliveryCount: number): void {
  if (deliveryCount <= 1) return;
  counter(processMetrics(), "ooze_jetstream_redeliveries_total", "JetStream messages delivered again to a consumer of this process (handler failed, nak, lost or late ack).", ["stream", "consumer"])
    .inc({ stream, consumer });
}

/** A registry of its own, for a server that serves its own /metrics (an engine, a gateway, the dashboard). */
export function newRegistry(): Registry {
  return new Registry();
}

/** The counter `name` of `reg`, created on first use. */
export function counter(reg: Registry, name: string, help: string, labelNames: readonly string[] = []): Counter<string> {
  return (reg.getSingleMetric(name) as Counter<string> | undefined) ?? new client.Counter({ name, help, labelNames: [...labelNames], registers: [reg] });
}

/** The gauge `name` of `reg`, created on first use (with `collect`, read at each scrape). */
export function gauge(reg: Registry, name: string, help: string, labelNames: readonly string[] = [], collect?: (g: Gauge<string>) => void): Gauge<string> {
  const existing = reg.getSingleMetric(name) as Gauge<string> | undefined;
  if (existing) return existing;
  return new client.Gauge({ name, help, labelNames: [...labelNames], registers: [reg], ...(collect ? { collect(this: Gauge<string>) { collect(this); } } : {}) });
}

/** Latency buckets (seconds) from 1 ms to 2 minutes. */
export const SECONDS_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

/** The histogram `name` of `reg`, created on first use. */
export function histogram(reg: Registry, name: string, help: string, labelNames: readonly string[] = [], buckets = SECONDS_BUCKETS): Histogram<string> {
  return (reg.getSingleMetric(name) as Histogram<string> | undefined) ?? new client.Histogram({ name, help, labelNames: [...labelNames], buckets, registers: [reg] });
}

/** Answers a GET /metrics with the registries' exposition text. */
export async function sendMetrics(res: ServerResponse, ...regs: Registry[]): Promise<void> {
  const text = (await Promise.all(regs.map((r) => r.metrics()))).join("\n");
  res.writeHead(200, { "content-type": regs[0]?.contentType ?? "text/plain; version=0.0.4; charset=utf-8", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** A running metrics endpoint. */
export interface MetricsServer {
  /** http://HOST:PORT/metrics */
  url: string;
  close(): Promise<void>;
}

/** Serves `reg` at GET /metrics (127.0.0.1 and a free port unless given); other paths are 404. */
export async function startMetricsServer(reg: Registry, opts: { host?: string | undefined; port?: number | undefined } = {}): Promise<MetricsServer> {
  const host = opts.host ?? "127.0.0.1";
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? "/").split("?")[0];
    req.resume();
    if (path !== "/metrics" || (req.method !== "GET" && req.method !== "HEAD")) {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("only GET /metrics here\n");
      return;
    }
    sendMetrics(res, reg).catch((e: unknown) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
      res.end(`metrics failed: ${(e as Error).message}\n`);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e) => reject(new OozeError("CONFIG_INVALID", `metrics: cannot listen on ${host}:${opts.port ?? 0}: ${e.message}`, { cause: e })));
    server.listen(opts.port ?? 0, host, () => resolve());
  });
  const a = server.address() as AddressInfo;
  return {
    url: `http://${a.family === "IPv6" ? `[${a.address}]` : a.address}:${a.port}/metrics`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
