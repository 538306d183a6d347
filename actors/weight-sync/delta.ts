// Lossless weight deltas: the difference between two versions of a model's parameters, per tensor
// the smallest of the candidate encodings: "sub" (the integer difference of the bit patterns,
// zigzag-coded), "sub-exp" (the same, ordered by the base element's exponent, so elements whose
// changes have similar sizes in ulps sit together), "xor" (bit patterns XOR the base) — all as byte
// planes, so the mostly-zero high bytes of a small update compress to almost nothing, then deflated —
// "overwrite" (gaps and new values of the elements that changed, for sparse updates, deflated), or
// "sub-ac" (the differences range-coded with the base element's exponent as context,
// range-coder.ts); with a CRC32 of each tensor before and after. The wire is fp32 (exact trainer
// weights) or bf16 (both versions rounded to bf16, held as fp32 containers whose low 16 bits are
// zero: only the high halves travel). Applying checks the base version and checksums, so a delta
// applies only to the exact weights it was made from, and re-applying an applied delta is a no-op.
import { constants, crc32, deflateRawSync, inflateRawSync } from "node:zlib";
import { Packr } from "msgpackr";
import { OozeError } from "../../src/errors.ts";
import { decodeValues, encodeValues } from "./range-coder.ts";

/** Where one tensor lives in a flat parameter buffer. */
export interface TensorSlot {
  name: string;
  /** Offset in floats. */
  offset: number;
  numel: number;
}

/** The slots of a model's tensors (as loadModelDir lists them: name, offset in floats, shape). */
export function tensorLayout(tensors: readonly { name: string; offset: number; shape: readonly number[] }[]): TensorSlot[] {
  return tensors.map((t) => ({ name: t.name, offset: t.offset, numel: t.shape.reduce((a, b) => a * b, 1) }));
}

/** How one tensor's change is coded. */
export type DeltaEncoding = "same" | "sub" | "sub-exp" | "sub-ac" | "xor" | "overwrite";

/** The element format on the wire: fp32 bit patterns, or bf16 (the high 16 bits of fp32). */
export type DeltaWire = "fp32" | "bf16";

/** One tensor of a delta file. */
export interface DeltaTensor {
  name: string;
  encoding: DeltaEncoding;
  numel: number;
  /** Bytes per coded element: 4 (fp32) or 2 (bf16 high halves; low halves are zero). */
  width: 4 | 2;
  baseCrc: number;
  crc: number;
  data: Uint8Array;
}

/** A decoded delta file. */
export interface WeightDelta {
  format: "ooze-delta";
  v: 2;
  wire: DeltaWire;
  baseVersion: string;
  version: string;
  tensors: DeltaTensor[];
}

/** Options of encodeDelta. */
export interface EncodeOptions {
  /** Default "fp32". With "bf16", base and next must already be bf16-exact (see roundToBf16). */
  wire?: DeltaWire;
  /** Deflate level 1..9 (default 6 on the fp32 wire; 1 on bf16, where deflate is only the fallback of sub-ac: same sizes measured, ~40 % less encode time). */
  level?: number;
  /** Encodings to choose from (default: DEFAULT_ENCODINGS of the wire). */
  encodings?: readonly Exclude<DeltaEncoding, "same">[];
}

const packr = new Packr({ useRecords: false });
/** The share of bytes sub-ac must save over the best deflate encoding to be chosen. */
const AC_MIN_GAIN = 0.08;
/**
 * Default candidates per wire. "sub" and "xor" never won by a useful margin in measurements; on the
 * fp32 wire "sub-ac" saves ~3 % more than "sub-exp" at ~5x the encode time (it codes ~20 bits a
 * value), so it is left out there (pass opts.encodings to use it).
 */
const DEFAULT_ENCODINGS: Record<DeltaWire, readonly Exclude<DeltaEncoding, "same">[]> = {
  fp32: ["sub-exp", "overwrite"],
  bf16: ["sub-exp", "sub-ac", "overwrite"],
};

function bytesOf(a: Float32Array, slot: TensorSlot): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset + slot.offset * 4, slot.numel * 4);
}

function wordsOf(a: Float32Array, slot: TensorSlot): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset + slot.offset * 4, slot.numel);
}

/** Rounds fp32 values to bf16 (round to nearest even; NaN stays a quiet NaN), as fp32 containers. */
export function roundToBf16(a: Float32Array): Float32Array {
  const out = new Float32Array(a.length);
  const src = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const dst = new Uint32Array(out.buffer);
  for (let i = 0; i < src.length; i++) {
    const x = src[i]!;
    if ((x & 0x7f800000) === 0x7f800000 && (x & 0x7fffff) !== 0) dst[i] = (x | 0x400000) & 0xffff0000;
    else dst[i] = ((x + 0x7fff + ((x >>> 16) & 1)) & 0xffff0000) >>> 0;
  }
  return out;
}

