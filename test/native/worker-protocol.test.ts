// The trainer worker's framing: any split of the byte stream into chunks yields the same messages,
// typed arrays intact; a corrupt body is a MalformedMessageError.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MalformedMessageError } from "../../src/errors.ts";
import { encodeFrame, FrameDecoder, type WorkerRequest } from "../../native/worker/protocol.ts";

describe("worker protocol framing", () => {
  it("decodes the same messages whatever the chunk boundaries", () => {
    const msgs: WorkerRequest[] = [
      { id: 1, op: "logprobs", args: [{ tokens: Int32Array.from([1, 2, 3]), cuSeqlens: Int32Array.from([0, 3]) }, 0.5] },
      { id: 2, op: "setParams", args: [Float32Array.from({ length: 1000 }, (_, i) => i / 7)] },
      { id: 3, op: "ping", args: [] },
    ];
    const stream = Buffer.concat(msgs.map(encodeFrame));
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: stream.length - 1 }), { maxLength: 12 }), (cuts) => {
        const points = [0, ...[...new Set(cuts)].sort((a, b) => a - b), stream.length];
        const d = new FrameDecoder();
        const out: unknown[] = [];
        for (let i = 0; i + 1 < points.length; i++) out.push(...d.push(stream.subarray(points[i], points[i + 1])));
        expect(out).toEqual(msgs);
        const p = (out[1] as WorkerRequest).args[0];
        expect(p).toBeInstanceOf(Float32Array);
      }),
      { numRuns: 100 },
    );
  });

  it("a frame whose body is not msgpack throws MalformedMessageError", () => {
    const body = Buffer.from([0xc1, 0xc1, 0xc1]); // 0xc1 is never valid msgpack
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length, 0);
    expect(() => new FrameDecoder().push(Buffer.concat([head, body]))).toThrow(MalformedMessageError);
  });
});
