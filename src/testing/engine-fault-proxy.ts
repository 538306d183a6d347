// A fault-injecting HTTP proxy in front of one engine (ooze serve or SGLang), on 127.0.0.1: it
// forwards every request and applies one fault kind to a seeded fraction (or a schedule) of the
// requests on the chosen paths (default /generate) — answer 503 without forwarding, forward and
// return half of the body, forward and then never answer while holding the connection open, delay,
// or forward and then destroy the socket. It stands for a misbehaving engine or network, which the
// real engine cannot be made to be on demand. With `record`, it appends what the engine returned to
// each /generate (input ids, output ids) to a JSONL file: the engines' side of tokensAsSampled.
import { appendFileSync } from "node:fs";
import { createServer, request as httpRequest, type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { z } from "zod";
import { OozeError } from "../errors.ts";
import { mulberry32 } from "../random.ts";
import { engineOutputsOf } from "./sampled-tokens.ts";

/** The fault kinds of the proxy. */
export const ENGINE_FAULT_KINDS = ["http-503", "truncated-body", "hang", "slow", "reset"] as const;

/** One fault kind: http-503 (no forwarding), truncated-body, hang, slow, reset (see the file comment). */
export type EngineFaultKind = (typeof ENGINE_FAULT_KINDS)[number];

/** Which requests get the fault, as data (validated by engineFaultSpec). */
export const engineFaultSpec = z
  .object({
    /** The fault applied; null: forward everything untouched. */
    kind: z.enum(ENGINE_FAULT_KINDS).nullable(),
    /** Fraction of the matching requests faulted, drawn from `seed` (default 1 when no schedule). */
    rate: z.number().min(0).max(1).optional(),
    /** 0-based numbers of the matching requests that are faulted (instead of a rate). */
    schedule: z.array(z.number().int().min(0)).optional(),
    /** Seed of the rate's draws (default 0): the same seed faults the same request numbers. */
    seed: z.number().int().optional(),
    /** Request paths the fault applies to (default ["/generate"]). */
    paths: z.array(z.string().startsWith("/")).min(1).optional(),
    /** Delay of `slow`, ms (default 2 000). */
    delayMs: z.number().int().min(0).optional(),
  })
  .strict()
  .refine((s) => !(s.rate !== undefined && s.schedule !== undefined), { message: "give either rate or schedule, not both", path: ["schedule"] });

/** A fault spec (see engineFaultSpec). */
export type EngineFaultSpec = z.infer<typeof engineFaultSpec>;

/** What the proxy has seen. */
export interface EngineFaultProxyStats {
  /** Requests on the fault's paths. */
  matching: number;
  /** Requests faulted, by kind. */
  faulted: Partial<Record<EngineFaultKind, number>>;
  /** Every request forwarded or answered, on any path. */
  total: number;
}

/** A running fault proxy. */
export interface EngineFaultProxy {
  /** `http://127.0.0.1:PORT`: give it to clients in place of the engine's URL. */
  readonly url: string;
  readonly target: string;
  /** Counts so far. */
  stats(): EngineFaultProxyStats;
  /** Replaces the fault (validated; the request count and the seed's draws start again). */
  setFault(spec: EngineFaultSpec): void;
  /** Stops listening and destroys every connection, hung ones included. */
  close(): Promise<void>;
}

/** Validates a fault spec, naming the field that is wrong. */
export function parseEngineFaultSpec(input: unknown, where = "engine fault"): EngineFaultSpec {
  const r = engineFaultSpec.safeParse(input);
  if (r.success) return r.data;
  const issues = r.error.issues.map((i) => `${where}.${i.path.join(".") || "(root)"}: ${i.message}`);
  throw new OozeError("CONFIG_INVALID", `invalid ${where}: ${issues.join("; ")}`);
}

/** Drops hop-by-hop headers and the length of a body that is rewritten. */
function forwardHeaders(h: IncomingMessage["headers"], dropLength: boolean): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) {
    if (v === undefined || k === "connection" || k === "keep-alive" || k === "transfer-encoding") continue;
    if (dropLength && k === "content-length") continue;
    out[k] = v;
  }
  return out;
}

/** Options of startEngineFaultProxy beside the fault. */
export interface EngineFaultProxyOptions {
  /**
   * A JSONL file to which each /generate's input ids and the output ids the engine returned are
   * appended ({input, output}, one line per output; also for replies a fault then cut or held back:
   * the engine sampled them). tokensAsSampled reads them.
   */
  record?: string;
}

