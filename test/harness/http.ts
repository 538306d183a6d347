// A POST for tests of HTTP servers: the status, the body as text, and the body parsed as JSON when it
// is JSON (null otherwise, e.g. an event stream).
export async function postJson(url: string, body: unknown): Promise<{ status: number; json: any; text: string }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await res.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, json, text };
}
