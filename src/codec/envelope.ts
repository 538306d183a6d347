// The envelope every ooze message travels in, defined once: id, kind, version, sender, correlation
// id, weight version, deadline and the kind-specific body.
import { z } from "zod";
import { nuid } from "@nats-io/transport-node";

/** Fields every message carries, whatever its kind. */
export interface Envelope<K extends string = string, B = unknown> {
  /** Unique id of this message (a NUID). */
  id: string;
  /** Message kind, e.g. "rollout.sample"; the discriminator. */
  kind: K;
  /** Version of the kind's body schema. */
  v: number;
  /** Address of the sending actor, or null when sent from outside an actor. */
  sender: string | null;
  /** Id of the message this one answers or continues, or null. */
  correlationId: string | null;
  /** Policy weight version the message refers to, or null. */
  weightVersion: number | null;
  /** Absolute deadline in epoch milliseconds after which the message is void, or null. */
  deadline: number | null;
  /** The kind-specific payload, validated by the kind's schema. */
  body: B;
}

/** Envelope fields a sender may set; the rest get defaults in `makeEnvelope`. */
export type EnvelopeFields = Partial<Pick<Envelope, "id" | "sender" | "correlationId" | "weightVersion" | "deadline">>;

/** Runtime validator of the envelope (the body is checked by the message's own schema). */
export const envelopeSchema = z
  .object({
    id: z.string().min(1),
    kind: z.string().min(1),
    v: z.number().int().nonnegative(),
    sender: z.string().nullable(),
    correlationId: z.string().nullable(),
    weightVersion: z.number().int().nullable(),
    deadline: z.number().nullable(),
    body: z.unknown(),
  })
  .strict();

/** A new message id (NUID: 22 url-safe characters). */
export function newMessageId(): string {
  return nuid.next();
}

/** Builds an envelope around a body, filling id and the null defaults. */
export function makeEnvelope<K extends string, B>(kind: K, v: number, body: B, fields: EnvelopeFields = {}): Envelope<K, B> {
  return {
    id: fields.id ?? newMessageId(),
    kind,
    v,
    sender: fields.sender ?? null,
    correlationId: fields.correlationId ?? null,
    weightVersion: fields.weightVersion ?? null,
    deadline: fields.deadline ?? null,
    body,
  };
}
