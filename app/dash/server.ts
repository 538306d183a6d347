// The dashboard's HTTP server: one page (app/dash/page/), its script and stylesheet, uPlot from
// node_modules (no CDN: the page works offline), a server-sent-event stream of the hub's updates,
// three actions (attach an engine, detach one, open a run directory) and the trajectory explorer's
// two reads (the episode table, one episode: explorer.ts). It binds to 127.0.0.1
// unless told otherwise, and every route — page, assets, stream, actions — needs the token (a
// generated one unless given), as `?token=` or `Authorization: Bearer TOKEN`; without it the answer
// is 401 and nothing else.
import { randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createRequire } from "node:module";
import type { AddressInfo } from "node:net";
import { counter, gauge, newRegistry, sendMetrics } from "../../src/metrics.ts";
import { OozeError } from "../../src/errors.ts";
import type { DashHub, DashUpdate } from "./hub.ts";

/** What the page's buttons and fields do (injected: the job's fleet, the run directory reader). */
export interface DashActions {
  /** Attaches an engine to the job's fleet (the checks of `ooze engines attach`); null when there is no job. */
  attach: ((url: string) => Promise<unknown>) | null;
  detach: ((url: string) => Promise<unknown>) | null;
  /** Opens a run directory's metrics.jsonl (and follows it); the run comes to the page as a `run` update. */
  openRun: (dir: string) => Promise<{ dir: string; steps: number; error: string | null }>;
  /**
   * The trajectory explorer (explorer.ts) of the opened run directory (`run`) or of the live job's
   * run directory (`live`): the episode table, and one episode; null when there is none to read.
   */
  explorer?: {
    table(source: "run" | "live"): unknown;
    episode(source: "run" | "live", step: number, index: number): unknown;
  };
}

/** Options of startDashServer. */
export interface DashServerOptions {
  hub: DashHub;
  actions: DashActions;
  /** Bind address (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: one the OS picks). */
  port?: number;
  /** Access token (default: 24 random bytes, hex). */
  token?: string;
  /** Interval of SSE keep-alive comments, ms (default 15 s). */
  keepAliveMs?: number;
}

/** A running dashboard server. */
export interface DashServer {
  /** The page's URL with the token, e.g. http://127.0.0.1:8765/?token=… */
  readonly url: string;
  readonly port: number;
  readonly token: string;
  /** Ends the event streams and closes the server. */
  close(): Promise<void>;
}

interface Asset {
  type: string;
  body: Buffer;
}

/** The page's files, read once: the page and its script beside this file, uPlot from node_modules. */
function loadAssets(): { page: string; assets: Map<string, Asset> } {
  const here = (f: string) => new URL(`./page/${f}`, import.meta.url);
  const require = createRequire(import.meta.url);
  const uplotDir = require.resolve("uplot").replace(/uPlot\.cjs\.js$/, "");
  const js = "text/javascript; charset=utf-8";
  const css = "text/css; charset=utf-8";
  return {
    page: readFileSync(here("index.html"), "utf8"),
    assets: new Map<string, Asset>([
      ["/assets/app.js", { type: js, body: readFileSync(here("app.js")) }],
      ["/assets/charts.js", { type: js, body: readFileSync(here("charts.js")) }],
      ["/assets/explorer.js", { type: js, body: readFileSync(here("explorer.js")) }],
      ["/assets/app.css", { type: css, body: readFileSync(here("app.css")) }],
      ["/assets/uplot.js", { type: js, body: readFileSync(`${uplotDir}uPlot.iife.min.js`) }],
      ["/assets/uplot.css", { type: css, body: readFileSync(`${uplotDir}uPlot.min.css`) }],
    ]),
  };
}

/** The token a request carries (query `token`, or an Authorization header), or null. */
function tokenOf(req: IncomingMessage, url: URL): string | null {
  const q = url.searchParams.get("token");
  if (q !== null) return q;
  const m = /^(?:Bearer|token)\s+(\S+)$/i.exec(req.headers.authorization ?? "");
  return m ? m[1]! : null;
}

function sameToken(given: string | null, token: string): boolean {
  if (given === null) return false;
  const a = Buffer.from(given);
  const b = Buffer.from(token);
  return a.length === b.length && timingSafeEqual(a, b);
}

const MAX_BODY = 64 * 1024;