/** Starts a proxy on a free 127.0.0.1 port in front of `target` (e.g. "http://127.0.0.1:30000"). */
export async function startEngineFaultProxy(target: string, spec: EngineFaultSpec = { kind: null }, options: EngineFaultProxyOptions = {}): Promise<EngineFaultProxy> {
  const up = new URL(target);
  if (up.protocol !== "http:") throw new OozeError("CONFIG_INVALID", `fault proxy: target '${target}' must be an http:// URL`);
  let cfg = parseEngineFaultSpec(spec);
  let draw = mulberry32(cfg.seed ?? 0);
  let matching = 0;
  let total = 0;
  const faulted: Partial<Record<EngineFaultKind, number>> = {};
  const sockets = new Set<Socket>();

  const decide = (path: string): EngineFaultKind | null => {
    if (cfg.kind === null || !(cfg.paths ?? ["/generate"]).includes(path)) return null;
    const n = matching++;
    const hit = cfg.schedule ? cfg.schedule.includes(n) : draw() < (cfg.rate ?? 1);
    return hit ? cfg.kind : null;
  };

  /** Forwards the request; resolves with the upstream response (not yet read). */
  const forward = (req: IncomingMessage, body: Buffer): Promise<IncomingMessage> =>
    new Promise((resolve, reject) => {
      const r = httpRequest(
        { host: up.hostname, port: up.port, method: req.method, path: req.url, headers: { ...forwardHeaders(req.headers, true), "content-length": String(body.length), host: up.host } },
        resolve,
      );
      r.once("error", reject);
      r.end(body);
    });

  const readAll = (res: IncomingMessage): Promise<Buffer> =>
    new Promise((resolve, reject) => {
      const parts: Buffer[] = [];
      res.on("data", (c: Buffer) => parts.push(c));
      res.once("end", () => resolve(Buffer.concat(parts)));
      res.once("error", reject);
    });

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    total++;
    const parts: Buffer[] = [];
    for await (const c of req) parts.push(c as Buffer);
    const body = Buffer.concat(parts);
    const path = (req.url ?? "/").split("?")[0]!;
    const fault = decide(path);
    if (fault !== null) faulted[fault] = (faulted[fault] ?? 0) + 1;
    if (fault === "http-503") {
      res.writeHead(503, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: "fault proxy: injected 503 (the request was not forwarded)" } }));
      return;
    }
    if (fault === "slow") await new Promise((r) => setTimeout(r, cfg.delayMs ?? 2_000));
    const upRes = await forward(req, body);
    const recording = options.record !== undefined && path === "/generate" && upRes.statusCode === 200;
    const record = (reply: Buffer) => {
      const lines = engineOutputsOf(body, reply, String(upRes.headers["content-type"] ?? "")).map((r) => `${JSON.stringify(r)}\n`);
      if (lines.length > 0) appendFileSync(options.record!, lines.join(""));
    };
    if (fault === null || fault === "slow") {
      res.writeHead(upRes.statusCode ?? 502, forwardHeaders(upRes.headers, false));
      if (recording) {
        const parts: Buffer[] = [];
        upRes.on("data", (c: Buffer) => parts.push(c));
        upRes.once("end", () => record(Buffer.concat(parts)));
      }
      upRes.pipe(res);
      return;
    }
    const full = await readAll(upRes);
    if (recording) record(full);
    if (fault === "truncated-body") {
      const half = full.subarray(0, Math.floor(full.length / 2));
      res.writeHead(upRes.statusCode ?? 502, { ...forwardHeaders(upRes.headers, true), "content-length": String(half.length) });
      res.end(half);
    } else if (fault === "reset") {
      req.socket.destroy();
    }
    // hang: the reply was read and is never sent; the connection stays open until the client leaves or close().
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      if (res.headersSent) res.destroy();
      else {
        res.writeHead(502, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: `fault proxy: upstream ${target}: ${e instanceof Error ? e.message : String(e)}` } }));
      }
    });
  });
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const addr = server.address();
  if (addr === null || typeof addr === "string") throw new OozeError("INTERNAL", "fault proxy: no TCP address");
  return {
    url: `http://127.0.0.1:${addr.port}`,
    target,
    stats: () => ({ matching, faulted: { ...faulted }, total }),
    setFault(next) {
      cfg = parseEngineFaultSpec(next);
      draw = mulberry32(cfg.seed ?? 0);
      matching = 0;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
