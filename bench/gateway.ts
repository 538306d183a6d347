// Gateway benchmark (`npm run bench -- gateway [--requests N] [--warmup W] [--max-tokens T] [--turns K] [--preset NAME] [--stream] [--chat-template FILE]`):
// per-request latency of an OpenAI chat completion through the agent gateway vs the engine's own
// /generate called directly with the same token ids and sampling, on the same `ooze serve` engine
// process in the same run, interleaved (the order of the arms rotating) so all see the same load and
// prefix cache.
// As in production the agent is its own process: a forked client process times both arms with
// fetch; this process hosts the gateway and its fleet; the engine is a third process. The
// conversation carries K earlier turns as text, so each request renders a realistic history.
// A third arm sends the direct request through a bare pass-through proxy process (the cost of the
// extra hop alone, the floor of any gateway built on node:http's server), a fourth through a proxy
// process that speaks minimal HTTP/1.1 over raw sockets and reaches the engine with the engine
// client's own transport (what the hop costs without node:http on either side). Besides p50/p90/p99 and the ratios it reports where
// the difference goes: the gateway's own call to the engine (timed around Fleet.generate), the rest
// of each gateway request (its own work and the extra HTTP hop), this process's CPU per request,
// and the machine's load.
// With --stream both arms are streamed token by token, and the time to their first tokens is given.
// With --chat-template the gateway renders with that Jinja source (as for an HF model) instead of
// the byte-level model's built-in template in code; test/fixtures/builtin-template.jinja is the
// same format, so the engine's work stays the same and only the rendering differs.
// Progress on stderr; one JSON line last on stdout (goal ≤ 1.1 at p50).
import { fork, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { Agent, createServer, request } from "node:http";
import { createServer as createTcpServer, type AddressInfo, type Socket } from "node:net";
import { cpus, loadavg } from "node:os";
import { fileURLToPath } from "node:url";
import { Fleet } from "../src/engine/fleet/fleet.ts";
import { requestStream, requestText } from "../src/engine/http.ts";
import type { FleetGenerateRequest } from "../src/engine/fleet/types.ts";
import { Gateway } from "../src/gateway/index.ts";

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? Number(process.argv[i + 1]) : fallback;
}
function sarg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
}
const log = (msg: string): void => void process.stderr.write(`[bench gateway] ${msg}\n`);

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};

/** What the parent hands the client process. */
interface ClientJob {
  gateway: { url: string; key: string; body: string }[];
  direct: { url: string; body: string };
  /** The same /generate through the bare proxy. */
  proxy: string;
  /** …and through the raw-socket proxy. */
  raw: string;
  warmup: number;
}

/** Latencies of the client's requests, ms; `first*`: when a streamed answer's first tokens arrived. */
interface ClientTimes {
  gateway: number[];
  direct: number[];
  proxy: number[];
  raw: number[];
  firstText: number[];
  firstDirect: number[];
}

/** Times one request to its last byte (and, for an SSE answer, to its first content: a chat delta or /generate output ids). */
async function timed(url: string, body: string, headers: Record<string, string>): Promise<{ ms: number; firstText: number | null }> {
  const t0 = performance.now();
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  let firstText: number | null = null;
  let text = "";
  const decoder = new TextDecoder();
  const reader = res.body!.getReader();
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    text += decoder.decode(r.value, { stream: true });
    if (firstText === null && /"delta":\{"content":"[^"]|"output_ids":\[\d/.test(text)) firstText = performance.now() - t0;
  }
  const ms = performance.now() - t0;
  if (res.status !== 200) throw new Error(`${url} answered ${res.status}: ${text.slice(0, 300)}`);
  return { ms, firstText };
}

