import { describe, expect, it } from "vitest";
import { MalformedMessageError, OozeError, toOozeError } from "../../src/errors.ts";

describe("errors", () => {
  it("round-trips through the wire form", () => {
    const e = new MalformedMessageError("bad frame", { actor: "buffer" });
    const w = e.toWire();
    expect(w).toEqual({ code: "MALFORMED_MESSAGE", message: "bad frame", retryable: false, actor: "buffer" });
    const back = OozeError.fromWire(w);
    expect(back.code).toBe("MALFORMED_MESSAGE");
    expect(back.actor).toBe("buffer");
  });
  it("wraps foreign errors, keeping the cause", () => {
    const cause = new TypeError("x");
    const e = toOozeError(cause, "TRANSPORT");
    expect(e.code).toBe("TRANSPORT");
    expect(e.cause).toBe(cause);
  });
});
