// The schema of a topology file: NATS settings, hosts (processes) and actors with their placement,
// count, config and supervision. Validated with zod; see load.ts for file/line-aware errors.
import { z } from "zod";
import { DEFAULT_POLICY } from "../supervisor/policy.ts";

const nameSegment = z
  .string()
  .regex(/^[A-Za-z0-9_-]+$/, "must contain only letters, digits, '_' and '-'");

/** Restart policy of a supervisor (OTP-style). */
export const supervisionSchema = z
  .object({
    strategy: z.enum(["one_for_one", "one_for_all"]).default(DEFAULT_POLICY.strategy),
    maxRestarts: z.number().int().min(0).default(DEFAULT_POLICY.maxRestarts),
    periodMs: z.number().int().positive().default(DEFAULT_POLICY.periodMs),
    backoffMinMs: z.number().int().min(0).default(DEFAULT_POLICY.backoffMinMs),
    backoffMaxMs: z.number().int().min(0).default(DEFAULT_POLICY.backoffMaxMs),
    backoffFactor: z.number().min(1).default(DEFAULT_POLICY.backoffFactor),
    jitter: z.number().min(0).max(1).default(DEFAULT_POLICY.jitter),
  })
  .strict();

export const actorSchema = z
  .object({
    name: nameSegment,
    /** Built-in kind (e.g. "echo.ping") or a module path relative to the topology file. */
    kind: z.string().min(1),
    count: z.number().int().min(1).default(1),
    /** The host (process) that runs it; defaults to the first host. */
    placement: nameSegment.optional(),
    config: z.record(z.string(), z.unknown()).default({}),
    supervision: supervisionSchema.optional(),
    /** Messages that must not be lost go through a durable JetStream mailbox. */
    durable: z.boolean().default(false),
  })
  .strict();

export const hostSchema = z
  .object({
    name: nameSegment,
    /** "local": `ooze up` starts this host as a child process; "external": started by `ooze node`. */
    start: z.enum(["local", "external"]).default("local"),
  })
  .strict();

export const natsSchema = z
  .object({
    /** A NATS server to use, or several servers of one cluster comma-separated; absent = an embedded nats-server. */
    url: z
      .string()
      .refine((v) => v.split(",").every((u) => URL.canParse(u.trim())), "must be a URL, or several comma-separated (nats://host:4222,nats://host2:4222)")
      .optional(),
    /** Replicas of the job's streams, KV buckets and object stores (default 1; 3 when `url` lists three or more servers). */
    replicas: z.number().int().min(1).max(5).optional(),
    token: z.string().optional(),
    maxPayload: z.number().int().min(1024).default(8 * 1024 * 1024),
    /** Bind address of the embedded server: loopback unless configured otherwise. */
    host: z.string().default("127.0.0.1"),
  })
  .strict();

/** `dash:` — start the dashboard (app/dash) with `ooze up` / `ooze train`: true, or where to listen. */
const dashSchema = z.union([
  z.boolean(),
  z.object({ port: z.number().int().min(0).max(65535).optional(), host: z.string().min(1).optional() }).strict(),
]);

/**
 * `metrics:` — each node process serves its actors' Prometheus metrics at /metrics (loopback and a
 * free port by default; its address is in `ooze ps`); false turns it off.
 */
const metricsSchema = z.union([
  z.boolean(),
  z.object({ port: z.number().int().min(0).max(65535).optional(), host: z.string().min(1).optional() }).strict(),
]);

export const topologySchema = z
  .object({
    name: nameSegment,
    description: z.string().optional(),
    nats: natsSchema.default({ maxPayload: 8 * 1024 * 1024, host: "127.0.0.1" }),
    hosts: z.array(hostSchema).min(1).default([{ name: "main", start: "local" }]),
    supervision: supervisionSchema.prefault({}),
    actors: z.array(actorSchema).min(1),
    /** Free-form sections owned by other parts of ooze (engines, training). */
    engines: z.unknown().optional(),
    train: z.unknown().optional(),
    dash: dashSchema.optional(),
    metrics: metricsSchema.default(true),
  })
  .strict();

export type SupervisionSpec = z.infer<typeof supervisionSchema>;
export type ActorSpec = z.infer<typeof actorSchema>;
export type HostSpec = z.infer<typeof hostSchema>;
export type NatsSpec = z.infer<typeof natsSchema>;
export type Topology = z.infer<typeof topologySchema> & {
  /** Absolute path of the file it was loaded from (null when built in code). */
  file: string | null;
};