/** The client process: times the four arms, interleaved (the order rotates), and sends the latencies back. */
async function client(job: ClientJob): Promise<ClientTimes> {
  const g = job.gateway;
  const out: ClientTimes = { gateway: [], direct: [], proxy: [], raw: [], firstText: [], firstDirect: [] };
  const one = async (i: number) => {
    const t = await timed(g[i]!.url, g[i]!.body, { authorization: `Bearer ${g[i]!.key}` });
    if (i >= job.warmup) {
      out.gateway.push(t.ms);
      if (t.firstText !== null) out.firstText.push(t.firstText);
    }
  };
  const dir = async (i: number) => {
    const t = await timed(job.direct.url, job.direct.body, {});
    if (i >= job.warmup) {
      out.direct.push(t.ms);
      if (t.firstText !== null) out.firstDirect.push(t.firstText);
    }
  };
  const hop = async (i: number) => {
    const t = await timed(job.proxy, job.direct.body, {});
    if (i >= job.warmup) out.proxy.push(t.ms);
  };
  const rawHop = async (i: number) => {
    const t = await timed(job.raw, job.direct.body, {});
    if (i >= job.warmup) out.raw.push(t.ms);
  };
  const arms = [one, dir, hop, rawHop];
  // The arms rotate: each takes each place in a round equally often.
  for (let i = 0; i < g.length; i++) for (let k = 0; k < arms.length; k++) await arms[(i + k) % arms.length]!(i);
  return out;
}

/**
 * The bare proxy process: forwards each request to the engine and pipes the answer back, doing
 * nothing else — the cost of one more HTTP hop between two processes, the floor of any gateway.
 */
function proxy(engineUrl: string): void {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const up = request(`${engineUrl}${req.url ?? "/"}`, { method: req.method, agent: keepAlive, headers: { "content-type": "application/json", "content-length": body.length } }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on("error", (e) => res.destroy(e));
      up.end(body);
    });
  });
  const keepAlive = new Agent({ keepAlive: true });
  server.listen(0, "127.0.0.1", () => process.send!(`http://127.0.0.1:${(server.address() as AddressInfo).port}`));
  process.on("disconnect", () => process.exit(0));
}

/**
 * The raw-socket proxy process: parses each request just enough (head, Content-Length body), sends
 * it to the engine with the engine client's transport and writes the answer back — Content-Length
 * framed, or chunked as it arrives for a stream. Only for this benchmark's own well-formed requests.
 */
function rawProxy(engineUrl: string): void {
  const server = createTcpServer((sock) => {
    sock.setNoDelay(true);
    let buf: Buffer = Buffer.alloc(0);
    sock.on("error", () => sock.destroy());
    sock.on("data", (c: Buffer) => {
      buf = buf.length > 0 ? Buffer.concat([buf, c]) : c;
      for (;;) {
        const end = buf.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buf.toString("latin1", 0, end);
        const n = Number(/\r\ncontent-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + n) return;
        const body = buf.toString("utf8", end + 4, end + 4 + n);
        const path = head.split(" ")[1]!;
        buf = buf.subarray(end + 4 + n);
        void forward(sock, `${engineUrl}${path}`, body);
      }
    });
  });
  const forward = async (sock: Socket, url: string, body: string) => {
    const req = { method: "POST" as const, headers: { "content-type": "application/json" }, body };
    try {
      if (!body.includes('"stream":true')) {
        const r = await requestText(url, req);
        sock.write(`HTTP/1.1 ${r.status} OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(r.text)}\r\n\r\n${r.text}`);
        return;
      }
      const r = await requestStream(url, req);
      sock.write(`HTTP/1.1 ${r.status} OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n`);
      for await (const c of r.body) sock.write(`${c.length.toString(16)}\r\n${c.toString("latin1")}\r\n`, "latin1");
      sock.write("0\r\n\r\n");
    } catch {
      sock.destroy();
    }
  };
  server.listen(0, "127.0.0.1", () => process.send!(`http://127.0.0.1:${(server.address() as AddressInfo).port}`));
  process.on("disconnect", () => process.exit(0));
}