/** True when every value of `a` is bf16-exact (low 16 bits zero). */
export function isBf16Exact(a: Float32Array): boolean {
  const u = new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (let i = 0; i < u.length; i++) if ((u[i]! & 0xffff) !== 0) return false;
  return true;
}

/** The coded units of a tensor: whole words (width 4) or their high halves (width 2). */
function unitsOf(w: Uint32Array, width: 4 | 2): Uint32Array {
  if (width === 4) return w;
  const u = new Uint32Array(w.length);
  for (let i = 0; i < w.length; i++) u[i] = w[i]! >>> 16;
  return u;
}

/** Byte planes of `width`-byte values: all low bytes, then all next bytes, … */
function toPlanes(v: Uint32Array, width: number): Uint8Array {
  const n = v.length;
  const out = new Uint8Array(n * width);
  for (let p = 0; p < width; p++) {
    const shift = 8 * p, o = p * n;
    for (let i = 0; i < n; i++) out[o + i] = (v[i]! >>> shift) & 0xff;
  }
  return out;
}

function fromPlanes(b: Uint8Array, n: number, width: number, what: string): Uint32Array {
  if (b.length !== n * width) throw new OozeError("CHECKPOINT_INVALID", `weight delta: ${what} has ${b.length} bytes, expected ${n * width}`);
  const v = new Uint32Array(n);
  for (let p = 0; p < width; p++) {
    const shift = 8 * p, o = p * n;
    for (let i = 0; i < n; i++) v[i] = (v[i]! | (b[o + i]! << shift)) >>> 0;
  }
  return v;
}

/** Zigzag of (next − base) modulo 2^(8·width): small changes either way become small numbers. */
function subCode(base: Uint32Array, next: Uint32Array, width: 4 | 2): Uint32Array {
  const out = new Uint32Array(base.length);
  const sh = 32 - 8 * width; // sign-extend a width-byte difference
  for (let i = 0; i < base.length; i++) {
    const d = (((next[i]! - base[i]!) << sh) >> sh) | 0;
    out[i] = ((d << 1) ^ (d >> 31)) >>> 0;
  }
  return out;
}

function subDecode(base: Uint32Array, code: Uint32Array, width: 4 | 2): Uint32Array {
  const out = new Uint32Array(base.length);
  const mask = width === 4 ? 0xffffffff : 0xffff;
  for (let i = 0; i < base.length; i++) {
    const z = code[i]!;
    const d = (z >>> 1) ^ -(z & 1);
    out[i] = ((base[i]! + d) & mask) >>> 0;
  }
  return out;
}

/** The exponent byte of each base unit: the range coder's context. */
function exponentContext(base: Uint32Array, width: 4 | 2): Uint8Array {
  const shift = width === 4 ? 23 : 7;
  const c = new Uint8Array(base.length);
  for (let i = 0; i < base.length; i++) c[i] = (base[i]! >>> shift) & 0xff;
  return c;
}

/** Element order by the exponent of the base unit (stable counting sort), known to encoder and decoder. */
function exponentOrder(base: Uint32Array, width: 4 | 2): Uint32Array {
  const shift = width === 4 ? 23 : 7;
  const counts = new Uint32Array(257);
  for (let i = 0; i < base.length; i++) counts[((base[i]! >>> shift) & 0xff) + 1]!++;
  for (let k = 1; k < 257; k++) counts[k]! += counts[k - 1]!;
  const order = new Uint32Array(base.length);
  for (let i = 0; i < base.length; i++) order[counts[(base[i]! >>> shift) & 0xff]!++] = i;
  return order;
}

/** Changed positions as gaps, then the new values: [count, gaps…] as 4 planes, values as `width` planes. */
function overwriteCode(base: Uint32Array, next: Uint32Array, width: 4 | 2): Uint8Array | null {
  let k = 0;
  for (let i = 0; i < base.length; i++) if (base[i] !== next[i]) k++;
  if (k * (4 + width) >= base.length * width) return null; // not smaller than a dense coding before compression
  const gaps = new Uint32Array(k + 1), vals = new Uint32Array(k);
  gaps[0] = k;
  let last = -1, j = 0;
  for (let i = 0; i < base.length; i++) {
    if (base[i] !== next[i]) {
      gaps[1 + j] = i - last;
      vals[j++] = next[i]!;
      last = i;
    }
  }
  const g = toPlanes(gaps, 4), v = toPlanes(vals, width);
  const out = new Uint8Array(g.length + v.length);
  out.set(g);
  out.set(v, g.length);
  return out;
}

