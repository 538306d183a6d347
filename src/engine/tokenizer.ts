// The embedded model's tokenizer: byte-level. Ids 0–255 are bytes; then BOS, EOS and PAD.
// Real checkpoints bring their own tokenizer; token-in/token-out means ooze itself never needs one
// except to show text and to build prompts for the built-in tasks.

export const BYTE_VOCAB = 256;
export const BOS_ID = 256;
export const EOS_ID = 257;
export const PAD_ID = 258;
/** Smallest vocab_size that a model using this tokenizer needs. */
export const BYTE_TOKENIZER_VOCAB = 259;

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: false });

/** Text → ids (UTF-8 bytes), optionally prefixed with BOS. */
export function encodeBytes(text: string, addBos = false): Int32Array {
  const bytes = encoder.encode(text);
  const out = new Int32Array(bytes.length + (addBos ? 1 : 0));
  let i = 0;
  if (addBos) out[i++] = BOS_ID;
  for (const b of bytes) out[i++] = b;
  return out;
}

/** Ids → text; special ids are skipped (or shown as <bos>/<eos>/<pad> when skipSpecial is false). */
export function decodeBytes(ids: ArrayLike<number>, skipSpecial = true): string {
  const bytes: number[] = [];
  let out = "";
  const flush = () => {
    if (bytes.length) out += decoder.decode(new Uint8Array(bytes));
    bytes.length = 0;
  };
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (id >= 0 && id < BYTE_VOCAB) bytes.push(id);
    else {
      flush();
      if (!skipSpecial) out += id === BOS_ID ? "<bos>" : id === EOS_ID ? "<eos>" : id === PAD_ID ? "<pad>" : `<${id}>`;
    }
  }
  flush();
  return out;
}
