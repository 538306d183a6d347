// Dead letters: a frame that failed to decode or validate is published, raw, with its error to the
// job's dead-letter subject, and counted per actor, so nothing malformed disappears silently.
import { MalformedMessageError, type OozeError, toOozeError, type WireError } from "../errors.ts";
import type { Bus } from "../transport/bus.ts";
import type { JobNames } from "../transport/names.ts";
import { encode } from "./msgpack.ts";

/** What crosses the dead-letter subject (msgpack). */
export interface DeadLetter {
  /** The actor that received the frame. */
  actor: string;
  /** Subject the frame arrived on, or null if unknown. */
  subject: string | null;
  /** The frame exactly as received. */
  raw: Uint8Array;
  error: WireError;
  /** Epoch milliseconds. */
  at: number;
}

const counts = new Map<string, number>();

/** Number of malformed frames dead-lettered by an actor in this process (all actors if omitted). */
export function malformedCount(actor?: string): number {
  if (actor !== undefined) return counts.get(actor) ?? 0;
  let n = 0;
  for (const c of counts.values()) n += c;
  return n;
}

/**
 * Publishes a raw frame and its error to `names.deadLetter(actor)` and bumps `malformedCount(actor)`.
 * Never throws: a dead letter that cannot be published is still counted (returns false).
 */
export async function deadLetter(
  bus: Bus,
  names: JobNames,
  actor: string,
  rawBytes: Uint8Array,
  error: unknown,
  subject: string | null = null,
): Promise<boolean> {
  counts.set(actor, (counts.get(actor) ?? 0) + 1);
  const err: OozeError = error instanceof Error || typeof error !== "object" ? toOozeError(error, "MALFORMED_MESSAGE") : new MalformedMessageError(String(error));
  const letter: DeadLetter = { actor, subject, raw: new Uint8Array(rawBytes), error: { ...err.toWire(), actor }, at: Date.now() };
  try {
    await bus.publish(names.deadLetter(actor), encode(letter));
    return true;
  } catch {
    return false;
  }
}