function overwriteDecode(base: Uint32Array, raw: Uint8Array, width: 4 | 2, name: string): Uint32Array {
  const n = countOf(raw, width);
  const gaps = fromPlanes(raw.subarray(0, 4 * (n + 1)), n + 1, 4, `overwrite gaps of ${name}`);
  if (gaps[0] !== n) throw new OozeError("CHECKPOINT_INVALID", `weight delta: overwrite list of ${name} says ${gaps[0]} elements, its size ${n}`);
  const vals = fromPlanes(raw.subarray(4 * (n + 1)), n, width, `overwrite values of ${name}`);
  const out = base.slice();
  let pos = -1;
  for (let j = 0; j < n; j++) {
    pos += gaps[1 + j]!;
    if (pos >= out.length) throw new OozeError("CHECKPOINT_INVALID", `weight delta: overwrite position ${pos} is outside ${name} (${out.length} elements)`);
    out[pos] = vals[j]!;
  }
  return out;
}

/** The element count of an overwrite list: total = 4(k+1) + width·k bytes. */
function countOf(raw: Uint8Array, width: number): number {
  const k = (raw.length - 4) / (4 + width);
  if (!Number.isInteger(k) || k < 0) throw new OozeError("CHECKPOINT_INVALID", `weight delta: overwrite list of ${raw.length} bytes is malformed`);
  return k;
}

/** Encodes the delta from `base` (version baseVersion) to `next` (version). */
export function encodeDelta(
  layout: readonly TensorSlot[],
  base: Float32Array,
  next: Float32Array,
  baseVersion: string,
  version: string,
  opts: EncodeOptions = {},
): Uint8Array {
  if (base.length !== next.length) throw new RangeError(`delta: base has ${base.length} floats, next ${next.length}`);
  const wire = opts.wire ?? "fp32";
  const width: 4 | 2 = wire === "bf16" ? 2 : 4;
  if (wire === "bf16" && !(isBf16Exact(base) && isBf16Exact(next)))
    throw new RangeError("delta: the bf16 wire needs bf16-exact base and next weights (round them with roundToBf16 first)");
  const level = opts.level ?? (wire === "bf16" ? 1 : 6);
  const allowed = opts.encodings ?? DEFAULT_ENCODINGS[wire];
  const deflate = (b: Uint8Array) => deflateRawSync(b, { level, strategy: constants.Z_DEFAULT_STRATEGY });
  const tensors: DeltaTensor[] = layout.map((slot) => {
    const b = bytesOf(base, slot);
    const n = bytesOf(next, slot);
    const baseCrc = crc32(b);
    const crc = crc32(n);
    const common = { name: slot.name, numel: slot.numel, width, baseCrc, crc };
    if (baseCrc === crc && Buffer.compare(b, n) === 0) return { ...common, encoding: "same", data: new Uint8Array(0) };
    const bu = unitsOf(wordsOf(base, slot), width);
    const nu = unitsOf(wordsOf(next, slot), width);
    let best: DeltaTensor | null = null;
    let acData: Uint8Array | null = null;
    for (const enc of allowed) {
      if (enc === "sub-ac") {
        acData = encodeValues(subCode(bu, nu, width), exponentContext(bu, width));
        continue;
      }
      let raw: Uint8Array | null;
      if (enc === "sub") raw = toPlanes(subCode(bu, nu, width), width);
      else if (enc === "sub-exp") {
        const z = subCode(bu, nu, width), order = exponentOrder(bu, width);
        const g = new Uint32Array(z.length);
        for (let k = 0; k < g.length; k++) g[k] = z[order[k]!]!;
        raw = toPlanes(g, width);
      }
      else if (enc === "xor") {
        const x = new Uint32Array(bu.length);
        for (let i = 0; i < x.length; i++) x[i] = (bu[i]! ^ nu[i]!) >>> 0;
        raw = toPlanes(x, width);
      } else raw = overwriteCode(bu, nu, width);
      if (!raw) continue;
      const data = deflate(raw);
      if (!best || data.length < best.data.length) best = { ...common, encoding: enc, data };
    }
    // The range coder decodes several times slower than inflate (in JS): it must save AC_MIN_GAIN.
    if (acData && (!best || acData.length < best.data.length * (1 - AC_MIN_GAIN))) best = { ...common, encoding: "sub-ac", data: acData };
    if (!best) throw new RangeError("delta: no encoding allowed for a changed tensor (opts.encodings is empty)");
    return best;
  });
  const delta: WeightDelta = { format: "ooze-delta", v: 2, wire, baseVersion, version, tensors };
  return packr.pack(delta);
}

