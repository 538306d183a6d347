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
  | "saveOptimizer"
  | "loadOptimizer"
  | "info"
  | "ensureValueHead"
  | "setValueHead"
  | "getValueHead"
  | "setLora"
  | "getLora"
  | "saveLora"
  | "loadLora"
  | "hang";

/**
 * A request to the worker. `target: "critic"` sends it to the worker's second Trainer, a separate
 * value model (PPO with `critic: separate`); absent, to the policy.
 */
export interface WorkerRequest {
  id: number;
  op: WorkerOp;
  args: unknown[];
  target?: "critic";
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

/**
 * Reassembles frames from a byte stream; push() returns every message completed by the chunk. Chunks
 * are kept in a list until a whole frame is there, so a large frame costs one copy, not one per chunk.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private size = 0;
  private need = -1; // body length of the frame being read, -1 until its header is complete

  push(chunk: Buffer): unknown[] {
    this.chunks.push(chunk);
    this.size += chunk.length;
    const out: unknown[] = [];
    for (;;) {
      if (this.need < 0) {
        if (this.size < 4) break;
        this.need = this.take(4).readUInt32BE(0);
      }
      if (this.size < this.need) break;
      const body = this.take(this.need);
      const n = this.need;
      this.need = -1;
      try {
        out.push(packr.unpack(body));
      } catch (e) {
        throw new MalformedMessageError(`trainer worker frame of ${n} bytes is not valid msgpack: ${(e as Error).message}`, { cause: e });
      }
    }
    return out;
  }

  /** Removes and returns the first n buffered bytes as a fresh buffer (decoded typed arrays never alias the stream's). */
  private take(n: number): Buffer {
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    while (off < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.size -= n;
    return out;
  }
}
