// Registration of engines with an external SGLang router: POST /workers {url, worker_type} and
// DELETE /workers/{id} (newer routers), falling back to /add_worker?url= and /remove_worker?url=.
import { OozeError } from "../../errors.ts";

async function call(method: string, url: string, body?: unknown, timeoutMs = 10_000): Promise<{ status: number; text: string }> {
  const init: RequestInit = { method, signal: AbortSignal.timeout(timeoutMs) };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "content-type": "application/json" };
  }
  try {
    const res = await fetch(url, init);
    return { status: res.status, text: await res.text() };
  } catch (e) {
    throw new OozeError("ENGINE_UNAVAILABLE", `${url}: cannot reach the SGLang router (${(e as Error).message}); check the fleet's router URL`, {
      retryable: true,
      cause: e,
    });
  }
}

const ok = (s: number) => s >= 200 && s < 300;

/** Client of an external SGLang router's worker registry. */
export class ExternalRouter {
  readonly url: string;
  constructor(url: string) {
    this.url = url.replace(/\/+$/, "");
  }

  /** Registers `engineUrl` as a regular worker. */
  async add(engineUrl: string): Promise<void> {
    const r = await call("POST", `${this.url}/workers`, { url: engineUrl, worker_type: "regular" });
    if (ok(r.status)) return;
    if (r.status === 404 || r.status === 405) {
      const old = await call("POST", `${this.url}/add_worker?url=${encodeURIComponent(engineUrl)}`);
      if (ok(old.status)) return;
      throw new OozeError("ENGINE_REJECTED", `${this.url}/add_worker: the router refused ${engineUrl} with ${old.status}: ${old.text.slice(0, 200)}`);
    }
    throw new OozeError("ENGINE_REJECTED", `${this.url}/workers: the router refused ${engineUrl} with ${r.status}: ${r.text.slice(0, 200)}`);
  }

  /** Deregisters `engineUrl` (no-op when the router does not know it). */
  async remove(engineUrl: string): Promise<void> {
    const list = await call("GET", `${this.url}/workers`);
    if (ok(list.status)) {
      let workers: { id?: unknown; url?: unknown }[] = [];
      try {
        const j = JSON.parse(list.text) as { workers?: unknown };
        if (Array.isArray(j.workers)) workers = j.workers as typeof workers;
      } catch {
        // not the newer API's JSON: fall through to the older endpoint
      }
      const w = workers.find((x) => x.url === engineUrl);
      if (w && (typeof w.id === "string" || typeof w.id === "number")) {
        const r = await call("DELETE", `${this.url}/workers/${encodeURIComponent(String(w.id))}`);
        if (ok(r.status) || r.status === 404) return;
        throw new OozeError("ENGINE_REJECTED", `${this.url}/workers/${String(w.id)}: the router refused to remove ${engineUrl} with ${r.status}`);
      }
      if (workers.length > 0 || list.text.includes('"workers"')) return;
    }
    const old = await call("POST", `${this.url}/remove_worker?url=${encodeURIComponent(engineUrl)}`);
    if (ok(old.status) || old.status === 404) return;
    throw new OozeError("ENGINE_REJECTED", `${this.url}/remove_worker: the router refused to remove ${engineUrl} with ${old.status}`);
  }
}