/** Decodes and checks the structure of a delta file. */
export function decodeDelta(bytes: Uint8Array): WeightDelta {
  let d: WeightDelta;
  try {
    d = packr.unpack(bytes) as WeightDelta;
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `weight delta: not a msgpack document (${(e as Error).message})`, { cause: e });
  }
  if (d?.format !== "ooze-delta" || !Array.isArray(d.tensors))
    throw new OozeError("CHECKPOINT_INVALID", "weight delta: not an ooze-delta file");
  if (d.v !== 2) throw new OozeError("CHECKPOINT_INVALID", `weight delta: version ${String(d.v)} of the format is not supported (this build reads v2); re-encode it`);
  for (const t of d.tensors) {
    const ok = typeof t?.name === "string" && Number.isInteger(t.numel) && (t.width === 4 || t.width === 2) &&
      ["same", "sub", "sub-exp", "sub-ac", "xor", "overwrite"].includes(t.encoding) && t.data instanceof Uint8Array;
    if (!ok) throw new OozeError("CHECKPOINT_INVALID", `weight delta: malformed tensor entry ${JSON.stringify(t?.name ?? null)}`);
  }
  return d;
}

function inflate(t: DeltaTensor): Uint8Array {
  try {
    return inflateRawSync(t.data);
  } catch (e) {
    throw new OozeError("CHECKPOINT_INVALID", `weight delta: data of ${t.name} does not inflate (${(e as Error).message}); the file is corrupt`, { cause: e });
  }
}

/** The new words of one tensor from its base words and coded change. */
function decodeTensor(t: DeltaTensor, base: Uint32Array): Uint32Array {
  if (t.encoding === "same") return base.slice();
  const w = t.width;
  const bu = unitsOf(base, w);
  let nu: Uint32Array;
  const raw = t.encoding === "sub-ac" ? t.data : inflate(t);
  if (t.encoding === "sub-ac") nu = subDecode(bu, decodeValues(raw, bu.length, exponentContext(bu, w), 8 * w, `data of ${t.name}`), w);
  else if (t.encoding === "sub") nu = subDecode(bu, fromPlanes(raw, bu.length, w, `data of ${t.name}`), w);
  else if (t.encoding === "sub-exp") {
    const g = fromPlanes(raw, bu.length, w, `data of ${t.name}`), order = exponentOrder(bu, w);
    const z = new Uint32Array(g.length);
    for (let k = 0; k < g.length; k++) z[order[k]!] = g[k]!;
    nu = subDecode(bu, z, w);
  }
  else if (t.encoding === "xor") {
    const x = fromPlanes(raw, bu.length, w, `data of ${t.name}`);
    nu = new Uint32Array(bu.length);
    for (let i = 0; i < nu.length; i++) nu[i] = (bu[i]! ^ x[i]!) >>> 0;
  } else nu = overwriteDecode(bu, raw, w, t.name);
  if (w === 4) return nu;
  for (let i = 0; i < nu.length; i++) nu[i] = (nu[i]! << 16) >>> 0;
  return nu;
}

/**
 * Applies a delta in place to `params` (the weights of `currentVersion`). Returns "applied", or
 * "already-applied" when `currentVersion` is already the delta's version and every tensor's checksum
 * matches. Throws when the base does not match or the file is corrupt: nothing is changed then.
 */
export function applyDelta(
  layout: readonly TensorSlot[],
  params: Float32Array,
  currentVersion: string,
  delta: WeightDelta,
): "applied" | "already-applied" {
  const bySlot = new Map(layout.map((s) => [s.name, s]));
  const check = (which: "baseCrc" | "crc") =>
    delta.tensors.every((t) => {
      const slot = bySlot.get(t.name);
      return slot !== undefined && slot.numel === t.numel && crc32(bytesOf(params, slot)) === t[which];
    });
  if (currentVersion === delta.version && check("crc")) return "already-applied";
  if (currentVersion !== delta.baseVersion)
    throw new OozeError("CHECKPOINT_INVALID", `weight delta ${delta.baseVersion}→${delta.version} does not apply to version ${currentVersion}`);
  for (const t of delta.tensors) {
    const slot = bySlot.get(t.name);
    if (!slot || slot.numel !== t.numel)
      throw new OozeError("CHECKPOINT_INVALID", `weight delta: tensor ${t.name} (${t.numel} elements) is not in this model's layout`);
    if (crc32(bytesOf(params, slot)) !== t.baseCrc)
      throw new OozeError("CHECKPOINT_INVALID", `weight delta: base checksum of ${t.name} does not match: these are not the weights of version ${delta.baseVersion}`);
  }
  // Decode everything before writing anything, so a corrupt tensor leaves params untouched.
  const decoded = delta.tensors.map((t) => {
    const slot = bySlot.get(t.name)!;
    const out = decodeTensor(t, wordsOf(params, slot));
    if (crc32(new Uint8Array(out.buffer, out.byteOffset, out.byteLength)) !== t.crc)
      throw new OozeError("CHECKPOINT_INVALID", `weight delta: checksum of ${t.name} after applying does not match; the delta file is corrupt`);
    return { slot, out };
  });
  for (const { slot, out } of decoded) wordsOf(params, slot).set(out);
  return "applied";
}
