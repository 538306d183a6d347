// The engine client's transport for whole (non-streamed) calls: one HTTP/1.1 request over node:http
// or node:https with a shared keep-alive agent, the body read whole as text. Lighter than fetch per
// call (no WHATWG Request/Response or web streams), which matters on the token-in/token-out path
// where every turn is one call. Idle sockets are closed after 4 s, or 1 s before the timeout a server
// announces in `Keep-Alive: timeout=N` (Node's agent reads it), before servers close theirs (Node
// and uvicorn: 5 s); nothing is ever re-sent here — a reset is the caller's fault to handle (the
// fleet retries /generate elsewhere, counting it).
import { Agent as HttpAgent, request as httpRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";

/** Idle keep-alive sockets are closed after this long, ms. */
const IDLE_SOCKET_MS = 4_000;
const httpAgent = new HttpAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS });
const httpsAgent = new HttpsAgent({ keepAlive: true, timeout: IDLE_SOCKET_MS });

/** A whole HTTP response. */
export interface HttpTextResponse {
  status: number;
  text: string;
}

/** What to send. */
export interface HttpTextRequest {
  method: string;
  headers: Record<string, string>;
  body?: string;
  signal: AbortSignal;
}

/**
 * Sends one request to `url` and reads the whole body. Rejects with the socket's error (its `code`
 * kept, e.g. ECONNREFUSED), or an AbortError when `signal` aborts.
 */
export function requestText(url: string, req: HttpTextRequest): Promise<HttpTextResponse> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const https = u.protocol === "https:";
    const headers: Record<string, string | number> = { ...req.headers };
    if (req.body !== undefined) headers["content-length"] = Buffer.byteLength(req.body);
    const options = { method: req.method, headers, signal: req.signal, agent: https ? httpsAgent : httpAgent };
    const onResponse = (res: IncomingMessage) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }));
      res.on("error", reject);
      res.on("close", () => {
        if (!res.complete) reject(Object.assign(new Error("the connection was closed before the whole reply arrived"), { code: "ECONNRESET" }));
      });
    };
    const r = https ? httpsRequest(u, options, onResponse) : httpRequest(u, options, onResponse);
    r.on("error", reject);
    r.end(req.body);
  });
}
