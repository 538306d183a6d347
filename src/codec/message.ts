// Typed messages: each kind is a zod schema plus a version, declared once with defineMessage.
// decodeMessage checks the frame once, at the edge, against a registry of known kinds and returns a
// typed envelope, or throws a MalformedMessageError naming the kind, the field and what is wrong.
import type { z } from "zod";
import { MalformedMessageError } from "../errors.ts";
import { type Envelope, type EnvelopeFields, envelopeSchema, makeEnvelope } from "./envelope.ts";
import { decode, describe, encode } from "./msgpack.ts";

/** A message kind: its discriminator, body version and body validator. */
export interface MessageDef<K extends string = string, S extends z.ZodType = z.ZodType> {
  readonly kind: K;
  readonly v: number;
  readonly schema: S;
  /** Wraps a body in an envelope of this kind and version (no validation). */
  make(body: z.output<S>, fields?: EnvelopeFields): Envelope<K, z.output<S>>;
  /** Encodes a body of this kind to a frame (no validation; receivers validate). */
  encode(body: z.output<S>, fields?: EnvelopeFields): Uint8Array;
  /** Type guard for a decoded message of any kind. */
  is(message: Envelope): message is Envelope<K, z.output<S>>;
}

/** Any message definition. */
// biome-ignore lint: `any` keeps the variance of z.ZodType out of the way in unions of definitions.
export type AnyMessageDef = MessageDef<string, any>;

/** The decoded, typed envelope of a definition (a union when given a union of definitions). */
export type MessageOf<D> = D extends MessageDef<infer K, infer S> ? Envelope<K, z.output<S>> : never;

/** The body type of a definition. */
export type BodyOf<D> = D extends MessageDef<string, infer S> ? z.output<S> : never;

/** Declares a message kind. `kind` is the discriminator, `v` the body version, `schema` the body. */
export function defineMessage<const K extends string, S extends z.ZodType>(spec: {
  kind: K;
  v: number;
  schema: S;
}): MessageDef<K, S> {
  const { kind, v, schema } = spec;
  if (kind.length === 0) throw new Error("defineMessage: kind must be a non-empty string");
  if (!Number.isInteger(v) || v < 0) throw new Error(`defineMessage(${kind}): v must be a non-negative integer`);
  return {
    kind,
    v,
    schema,
    make: (body, fields) => makeEnvelope(kind, v, body, fields),
    encode: (body, fields) => encode(makeEnvelope(kind, v, body, fields)),
    is: (m): m is Envelope<K, z.output<S>> => m.kind === kind && m.v === v,
  };
}

/** The set of kinds a receiver accepts. */
export interface MessageRegistry<D extends AnyMessageDef = AnyMessageDef> {
  readonly defs: readonly D[];
  /** Definition for a kind and version, or undefined. */
  get(kind: string, v: number): D | undefined;
  /** Versions known for a kind (empty if the kind is unknown). */
  versions(kind: string): number[];
}

/** Builds a registry from message definitions; a (kind, v) pair may appear once. */
export function createRegistry<const D extends readonly AnyMessageDef[]>(...defs: D): MessageRegistry<D[number]> {
  const byKey = new Map<string, D[number]>();
  const byKind = new Map<string, number[]>();
  for (const d of defs) {
    const key = `${d.kind}@${d.v}`;
    if (byKey.has(key)) throw new Error(`createRegistry: message ${d.kind} v${d.v} is defined twice`);
    byKey.set(key, d);
    byKind.set(d.kind, [...(byKind.get(d.kind) ?? []), d.v]);
  }
  return {
    defs,
    get: (kind, v) => byKey.get(`${kind}@${v}`),
    versions: (kind) => byKind.get(kind) ?? [],
  };
}

/** Encodes an envelope (built with `def.make` or `makeEnvelope`) to a frame. */
export function encodeMessage(message: Envelope): Uint8Array {
  return encode(message);
}

/**
 * Decodes and validates a frame against a registry: msgpack, then the envelope, then the body schema
 * of its (kind, v). Returns the typed envelope; throws MalformedMessageError on anything else.
 */
export function decodeMessage<D extends AnyMessageDef>(bytes: Uint8Array, registry: MessageRegistry<D>): MessageOf<D> {
  const raw = decode(bytes);
  const env = envelopeSchema.safeParse(raw);
  if (!env.success) {
    throw new MalformedMessageError(`frame is not an ooze envelope: ${formatIssues(env.error.issues, raw, "")}`);
  }
  const { kind, v } = env.data;
  const def = registry.get(kind, v);
  const where = `message '${kind}' v${v} (id ${env.data.id}${env.data.sender === null ? "" : `, from ${env.data.sender}`})`;
  if (def === undefined) {
    const known = registry.versions(kind);
    throw new MalformedMessageError(
      known.length === 0
        ? `${where}: unknown kind; this receiver accepts ${listKinds(registry)}`
        : `${where}: unsupported version; known versions of '${kind}': ${known.map((x) => `v${x}`).join(", ")}`,
    );
  }
  let body: ReturnType<typeof def.schema.safeParse>;
  try {
    body = def.schema.safeParse(env.data.body);
  } catch (e) {
    // A schema's own refinement threw on this input: still the frame's fault, not the receiver's.
    throw new MalformedMessageError(`${where}: body validator threw: ${(e as Error)?.message ?? String(e)}`, { cause: e });
  }
  if (!body.success) {
    throw new MalformedMessageError(`${where}: ${formatIssues(body.error.issues, env.data.body, "body")}`);
  }
  return { ...env.data, body: body.data } as MessageOf<D>;
}

function listKinds(registry: MessageRegistry): string {
  const kinds = [...new Set(registry.defs.map((d) => d.kind))];
  return kinds.length === 0 ? "no kinds" : kinds.map((k) => `'${k}'`).join(", ");
}

/** Formats zod issues as "field 'body.tokens': expected Int32Array (got array)", at most 3 of them. */
function formatIssues(issues: readonly z.core.$ZodIssue[], root: unknown, prefix: string): string {
  const parts = issues.slice(0, 3).map((issue) => {
    const path = [prefix, ...issue.path.map(String)].filter((p) => p.length > 0).join(".");
    const got = valueAt(root, issue.path);
    const field = path.length === 0 ? "frame" : `field '${path}'`;
    return `${field}: ${issue.message} (got ${got})`;
  });
  if (issues.length > 3) parts.push(`and ${issues.length - 3} more`);
  return parts.join("; ");
}

function valueAt(root: unknown, path: readonly PropertyKey[]): string {
  let cur: unknown = root;
  for (const key of path) {
    if (cur === null || typeof cur !== "object") return "nothing";
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur === undefined ? "nothing" : describe(cur);
}
