// The engine client's HTTP/1.1 transport (src/engine/http.ts) against real servers on loopback:
// node:http servers for the usual framings and keep-alive, raw TCP servers for what node:http never
// sends (a body framed by the connection's end, an interim 100, a broken status line, a cut body).
import { execFile } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { HttpTimeoutError, maxIdleMs, requestStream, requestText, ResponseParser, setMaxIdleMs, setSocketBudget, socketBudget, socketStats } from "../../src/engine/http.ts";
import { makeTestCerts } from "../harness/index.ts";

const servers: (Server | NetServer)[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    if ("closeAllConnections" in s) s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

async function listen<T extends Server | NetServer>(s: T): Promise<string> {
  servers.push(s);
  s.listen(0, "127.0.0.1");
  await once(s, "listening");
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

/** A raw TCP server answering each connection's first request with `reply(socket)`. */
function raw(reply: (s: Socket) => void): NetServer {
  return createNetServer((s) => {
    s.once("data", () => reply(s));
    s.on("error", () => {});
  });
}

const get = (signal = new AbortController().signal) => ({ method: "GET" as const, headers: {}, signal });
const post = (body: string, signal = new AbortController().signal) => ({ method: "POST" as const, headers: { "content-type": "application/json" }, body, signal });

async function rejection(p: Promise<unknown>): Promise<Error & { code?: string }> {
  try {
    await p;
  } catch (e) {
    return e as Error & { code?: string };
  }
  throw new Error("expected a rejection");
}

describe("engine HTTP transport", () => {
  it("sends the body and headers as given and reuses one connection for sequential requests", async () => {
    let connections = 0;
    const seen: string[] = [];
    const s = createHttpServer((req, res) => {
      let b = "";
      req.on("data", (c) => (b += c));
      req.on("end", () => {
        seen.push(`${req.method} ${req.url} ${req.headers["content-type"] ?? "-"} ${req.headers["content-length"] ?? "-"} ${b}`);
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ echo: b, n: seen.length }));
      });
    });
    s.on("connection", () => connections++);
    const url = await listen(s);
    const body = JSON.stringify({ input_ids: [1, 2, 3], text: "é → ✓" });
    for (let i = 1; i <= 5; i++) {
      const r = await requestText(`${url}/generate?x=${i}`, post(body));
      expect(r.status).toBe(200);
      expect(JSON.parse(r.text)).toEqual({ echo: body, n: i });
    }
    expect((await requestText(`${url}/health`, get())).status).toBe(200);
    expect(connections).toBe(1);
    expect(seen[0]).toBe(`POST /generate?x=1 application/json ${Buffer.byteLength(body)} ${body}`);
    expect(seen[5]).toBe("GET /health - - ");
  });

  it("reads chunked bodies, and opens a new connection after `Connection: close` or once the server closed an idle one", async () => {
    let connections = 0;
    const s = createHttpServer((req, res) => {
      if (req.url === "/close") return void res.writeHead(200, { connection: "close", "content-length": "2" }).end("ok");
      // No Content-Length: node:http sends it chunked, one chunk per write.
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("α".repeat(3000));
      setTimeout(() => res.end("-end"), 5);
    });
    // Announced as `Keep-Alive: timeout=3`: the client keeps sockets 2 s.
    s.keepAliveTimeout = 3000;
    s.on("connection", () => connections++);
    const url = await listen(s);
    expect((await requestText(`${url}/chunked`, get())).text).toBe(`${"α".repeat(3000)}-end`);
    expect((await requestText(`${url}/chunked`, get())).text).toBe(`${"α".repeat(3000)}-end`);
    expect(connections).toBe(1);
    expect((await requestText(`${url}/close`, get())).text).toBe("ok");
    expect((await requestText(`${url}/chunked`, get())).status).toBe(200);
    expect(connections).toBe(2);
    s.closeIdleConnections();
    await new Promise((r) => setTimeout(r, 100)); // for the client to see the connection end
    expect((await requestText(`${url}/chunked`, get())).status).toBe(200);
    expect(connections).toBe(3);
  });

  it("sends a request again, once, on a new connection when a socket reused late in its idle time ends before any byte of the reply", async () => {
    // A server that closes each connection as its second request arrives, unanswered: the keep-alive
    // race, where the server closes an idle connection as the client sends on it.
    let connections = 0;
    let answered = 0;
    const server = createNetServer((sock) => {
      connections++;
      let n = 0;
      sock.on("error", () => {});
      sock.on("data", () => {
        if (++n === 2) return void sock.destroy();
        answered++;
        // timeout=2: the client keeps the socket 1 s, and re-sends on one it reused after 0.5 s or more
        sock.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nkeep-alive: timeout=2\r\n\r\nok");
      });
    });
    const url = await listen(server);
    for (let i = 0; i < 3; i++) {
      expect((await requestText(url, get())).text).toBe("ok");
      await new Promise((r) => setTimeout(r, 600));
    }
    expect({ connections, answered }).toEqual({ connections: 3, answered: 3 });
    // reused at once, a reset is the server's answer: nothing is sent again
    await requestText(url, get());
    expect((await rejection(requestText(url, get()))).code).toBe("ECONNRESET");
    // A new connection that ends unanswered is the caller's to handle: nothing is sent again.
    const mute = await listen(raw((sock) => sock.destroy()));
    expect((await rejection(requestText(mute, get()))).code).toBe("ECONNRESET");
  });

  it("reads a body framed by the connection's end, skips an interim 100, and refuses a reply that is not HTTP", async () => {
    const closeFramed = await listen(raw((s) => s.end("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil the end")));
    expect(await requestText(closeFramed, get())).toEqual({ status: 200, text: "until the end" });
    const interim = await listen(raw((s) => s.end("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 3\r\n\r\nabc")));
    expect(await requestText(interim, get())).toEqual({ status: 201, text: "abc" });
    const notHttp = await listen(raw((s) => s.end("SSH-2.0-OpenSSH_9.2\r\n\r\n")));
    const e = await rejection(requestText(notHttp, get()));
    expect(e.code).toBe("HPE_INVALID");
    expect(e.message).toMatch(/status line 'SSH-2.0/);
  });

  it("rejects with ECONNRESET when the body is cut short, with the socket's code when nothing listens, and with HttpTimeoutError past the limit", async () => {
    const cut = await listen(raw((s) => s.end("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")));
    const e = await rejection(requestText(cut, get()));
    expect(e.code).toBe("ECONNRESET");
    expect(e.message).toMatch(/closed before the whole reply/);
    const s = await listen(createNetServer());
    await new Promise((r) => servers.pop()!.close(r));
    expect((await rejection(requestText(s, get()))).code).toBe("ECONNREFUSED");
    const silent = await listen(raw(() => {}));
    const t = await rejection(requestText(silent, { ...get(), timeoutMs: 50 }));
    expect(t).toBeInstanceOf(HttpTimeoutError);
    expect(t.message).toBe("no whole reply within 50 ms");
  });

  it("streams: a chunk is handed over before the rest is sent; an abort ends it with the signal's reason and the next request still works; leaving early closes it", async () => {
    let release: () => void = () => {};
    let closed: Promise<unknown> = Promise.resolve();
    const s = createHttpServer((req, res) => {
      if (req.url === "/plain") return void res.end("fine");
      closed = once(res, "close");
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("data: 1\n\n");
      // The rest only once the client has read the first chunk: buffering would hang here.
      release = () => {
        res.write("data: 2\n\n");
        res.end("data: [DONE]\n\n");
      };
    });
    const url = await listen(s);
    const r = await requestStream(`${url}/stream`, post("{}"));
    expect(r.status).toBe(200);
    const it = r.body[Symbol.asyncIterator]();
    expect((await it.next()).value!.toString()).toBe("data: 1\n\n");
    release();
    let rest = "";
    for (let c = await it.next(); !c.done; c = await it.next()) rest += c.value.toString();
    expect(rest).toBe("data: 2\n\ndata: [DONE]\n\n");

    const ctl = new AbortController();
    const r2 = await requestStream(`${url}/stream`, post("{}", ctl.signal));
    const it2 = r2.body[Symbol.asyncIterator]();
    await it2.next();
    const reason = new Error("caller gave up");
    ctl.abort(reason);
    expect(await rejection(it2.next())).toBe(reason);
    expect((await requestText(`${url}/plain`, get())).text).toBe("fine");
    // Already aborted: nothing is sent.
    expect(await rejection(requestText(`${url}/plain`, get(ctl.signal)))).toBe(reason);
    // A reader that leaves before the end closes the connection (the server sees it go).
    const r3 = await requestStream(`${url}/stream`, post("{}"));
    for await (const c of r3.body) {
      expect(c.toString()).toBe("data: 1\n\n");
      break;
    }
    await closed;
  });

  it("speaks HTTPS and checks the certificate: refused while its CA is unknown, answered with the CA trusted (NODE_EXTRA_CA_CERTS, a child process)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ooze-http-tls-"));
    try {
      makeTestCerts(dir);
      const s = createHttpsServer({ key: readFileSync(join(dir, "server.key")), cert: readFileSync(join(dir, "server.pem")) }, (req, res) => res.end(`secure ${req.url}`));
      const url = (await listen(s)).replace("http:", "https:");
      expect((await rejection(requestText(`${url}/x`, get()))).code).toMatch(/CERT|ISSUER|SIGNATURE/);
      const transport = fileURLToPath(new URL("../../src/engine/http.ts", import.meta.url));
      const script = `import { requestText } from ${JSON.stringify(transport)}; const r = await requestText(process.argv[1], { method: "GET", headers: {} }); console.log(r.status, r.text);`;
      const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script, `${url}/hello`], {
        env: { ...process.env, NODE_EXTRA_CA_CERTS: join(dir, "ca.pem") },
      });
      expect(stdout.trim()).toBe("200 secure /hello");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("refuses a header value with a line break (no request smuggling through a routing key)", async () => {
    const url = await listen(createHttpServer((_req, res) => res.end("x")));
    const e = await rejection(requestText(url, { method: "GET", headers: { "x-key": "a\r\nx-evil: 1" }, signal: new AbortController().signal }));
    expect(e.message).toMatch(/header 'x-key' holds a line break/);
  });

  it("parses a response the same however the bytes are split (Content-Length and chunked)", () => {
    const body = Buffer.from(`{"text":"héllo ✓","output_ids":[1,2,3]}`);
    const framings = [
      Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`), body]),
      Buffer.concat([
        Buffer.from("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        Buffer.from(`7;ext=1\r\n`),
        body.subarray(0, 7),
        Buffer.from(`\r\n${(body.length - 7).toString(16)}\r\n`),
        body.subarray(7),
        Buffer.from("\r\n0\r\nX-Trailer: t\r\n\r\n"),
      ]),
    ];
    fc.assert(
      fc.property(fc.constantFrom(...framings), fc.uniqueArray(fc.integer({ min: 1, max: 200 }), { maxLength: 12 }), (bytes, cutsRaw) => {
        const cuts = cutsRaw.filter((c) => c < bytes.length).sort((a, b) => a - b);
        const p = new ResponseParser();
        const got: Buffer[] = [];
        let status = 0;
        let at = 0;
        for (const c of [...cuts, bytes.length]) {
          p.push(bytes.subarray(at, c), { head: (s) => (status = s), data: (d) => void got.push(Buffer.from(d)) });
          at = c;
        }
        expect(status).toBe(200);
        expect(p.complete).toBe(true);
        expect(p.keepAlive).toBe(true);
        expect(Buffer.concat(got).toString()).toBe(body.toString());
      }),
      { numRuns: 300 },
    );
  });

  it("keeps an idle socket 1 s less than the server's announced keep-alive (at most 60 s), or 4 s when none is announced", () => {
    const idleMs = (headers: string) => {
      const p = new ResponseParser();
      p.push(Buffer.from(`HTTP/1.1 200 OK\r\ncontent-length: 0\r\n${headers}\r\n`), { head: () => {}, data: () => {} });
      expect(p.complete).toBe(true);
      return p.keepAlive ? p.idleMs : null;
    };
    expect(idleMs("")).toBe(4_000);
    expect(idleMs("Keep-Alive: timeout=30\r\n")).toBe(29_000); // ooze's engine servers
    expect(idleMs("keep-alive: timeout=3\r\n")).toBe(2_000);
    expect(idleMs("Keep-Alive: timeout=600\r\n")).toBe(60_000);
    expect(idleMs("Keep-Alive: timeout=1\r\n")).toBeNull(); // nothing left to keep it for
    // the cap raised (OOZE_HTTP_MAX_IDLE_MS, setMaxIdleMs: a network that keeps idle connections; a slowed bench clock)
    const was = setMaxIdleMs(900_000);
    try {
      expect(idleMs("Keep-Alive: timeout=600\r\n")).toBe(599_000);
    } finally {
      setMaxIdleMs(was);
    }
    expect(idleMs("Keep-Alive: timeout=600\r\n")).toBe(60_000);
  });

  it("reads the idle cap from OOZE_HTTP_MAX_IDLE_MS, and refuses one that is not a whole number of ms ≥ 1000", () => {
    expect(maxIdleMs(undefined)).toBe(60_000);
    expect(maxIdleMs("")).toBe(60_000);
    expect(maxIdleMs("7680000")).toBe(7_680_000);
    expect(() => maxIdleMs("30s")).toThrow(/OOZE_HTTP_MAX_IDLE_MS must be an integer number of ms ≥ 1000, got '30s'/);
    expect(() => maxIdleMs("500")).toThrow(/got '500'/);
    expect(() => setMaxIdleMs(1.5)).toThrow(/idle cap/);
  });
});

describe("the process's socket budget", () => {
  it("is four fifths of the open-files limit less 128, or what OOZE_HTTP_MAX_SOCKETS says", () => {
    expect(socketBudget(undefined, 20_000)).toBe(15_872);
    expect(socketBudget(undefined, 1024)).toBe(691);
    expect(socketBudget(undefined, 100)).toBe(16);
    expect(socketBudget(undefined, null)).toBe(1024);
    expect(socketBudget("300", 20_000)).toBe(300);
    expect(() => socketBudget("0", 20_000)).toThrow(/OOZE_HTTP_MAX_SOCKETS must be a positive integer, got '0'/);
    expect(() => socketBudget("many", null)).toThrow(/OOZE_HTTP_MAX_SOCKETS/);
  });

  it("makes exchanges past it wait for a socket instead of failing, and an aborted waiter leaves the queue", async () => {
    // A server that holds every reply until released; at each request the client's open sockets are
    // counted (the server's own count lags the client's closes).
    let most = 0;
    const held: (() => void)[] = [];
    const server = createHttpServer((req, res) => {
      most = Math.max(most, socketStats().open);
      req.resume();
      held.push(() => res.end("ok"));
    });
    const url = await listen(server);
    const was = setSocketBudget(2);
    try {
      const calls = Array.from({ length: 5 }, () => requestText(`${url}/x`, { method: "POST", headers: {}, body: "{}" }));
      const gone = new AbortController();
      const abandoned = requestText(`${url}/x`, { method: "POST", headers: {}, body: "{}", signal: gone.signal });
      await expect.poll(() => held.length).toBe(2);
      expect(socketStats().waiting).toBe(4);
      gone.abort(new Error("the caller left"));
      await expect(abandoned).rejects.toThrow("the caller left");
      expect(socketStats().waiting).toBe(3);
      // release the replies two at a time: each frees a socket for the next waiter
      let served = 0;
      while (served < 5) {
        await expect.poll(() => held.length).toBeGreaterThan(0);
        const batch = held.splice(0);
        served += batch.length;
        for (const f of batch) f();
      }
      const texts = await Promise.all(calls);
      expect(texts.map((t) => t.text)).toEqual(["ok", "ok", "ok", "ok", "ok"]);
      expect(most).toBeLessThanOrEqual(2);
      expect(socketStats().waiting).toBe(0);
    } finally {
      setSocketBudget(was);
    }
  });

  it("a priority exchange (a health check) opens a socket past the budget; a plain one waits in line", async () => {
    const held: (() => void)[] = [];
    const server = createHttpServer((req, res) => {
      if (req.url === "/health") res.end("up");
      else held.push(() => res.end("ok"));
    });
    const url = await listen(server);
    const was = setSocketBudget(1);
    try {
      const a = requestText(`${url}/x`, { method: "POST", headers: {}, body: "{}" });
      await expect.poll(() => held.length).toBe(1);
      const b = requestText(`${url}/x`, { method: "POST", headers: {}, body: "{}" });
      await expect.poll(() => socketStats().waiting).toBe(1);
      const plain = requestText(`${url}/health`, { method: "GET", headers: {}, timeoutMs: 500 });
      expect((await requestText(`${url}/health`, { method: "GET", headers: {}, priority: true })).text).toBe("up");
      // The priority exchange's socket went on to the oldest waiter for the server (b); the plain
      // health check still waits behind the held requests, and times out there.
      await expect.poll(() => held.length).toBe(2);
      expect(await rejection(plain)).toBeInstanceOf(HttpTimeoutError);
      for (const f of held.splice(0)) f();
      expect((await Promise.all([a, b])).map((r) => r.text)).toEqual(["ok", "ok"]);
    } finally {
      setSocketBudget(was);
    }
  });

  it("closes an idle socket to another server to make room", async () => {
    const a = await listen(createHttpServer((_req, res) => res.end("a")));
    const b = await listen(createHttpServer((_req, res) => res.end("b")));
    const was = setSocketBudget(1);
    try {
      expect((await requestText(a, { method: "GET", headers: {} })).text).toBe("a"); // its socket stays idle
      expect((await requestText(b, { method: "GET", headers: {} })).text).toBe("b");
      expect((await requestText(a, { method: "GET", headers: {} })).text).toBe("a");
      expect(socketStats().open).toBeLessThanOrEqual(1);
    } finally {
      setSocketBudget(was);
    }
  });
});