if (process.argv.includes("--proxy")) {
  proxy(process.argv[process.argv.indexOf("--proxy") + 1]!);
} else if (process.argv.includes("--raw-proxy")) {
  rawProxy(process.argv[process.argv.indexOf("--raw-proxy") + 1]!);
} else if (process.argv.includes("--client")) {
  process.once("message", (job: ClientJob) => {
    client(job).then(
      (r) => process.send!(r, () => process.exit(0)),
      (e: unknown) => {
        process.stderr.write(`[bench gateway client] ${(e as Error).stack ?? String(e)}\n`);
        process.exit(1);
      },
    );
  });
} else {
  const requests = arg("requests", 200);
  const maxTokens = arg("max-tokens", 64);
  const turns = arg("turns", 4);
  const preset = sarg("preset", "quickstart");
  // Both arms streamed (SSE, token by token): the agent's chat stream vs /generate with stream: true.
  const stream = process.argv.includes("--stream");
  const templateFile = sarg("chat-template", "");
  // Rounds before timing: the request path reaches V8's optimised code only after a few hundred
  // requests, and a gateway in a training run serves thousands.
  const warmup = arg("warmup", 300);
  const loadBefore = loadavg()[0]!;

  const engine = spawn(process.execPath, ["bin/ooze.mjs", "serve", "--preset", preset, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  engine.stdout.on("data", (d) => (out += d));
  engine.stderr.on("data", (d) => (out += d));
  const engineUrl = await new Promise<string>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`ooze serve did not start within 60 s:\n${out}`)), 60_000);
    const check = () => {
      const m = /at (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m[1]!);
      }
    };
    engine.stdout.on("data", check);
    engine.stderr.on("data", check);
    engine.once("exit", (c) => reject(new Error(`ooze serve exited (${c}):\n${out}`)));
  });
  log(`engine (${preset}) at ${engineUrl}`);

  const fleet = new Fleet({ healthIntervalMs: 0 });
  await fleet.attach(engineUrl);
  // Remembers what the gateway sent, so the direct call sends the very same ids and sampling.
  let sent: FleetGenerateRequest | null = null;
  /** Duration of each Fleet.generate the gateway made, in order (requests are sequential). */
  const fleetMs: number[] = [];
  const gw = await Gateway.start({
    fleet: {
      generate: async (req) => {
        sent = req;
        const t0 = performance.now();
        const r = await fleet.generate(req);
        fleetMs.push(performance.now() - t0);
        return r;
      },
      endSession: (id) => fleet.endSession(id),
    },
    contextLength: 512,
    model: preset,
    ...(templateFile ? { chatTemplate: readFileSync(templateFile, "utf8") } : {}),
  });
  const kid = fork(fileURLToPath(import.meta.url), ["--client"], { execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const forkProxy = (flag: string) => fork(fileURLToPath(import.meta.url), [flag, engineUrl], { execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const proxies = [forkProxy("--proxy"), forkProxy("--raw-proxy")];
  try {
    const [proxyUrl, rawUrl] = await Promise.all(
      proxies.map(
        (p) =>
          new Promise<string>((resolve, reject) => {
            p.once("message", (m) => resolve(String(m)));
            p.once("exit", (c) => reject(new Error(`a proxy process exited (${c})`)));
          }),
      ),
    );
    const messages: { role: string; content: string }[] = [{ role: "system", content: "You add numbers." }];
    for (let t = 0; t < turns; t++) messages.push({ role: "user", content: `${t}+${t + 1}=?` }, { role: "assistant", content: `${2 * t + 1}` });
    messages.push({ role: "user", content: "7+8=?" });
    const body = JSON.stringify({ model: preset, messages, max_tokens: maxTokens, ...(stream ? { stream: true } : {}) });
    // One request here records the ids and sampling the gateway sends for this conversation.
    const probe = gw.openSession({ episodeId: "bench", groupIndex: 0, temperature: 0 });
    await timed(`${probe.openaiBaseUrl}/chat/completions`, body, { authorization: `Bearer ${probe.apiKey}` });
    gw.closeSession(probe.id);
    const req = sent as FleetGenerateRequest | null;
    if (!req) throw new Error("the gateway sent nothing to the fleet");
    const sessions = Array.from({ length: warmup + requests }, () => gw.openSession({ episodeId: "bench", groupIndex: 0, temperature: 0 }));
    const job: ClientJob = {
      gateway: sessions.map((s) => ({ url: `${s.openaiBaseUrl}/chat/completions`, key: s.apiKey, body })),
      direct: { url: `${engineUrl}/generate`, body: JSON.stringify({ input_ids: Array.from(req.inputIds), sampling_params: req.sampling, return_logprob: true, ...(stream ? { stream: true } : {}) }) },
      proxy: `${proxyUrl}/generate`,
      raw: `${rawUrl}/generate`,
      warmup,
    };
    fleetMs.length = 0;
    const cpu0 = process.cpuUsage();
    const result = await new Promise<ClientTimes>((resolve, reject) => {
      kid.once("message", (m) => resolve(m as ClientTimes));
      kid.once("exit", (c) => reject(new Error(`the client process exited (${c})`)));
      kid.send(job);
    });
    const cpu = process.cpuUsage(cpu0);
    const completion = sessions.map((s) => gw.closeSession(s.id).samples[0]?.responseLength ?? 0);
    const a = result.gateway;
    const b = result.direct;
    // The timed gateway requests' own Fleet.generate calls (the warm-up ones came first).
    const f = fleetMs.slice(warmup);
    if (f.length !== a.length) throw new Error(`timed ${a.length} gateway requests but ${f.length} fleet calls`);
    const ms = (x: number) => +x.toFixed(2);
    const figures = {
      bench: "gateway",
      preset,
      stream,
      chat_template: templateFile || "built-in",
      requests,
      prompt_tokens: req.inputIds.length,
      completion_tokens_p50: quantile(completion, 0.5),
      direct_p50_ms: ms(quantile(b, 0.5)),
      direct_p90_ms: ms(quantile(b, 0.9)),
      direct_p99_ms: ms(quantile(b, 0.99)),
      // The same /generate through a bare pass-through proxy process: the cost of the extra hop alone.
      proxy_p50_ms: ms(quantile(result.proxy, 0.5)),
      proxy_p50_ratio: +(quantile(result.proxy, 0.5) / quantile(b, 0.5)).toFixed(3),
      // …and through the raw-socket proxy: the hop without node:http's server and client.
      raw_proxy_p50_ms: ms(quantile(result.raw, 0.5)),
      raw_proxy_p50_ratio: +(quantile(result.raw, 0.5) / quantile(b, 0.5)).toFixed(3),
      gateway_p50_ms: ms(quantile(a, 0.5)),
      gateway_p90_ms: ms(quantile(a, 0.9)),
      gateway_p99_ms: ms(quantile(a, 0.99)),
      // The gateway's call to the engine through the fleet (the same engine work as a direct call)…
      fleet_call_p50_ms: ms(quantile(f, 0.5)),
      // …and the rest of each gateway request: parsing, rendering, answering, the extra HTTP hop.
      outside_fleet_p50_ms: ms(quantile(a.map((x, i) => x - f[i]!), 0.5)),
      // CPU of this process (gateway + fleet client) per gateway request, warm-up included.
      gateway_cpu_ms_per_request: ms((cpu.user + cpu.system) / 1000 / (warmup + requests)),
      // Streamed: when the first text reached the agent.
      ...(stream ? { first_text_p50_ms: ms(quantile(result.firstText, 0.5)), direct_first_tokens_p50_ms: ms(quantile(result.firstDirect, 0.5)) } : {}),
      p50_ratio: +(quantile(a, 0.5) / quantile(b, 0.5)).toFixed(3),
      // The gateway against the bare proxy: what its own work adds beyond the hop.
      p50_ratio_vs_proxy: +(quantile(a, 0.5) / quantile(result.proxy, 0.5)).toFixed(3),
      p90_ratio: +(quantile(a, 0.9) / quantile(b, 0.9)).toFixed(3),
      p99_ratio: +(quantile(a, 0.99) / quantile(b, 0.99)).toFixed(3),
      // Median of the ratios of neighbouring requests: less sensitive to load that drifts during the run.
      pair_ratio_p50: +quantile(a.map((x, i) => x / b[i]!), 0.5).toFixed(3),
      goal_p50_ratio: 1.1,
      cores: cpus().length,
      load_avg_1m: [+loadBefore.toFixed(2), +loadavg()[0]!.toFixed(2)],
    };
    log(
      `gateway p50 ${figures.gateway_p50_ms} ms vs direct ${figures.direct_p50_ms} ms, bare proxy ${figures.proxy_p50_ms} ms, raw-socket proxy ${figures.raw_proxy_p50_ms} ms (${figures.completion_tokens_p50} tokens per answer); ` +
        `its fleet call ${figures.fleet_call_p50_ms} ms, the rest ${figures.outside_fleet_p50_ms} ms; load ${figures.load_avg_1m.join(" → ")} on ${figures.cores} cores`,
    );
    console.log(JSON.stringify(figures));
  } finally {
    if (kid.exitCode === null) kid.kill("SIGTERM");
    for (const p of proxies) if (p.exitCode === null) p.kill("SIGTERM");
    await gw.close();
    await fleet.close();
    engine.kill("SIGTERM");
  }
}
