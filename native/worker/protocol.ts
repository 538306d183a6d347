// The trainer worker's wire protocol over its stdin/stdout: length-prefixed msgpack frames (4-byte
// big-endian length, then the body) carrying {id, op, args} requests and {id, ok, result | error}
// replies. Typed arrays travel as typed arrays (msgpackr's moreTypes).
import { Packr } from "msgpackr";
import { MalformedMessageError, type WireError } from "../../src/errors.ts";

/** Operations a worker serves: the Trainer's methods, plus init, ping and the test-only hang. */
export type WorkerOp =
  | "init"
  | "ping"
  | "logprobs"
  | "backward"
  | "accumulate"
  | "applyGrads"
  | "trainStep"
  | "zeroGrads"
  | "getParams"
  | "setParams"
  | "getGrads"
  | "resetOptimizer"
  | "save"
  | "load"
  | "info"
  | "hang";

/** A request to the worker. */
export interface WorkerRequest {
  id: number;
  op: WorkerOp;
  args: unknown[];
}

/** A reply: the result of request `id`, or its error. */
export type WorkerReply = { id: number; ok: true; result: unknown } | { id: number; ok: false; error: WireError };

const packr = new Packr({ moreTypes: true, useRecords: false });

/** One frame: 4-byte big-endian body length, then the msgpack body. */
export function encodeFrame(msg: WorkerRequest | WorkerReply): Buffer {
  const body = packr.pack(msg);
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length, 0);
  return Buffer.concat([head, body]);
}

/** Reassembles frames from a byte stream; push() returns every message completed by the chunk. */
export class FrameDecoder {
  private buf: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): unknown[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const out: unknown[] = [];
    while (this.buf.length >= 4) {
      const n = this.buf.readUInt32BE(0);
      if (this.buf.length < 4 + n) break;
      // Copy the body so decoded typed arrays never alias a buffer that is reused.
      const body = Buffer.from(this.buf.subarray(4, 4 + n));
      this.buf = this.buf.subarray(4 + n);
      try {
        out.push(packr.unpack(body));
      } catch (e) {
        throw new MalformedMessageError(`trainer worker frame of ${n} bytes is not valid msgpack: ${(e as Error).message}`, { cause: e });
      }
    }
    return out;
  }
}
