// The codec: msgpack with typed arrays intact, the envelope, typed messages validated once at the
// edge, and dead letters for frames that fail.
export { decode, describe, encode } from "./msgpack.ts";
export { type Envelope, type EnvelopeFields, envelopeSchema, makeEnvelope, newMessageId } from "./envelope.ts";
export {
  type AnyMessageDef,
  type BodyOf,
  createRegistry,
  decodeMessage,
  defineMessage,
  encodeMessage,
  type MessageDef,
  type MessageOf,
  type MessageRegistry,
} from "./message.ts";
export { type DeadLetter, deadLetter, malformedCount } from "./dead-letter.ts";
export { zBigInt64Array, zFloat32Array, zFloat64Array, zInt32Array, zUint8Array } from "./schemas.ts";
