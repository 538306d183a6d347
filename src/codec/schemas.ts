// zod validators for typed-array fields. `z.instanceof(Int32Array)` works too, but types its output
// as Int32Array<ArrayBuffer>, which an ordinary `Int32Array` (ArrayBufferLike) does not satisfy;
// these type it as the plain Int32Array that the rest of ooze uses.
import { z } from "zod";

function typed<T>(ctor: abstract new (...args: never[]) => T, name: string) {
  return z.custom<T>((v) => v instanceof ctor, { message: `expected ${name}` });
}

/** An Int32Array field (token ids). */
export const zInt32Array = () => typed<Int32Array>(Int32Array, "Int32Array");
/** A Float32Array field (logprobs, tensors). */
export const zFloat32Array = () => typed<Float32Array>(Float32Array, "Float32Array");
/** A Uint8Array field (masks, raw bytes; a Node Buffer is one too). */
export const zUint8Array = () => typed<Uint8Array>(Uint8Array, "Uint8Array");
/** A Float64Array field. */
export const zFloat64Array = () => typed<Float64Array>(Float64Array, "Float64Array");
/** A BigInt64Array field. */
export const zBigInt64Array = () => typed<BigInt64Array>(BigInt64Array, "BigInt64Array");
