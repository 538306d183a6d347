// engineFaultKind: how a failed engine call is named, which decides what the fleet does about it. A
// limit of the caller's own (out of file descriptors, buffers or ports) is not the engine's fault:
// the fleet keeps the engine in routing for it (src/engine/fleet/fleet.ts).
import { describe, expect, it } from "vitest";
import { EngineHttpError, engineFaultKind } from "../../src/engine/client.ts";
import { OozeError } from "../../src/errors.ts";

const lost = (code: string) =>
  new OozeError("ENGINE_UNAVAILABLE", `http://127.0.0.1:1/generate: cannot reach the engine (connect ${code})`, { retryable: true, cause: Object.assign(new Error(`connect ${code}`), { code }) });

describe("engineFaultKind", () => {
  it("names this process's own limits local-limit, a refused connection unreachable, other losses connection-lost", () => {
    for (const code of ["EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "EADDRNOTAVAIL"]) expect(engineFaultKind(lost(code))).toBe("local-limit");
    expect(engineFaultKind(lost("ECONNREFUSED"))).toBe("unreachable");
    expect(engineFaultKind(lost("ECONNRESET"))).toBe("connection-lost");
    expect(engineFaultKind(new EngineHttpError("http://e", 503, "busy"))).toBe("http-503");
    expect(engineFaultKind(new EngineHttpError("http://e", 400, "bad"))).toBeNull();
    expect(engineFaultKind(new Error("EMFILE"))).toBeNull();
  });
});