/** Reads a small JSON object body; BAD_REQUEST naming what is wrong. */
async function jsonBody(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > MAX_BODY) throw new OozeError("BAD_REQUEST", `request body is over ${MAX_BODY} bytes`);
    chunks.push(c as Buffer);
  }
  let v: unknown;
  try {
    v = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (e) {
    throw new OozeError("BAD_REQUEST", `request body is not JSON: ${(e as Error).message}`);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw new OozeError("BAD_REQUEST", "request body must be a JSON object");
  return v as Record<string, unknown>;
}

function stringField(body: Record<string, unknown>, field: string): string {
  const v = body[field];
  if (typeof v !== "string" || v.trim() === "") throw new OozeError("BAD_REQUEST", `field '${field}' must be a non-empty string`);
  return v.trim();
}

function send(res: ServerResponse, status: number, type: string, body: string | Buffer): void {
  res.writeHead(status, { "content-type": type, "cache-control": "no-store", "x-content-type-options": "nosniff" });
  res.end(body);
}

function sendJson(res: ServerResponse, status: number, v: unknown): void {
  send(res, status, "application/json; charset=utf-8", JSON.stringify(v));
}

/** Starts the dashboard server; resolves once it listens. */
export async function startDashServer(o: DashServerOptions): Promise<DashServer> {
  const host = o.host ?? "127.0.0.1";
  const token = o.token ?? randomBytes(24).toString("hex");
  const keepAliveMs = o.keepAliveMs ?? 15_000;
  const { page, assets } = loadAssets();
  const html = page.replaceAll("{{TOKEN}}", encodeURIComponent(token));
  const streams = new Set<ServerResponse>();
  // GET /metrics (token required, as everywhere: Prometheus sends it as a bearer token)
  const registry = newRegistry();
  gauge(registry, "ooze_dash_clients", "Browsers with the live event stream open.", [], (g) => g.set(streams.size));
  const requests = counter(registry, "ooze_dash_requests_total", "Requests answered, by route and status code.", ["route", "code"]);

  const openStream = (res: ServerResponse) => {
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store", connection: "keep-alive" });
    const write = (u: DashUpdate) => res.write(`event: ${u.type}\ndata: ${JSON.stringify(u.data)}\n\n`);
    write({ type: "snapshot", data: o.hub.snapshot() });
    const off = o.hub.listen(write);
    const beat = setInterval(() => res.write(": keep-alive\n\n"), keepAliveMs);
    streams.add(res);
    res.on("close", () => {
      off();
      clearInterval(beat);
      streams.delete(res);
    });
  };

  const action = async (res: ServerResponse, run: () => Promise<unknown>) => {
    try {
      sendJson(res, 200, { ok: true, result: (await run()) ?? null });
    } catch (e) {
      const err = e instanceof OozeError ? e : new OozeError("INTERNAL", (e as Error)?.message ?? String(e));
      sendJson(res, err.code === "BAD_REQUEST" ? 400 : 200, { ok: false, error: { code: err.code, message: err.message } });
    }
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://dash.invalid");
    res.once("finish", () => requests.inc({ route: assets.has(url.pathname) ? "asset" : url.pathname.startsWith("/api/") || ["/", "/events", "/metrics"].includes(url.pathname) ? url.pathname : "other", code: String(res.statusCode) }));
    if (!sameToken(tokenOf(req, url), token)) return send(res, 401, "text/plain; charset=utf-8", "401 Unauthorized\n");
    const route = `${req.method ?? "GET"} ${url.pathname}`;
    const asset = req.method === "GET" ? assets.get(url.pathname) : undefined;
    if (asset) return send(res, 200, asset.type, asset.body);
    switch (route) {
      case "GET /":
        return send(res, 200, "text/html; charset=utf-8", html);
      case "GET /events":
        return openStream(res);
      case "GET /metrics":
        return sendMetrics(res, registry);
      case "GET /api/state":
        return sendJson(res, 200, o.hub.snapshot());
      case "POST /api/engines/attach":
      case "POST /api/engines/detach": {
        const attach = url.pathname.endsWith("attach");
        const fn = attach ? o.actions.attach : o.actions.detach;
        return action(res, async () => {
          const target = stringField(await jsonBody(req), "url");
          if (fn === null) throw new OozeError("ACTOR_NOT_FOUND", "this dashboard shows a run directory, not a running job: there is no fleet to change");
          return fn(target);
        });
      }
      case "GET /api/explorer/episodes":
      case "GET /api/explorer/episode":
        return action(res, async () => {
          const ex = o.actions.explorer;
          if (!ex) throw new OozeError("ACTOR_NOT_FOUND", "this dashboard has no trajectory explorer");
          const source = url.searchParams.get("source") === "live" ? "live" : "run";
          if (url.pathname.endsWith("episodes")) return ex.table(source);
          const int = (k: string) => {
            const v = Number(url.searchParams.get(k));
            if (!Number.isInteger(v) || v < 0) throw new OozeError("BAD_REQUEST", `query '${k}' must be a non-negative integer`);
            return v;
          };
          return ex.episode(source, int("step"), int("index"));
        });
      case "POST /api/run":
        return action(res, async () => o.actions.openRun(stringField(await jsonBody(req), "dir")));
      default:
        return send(res, 404, "text/plain; charset=utf-8", `404: no ${route}\n`);
    }
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((e) => {
      if (!res.headersSent) send(res, 500, "text/plain; charset=utf-8", `500: ${(e as Error)?.message ?? e}\n`);
      else res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (e) =>
      reject(new OozeError("CONFIG_INVALID", `dashboard: cannot listen on ${host}:${o.port ?? 0}: ${(e as Error).message}; pick another --port`, { cause: e })),
    );
    server.listen(o.port ?? 0, host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const shown = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  return {
    url: `http://${shown.includes(":") ? `[${shown}]` : shown}:${port}/?token=${encodeURIComponent(token)}`,
    port,
    token,
    async close() {
      for (const s of streams) s.end();
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeAllConnections();
      await closed;
    },
  };
}
