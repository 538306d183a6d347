// Which JetStream failures a cluster gives while it elects a leader (retried by the bus and the
// loop's stream readers), and the retry itself: transient ones again until they pass or time runs
// out, anything else at once.
import { JetStreamApiError } from "@nats-io/jetstream";
import { describe, expect, it } from "vitest";
import { TimeoutError, TransportError } from "../../src/errors.ts";
import { isJetStreamTransient, toTransportError, whileElecting } from "../../src/transport/bus.ts";

const api = (err_code: number, code: number, description: string) => new JetStreamApiError({ err_code, code, description });
const timeout = () => Object.assign(new Error("timeout"), { name: "TimeoutError" });

describe("isJetStreamTransient", () => {
  it("is true for timeouts and 'temporarily unavailable', also wrapped as a cause", () => {
    expect(isJetStreamTransient(timeout())).toBe(true);
    expect(isJetStreamTransient(toTransportError(timeout(), "opening KV bucket 'b'"))).toBe(true);
    expect(isJetStreamTransient(new TimeoutError("request timed out"))).toBe(true);
    expect(isJetStreamTransient(api(10008, 503, "JetStream system temporarily unavailable"))).toBe(true);
    expect(isJetStreamTransient(new TransportError("creating stream 'S'", { cause: api(10008, 503, "JetStream system temporarily unavailable") }))).toBe(true);
  });

  it("is true for 'no suitable peers for placement' (a replica's server down or not yet seen online again)", () => {
    expect(isJetStreamTransient(api(10005, 500, "no suitable peers for placement, peer offline"))).toBe(true);
    expect(isJetStreamTransient(new TransportError("creating stream 'S' on s.>: no suitable peers for placement, peer offline"))).toBe(true);
  });

  it("is true for no responders, which nats.js reports as 'jetstream is not enabled' (a stream with no leader yet)", () => {
    // (the class is not exported: its name and message, as nats.js's publish and API requests make it)
    const noResponders = Object.assign(new Error("jetstream is not enabled"), { name: "JetStreamNotEnabled" });
    expect(isJetStreamTransient(noResponders)).toBe(true);
    expect(isJetStreamTransient(toTransportError(noResponders, "JetStream publish to 'x'"))).toBe(true);
  });

  it("is false for errors a retry cannot cure", () => {
    expect(isJetStreamTransient(api(10039, 503, "jetstream not enabled for account"))).toBe(false);
    expect(isJetStreamTransient(api(10059, 404, "stream not found"))).toBe(false);
    expect(isJetStreamTransient(api(10058, 400, "stream name already in use with a different configuration"))).toBe(false);
    expect(isJetStreamTransient(new TransportError("permissions violation"))).toBe(false);
    expect(isJetStreamTransient("timeout")).toBe(false);
  });
});

describe("whileElecting", () => {
  it("calls again after transient failures and returns the first success", async () => {
    let calls = 0;
    const v = await whileElecting(async () => {
      if (++calls < 3) throw api(10008, 503, "JetStream system temporarily unavailable");
      return "leader elected";
    });
    expect(v).toBe("leader elected");
    expect(calls).toBe(3);
  });

  it("throws another error at once, and a transient one once its time is up or the connection closed", async () => {
    let calls = 0;
    const notFound = api(10059, 404, "stream not found");
    await expect(whileElecting(async () => { calls++; throw notFound; })).rejects.toBe(notFound);
    expect(calls).toBe(1);
    calls = 0;
    const t = timeout();
    await expect(whileElecting(async () => { calls++; throw t; }, { forMs: 0 })).rejects.toBe(t);
    expect(calls).toBe(1);
    calls = 0;
    await expect(whileElecting(async () => { calls++; throw t; }, { closed: () => true })).rejects.toBe(t);
    expect(calls).toBe(1);
  });
});
