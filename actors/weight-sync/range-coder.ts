// An adaptive binary range coder (the LZMA scheme: 11-bit probabilities, carry propagation through a
// cached byte) and, on top of it, a coder for the zigzag differences of a weight delta: each value is
// coded as its bit length (a 6-bit tree, adaptive per context) then its bits below the leading one
// (the three highest adaptive per context and length, the rest at even odds). The context is the base
// element's exponent, which decoder and encoder both know: a step of similar size changes small
// weights by more ulps than large ones, so per-exponent statistics code it in fewer bits.
import { OozeError } from "../../src/errors.ts";

const TOP = 2 ** 24;
const PROB_BITS = 11;
const PROB_INIT = 1 << (PROB_BITS - 1);
const MOVE = 4;

class Encoder {
  private low = 0; // up to 2^32 + carry: kept in a double
  private range = 0xffffffff;
  private cache = 0;
  private cacheSize = 1;
  private out: Uint8Array;
  private n = 0;

  constructor(sizeHint: number) {
    this.out = new Uint8Array(Math.max(64, sizeHint));
  }

  private byte(b: number): void {
    if (this.n === this.out.length) {
      const grown = new Uint8Array(this.out.length * 2);
      grown.set(this.out);
      this.out = grown;
    }
    this.out[this.n++] = b & 0xff;
  }

  private shiftLow(): void {
    if (this.low < 0xff000000 || this.low >= 0x100000000) {
      const carry = this.low >= 0x100000000 ? 1 : 0;
      let temp = this.cache;
      do {
        this.byte(temp + carry);
        temp = 0xff;
      } while (--this.cacheSize !== 0);
      this.cache = Math.floor(this.low / TOP) & 0xff;
    }
    this.cacheSize++;
    this.low = (this.low % TOP) * 256;
  }

  bit(probs: Uint16Array, i: number, bit: number): void {
    const p = probs[i]!;
    const bound = (this.range >>> PROB_BITS) * p;
    if (bit === 0) {
      this.range = bound;
      probs[i] = p + ((2048 - p) >> MOVE);
    } else {
      this.low += bound;
      this.range -= bound;
      probs[i] = p - (p >> MOVE);
    }
    while (this.range < TOP) {
      this.range = (this.range << 8) >>> 0;
      this.shiftLow();
    }
  }

  direct(bit: number): void {
    this.range >>>= 1;
    if (bit) this.low += this.range;
    while (this.range < TOP) {
      this.range = (this.range << 8) >>> 0;
      this.shiftLow();
    }
  }

  finish(): Uint8Array {
    for (let i = 0; i < 5; i++) this.shiftLow();
    return this.out.slice(0, this.n);
  }
}

/** Adaptive bits below the leading one. */
const TOP_BITS = 3;

/** Per-context models: a 64-leaf tree for the bit length, a 2^TOP_BITS-node tree per length for the bits below the leading one. */
function models(contexts: number): { len: Uint16Array; top: Uint16Array } {
  return { len: new Uint16Array(contexts * 64).fill(PROB_INIT), top: new Uint16Array(contexts * 33 * (1 << TOP_BITS)).fill(PROB_INIT) };
}

const bitLength = (z: number) => (z === 0 ? 0 : 32 - Math.clz32(z));

/** Codes `values` (zigzag differences, each below 2^32) with `ctx[i]` in 0..255 as context of value i. */
export function encodeValues(values: Uint32Array, ctx: Uint8Array): Uint8Array {
  const enc = new Encoder(values.length);
  const m = models(256);
  for (let i = 0; i < values.length; i++) {
    const z = values[i]!, c = ctx[i]!;
    const b = bitLength(z);
    let node = 1;
    for (let k = 5; k >= 0; k--) {
      const bit = (b >>> k) & 1;
      enc.bit(m.len, c * 64 + node, bit);
      node = (node << 1) | bit;
    }
    if (b < 2) continue;
    let prefix = 1;
    for (let k = b - 2; k >= 0; k--) {
      const bit = (z >>> k) & 1;
      if (k >= b - 1 - TOP_BITS) {
        enc.bit(m.top, ((c * 33 + b) << TOP_BITS) + prefix, bit);
        prefix = (prefix << 1) | bit;
      } else enc.direct(bit);
    }
  }
  return enc.finish();
}

/**
 * Decodes `n` values coded by encodeValues with the same contexts. The Decoder's steps are inlined
 * here with the state in locals (the hot loop of applying a delta; several times faster in V8).
 */
export function decodeValues(data: Uint8Array, n: number, ctx: Uint8Array, maxBits: number, what: string): Uint32Array {
  const m = models(256);
  const len = m.len, top = m.top;
  const out = new Uint32Array(n);
  const size = data.length;
  let pos = 0, range = 0xffffffff, code = 0;
  for (let k = 0; k < 5; k++) code = (code * 256 + (pos < size ? data[pos]! : 0)) % 0x100000000, pos++;
  for (let i = 0; i < n; i++) {
    const c = ctx[i]!;
    const lenBase = c << 6;
    let node = 1;
    for (let k = 0; k < 6; k++) {
      const j = lenBase + node;
      const p = len[j]!;
      const bound = (range >>> PROB_BITS) * p;
      if (code < bound) {
        range = bound;
        len[j] = p + ((2048 - p) >> MOVE);
        node <<= 1;
      } else {
        code -= bound;
        range -= bound;
        len[j] = p - (p >> MOVE);
        node = (node << 1) | 1;
      }
      if (range < TOP) {
        range = (range << 8) >>> 0;
        code = ((code << 8) | (pos < size ? data[pos]! : 0)) >>> 0;
        pos++;
      }
    }
    const b = node - 64;
    if (b > maxBits) throw new OozeError("CHECKPOINT_INVALID", `weight delta: ${what} decodes to a ${b}-bit value; the file is corrupt`);
    if (b < 2) {
      out[i] = b;
      continue;
    }
    let z = 1, prefix = 1;
    const topBase = (c * 33 + b) << TOP_BITS;
    for (let k = b - 2; k >= 0; k--) {
      let bit: number;
      if (k >= b - 1 - TOP_BITS) {
        const j = topBase + prefix;
        const p = top[j]!;
        const bound = (range >>> PROB_BITS) * p;
        if (code < bound) {
          range = bound;
          top[j] = p + ((2048 - p) >> MOVE);
          bit = 0;
        } else {
          code -= bound;
          range -= bound;
          top[j] = p - (p >> MOVE);
          bit = 1;
        }
        prefix = (prefix << 1) | bit;
      } else {
        range >>>= 1;
        if (code >= range) {
          code -= range;
          bit = 1;
        } else bit = 0;
      }
      if (range < TOP) {
        range = (range << 8) >>> 0;
        code = ((code << 8) | (pos < size ? data[pos]! : 0)) >>> 0;
        pos++;
      }
      z = z * 2 + bit;
    }
    out[i] = z >>> 0;
  }
  if (pos > size + 4) throw new OozeError("CHECKPOINT_INVALID", `weight delta: ${what} is truncated; the file is corrupt`);
  return out;
}
