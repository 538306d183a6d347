// Lossless weight deltas: the difference between two versions of a model's fp32 parameters,
// per tensor either XOR-encoded (bit patterns XOR the base, byte planes shuffled so the unchanged
// sign/exponent bytes compress to almost nothing) or as an overwrite list (indices and new values of
// the elements that changed), whichever is smaller, deflate-compressed, with a CRC32 of each tensor
// before and after. Applying checks the base version and checksums, so a delta applies only to the
// exact weights it was made from, and re-applying an already applied delta is a no-op.
import { constants, crc32, deflateRawSync, inflateRawSync } from "node:zlib";
import { Packr } from "msgpackr";
import { OozeError } from "../../src/errors.ts";

/** Where one tensor lives in a flat parameter buffer. */
export interface TensorSlot {
  name: string;
  /** Offset in floats. */
  offset: number;
  numel: number;
}

export type DeltaEncoding = "same" | "xor" | "overwrite";

interface DeltaTensor {
  name: string;
  encoding: DeltaEncoding;
  numel: number;
  baseCrc: number;
  crc: number;
  data: Uint8Array;
}

/** A decoded delta file. */
export interface WeightDelta {
  format: "ooze-delta";
  v: 1;
  baseVersion: string;
  version: string;
  tensors: DeltaTensor[];
}

const packr = new Packr({ useRecords: false });

function bytesOf(a: Float32Array, slot: TensorSlot): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset + slot.offset * 4, slot.numel * 4);
}

function deflate(b: Uint8Array): Uint8Array {
  return deflateRawSync(b, { level: 1, strategy: constants.Z_DEFAULT_STRATEGY });
}

/** XOR of the bit patterns, bytes regrouped into 4 planes (all byte 0s, then byte 1s, …). */
function xorShuffle(base: Uint8Array, next: Uint8Array): Uint8Array {
  const n = base.length / 4;
  const out = new Uint8Array(base.length);
  for (let i = 0; i < n; i++) {
    const j = i * 4;
    out[i] = base[j]! ^ next[j]!;
    out[n + i] = base[j + 1]! ^ next[j + 1]!;
    out[2 * n + i] = base[j + 2]! ^ next[j + 2]!;
    out[3 * n + i] = base[j + 3]! ^ next[j + 3]!;
  }
  return out;
}

function unXorShuffle(base: Uint8Array, planes: Uint8Array, out: Uint8Array): void {
  const n = base.length / 4;
  for (let i = 0; i < n; i++) {
    const j = i * 4;
    out[j] = base[j]! ^ planes[i]!;
    out[j + 1] = base[j + 1]! ^ planes[n + i]!;
    out[j + 2] = base[j + 2]! ^ planes[2 * n + i]!;
    out[j + 3] = base[j + 3]! ^ planes[3 * n + i]!;
  }
}

/** Changed positions as gaps (Uint32) followed by the new bit patterns (Uint32). */
function overwriteList(base: Uint32Array, next: Uint32Array): Uint8Array | null {
  const gaps: number[] = [];
  const vals: number[] = [];
  let last = -1;
  for (let i = 0; i < base.length; i++) {
    if (base[i] !== next[i]) {
      gaps.push(i - last);
      vals.push(next[i]!);
      last = i;
      if (gaps.length > base.length / 4) return null; // denser than XOR could be
    }
  }
  const out = new Uint32Array(1 + gaps.length * 2);
  out[0] = gaps.length;
  out.set(gaps, 1);
  out.set(vals, 1 + gaps.length);
  return new Uint8Array(out.buffer);
}

/** Encodes the delta from `base` (version baseVersion) to `next` (version). */
export function encodeDelta(
  layout: readonly TensorSlot[],
  base: Float32Array,
  next: Float32Array,
  baseVersion: string,
  version: string,
): Uint8Array {
  if (base.length !== next.length) throw new RangeError(`delta: base has ${base.length} floats, next ${next.length}`);
  const tensors: DeltaTensor[] = layout.map((slot) => {
    const b = bytesOf(base, slot);
    const n = bytesOf(next, slot);
    const baseCrc = crc32(b);
    const crc = crc32(n);
    const common = { name: slot.name, numel: slot.numel, baseCrc, crc };
    if (baseCrc === crc && Buffer.compare(b, n) === 0) return { ...common, encoding: "same", data: new Uint8Array(0) };
    const bu = new Uint32Array(base.buffer, base.byteOffset + slot.offset * 4, slot.numel);
    const nu = new Uint32Array(next.buffer, next.byteOffset + slot.offset * 4, slot.numel);
    const list = overwriteList(bu, nu);
    const xor = deflate(xorShuffle(b, n));
    if (list) {
      const ow = deflate(list);
      if (ow.length < xor.length) return { ...common, encoding: "overwrite", data: ow };
    }
    return { ...common, encoding: "xor", data: xor };
  });
  const delta: WeightDelta = { format: "ooze-delta", v: 1, baseVersion, version, tensors };
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
  if (d?.format !== "ooze-delta" || d.v !== 1 || !Array.isArray(d.tensors))
    throw new OozeError("CHECKPOINT_INVALID", "weight delta: not an ooze-delta v1 file");
  return d;
}

/**
 * Applies a delta in place to `params` (the weights of `currentVersion`). Returns "applied", or
 * "already-applied" when `currentVersion` is already the delta's version and every tensor's checksum
 * matches. Throws when the base does not match: nothing is changed in that case.
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
    const base = bytesOf(params, slot);
    const out = new Uint8Array(base.length);
    if (t.encoding === "same") out.set(base);
    else if (t.encoding === "xor") unXorShuffle(base, inflateRawSync(t.data), out);
    else {
      out.set(base);
      const raw = inflateRawSync(t.data);
      const u = new Uint32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
      const n = u[0]!;
      const o = new Uint32Array(out.buffer);
      let pos = -1;
      for (let k = 0; k < n; k++) {
        pos += u[1 + k]!;
        o[pos] = u[1 + n + k]!;
      }
    }
    if (crc32(out) !== t.crc) throw new OozeError("CHECKPOINT_INVALID", `weight delta: checksum of ${t.name} after applying does not match`);
    return { slot, out };
  });
  for (const { slot, out } of decoded) bytesOf(params, slot).set(out);
  return "applied";
}
