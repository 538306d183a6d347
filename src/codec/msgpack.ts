// msgpack encoding of ooze values: typed arrays (Int32Array, Float32Array, Uint8Array, Float64Array,
// BigInt64Array, ...) cross the wire as themselves, not as number[]; garbage input never escapes as
// anything but a MalformedMessageError.
import { Packr } from "msgpackr";
import { MalformedMessageError } from "../errors.ts";

// One shared packer. `useRecords: false` keeps frames self-describing (no shared structures between
// processes); `moreTypes: true` encodes every typed array as a msgpack extension that decodes to the
// same typed array class (copied into an aligned buffer); int64 values decode as bigint, so a BigInt
// survives a round trip. Maps decode as plain objects.
const packr = new Packr({
  useRecords: false,
  moreTypes: true,
  int64AsType: "bigint",
  mapsAsObjects: true,
});

/** Encodes a value to msgpack bytes. Throws MalformedMessageError if the value cannot be encoded. */
export function encode(value: unknown): Uint8Array {
  try {
    return packr.pack(value);
  } catch (e) {
    throw new MalformedMessageError(`cannot encode value as msgpack: ${(e as Error).message}`, { cause: e });
  }
}

/**
 * Decodes msgpack bytes. Any failure (truncated frame, unknown extension, trailing garbage) becomes a
 * MalformedMessageError; the caller validates the shape of the result.
 */
export function decode(bytes: Uint8Array): unknown {
  if (!(bytes instanceof Uint8Array)) {
    throw new MalformedMessageError(`frame is not bytes (got ${describe(bytes)})`);
  }
  if (bytes.length === 0) throw new MalformedMessageError("empty frame (0 bytes)");
  try {
    // A fresh view: msgpackr caches a DataView as a property of the buffer it reads, which must not
    // land on the caller's bytes. unpackMultiple reports concatenated values; a frame holds one.
    const values = packr.unpackMultiple(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)) as unknown[];
    if (values.length !== 1) {
      throw new MalformedMessageError(`frame holds ${values.length} msgpack values, expected exactly 1`);
    }
    return values[0];
  } catch (e) {
    if (e instanceof MalformedMessageError) throw e;
    throw new MalformedMessageError(
      `frame of ${bytes.length} bytes is not valid msgpack: ${(e as Error)?.message ?? String(e)}`,
      { cause: e },
    );
  }
}

/** A short description of a value's type for error messages ("Int32Array", "array", "null"). */
export function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "object") {
    const name = (value as object).constructor?.name;
    return name && name !== "Object" ? name : "object";
  }
  return typeof value;
}
