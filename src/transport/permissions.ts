// What a NATS user confined to one job may publish and subscribe to: the job's own subjects
// (`ooze.<job>.>`, reply inboxes included), the JetStream API calls on the job's own streams, KV
// buckets and object stores (no stream create, update or delete: `ooze up` makes them first), their
// acks and flow control, and replies to requests it received. Everything else on the server is
// denied: another job's subjects and streams, `_INBOX.>`, `$SYS`. Names come from names.ts.
import { jobNames } from "./names.ts";

/** A NATS user's permissions, as nats-server's config writes them (allow lists; all else denied). */
export interface NatsPermissions {
  /** Subjects it may publish to (wildcards allowed). */
  publish: readonly string[];
  /** Subjects it may subscribe to. */
  subscribe: readonly string[];
  /** May it answer requests it received on any reply subject (once each; nats-server's `allow_responses`). */
  allowResponses: boolean;
}

/** Every JetStream stream of a job: its streams, and those under its KV buckets and object stores. */
export function jobStreams(job: string): { streams: string[]; kv: string[]; obj: string[] } {
  const n = jobNames(job);
  return {
    streams: [n.streamMailboxes, n.streamEvents, n.streamDead, n.streamPrompts, n.streamSamples, n.streamBatches, n.streamMetrics, n.streamWeights],
    kv: [n.kvEngines, n.kvVersions, n.kvActors],
    obj: [n.objWeights, n.objLarge],
  };
}

/**
 * Permissions of a process of job `job` (an `ooze node`): read and write the job's data, never
 * another job's nor reconfigure the server's JetStream. Stream-level calls are listed one by one,
 * each on the stream's name, because a wildcard in the middle of a JetStream API subject would
 * also match a call on another stream (`$JS.API.CONSUMER.*.*.S.>` matches a consumer named S of
 * any stream).
 */
export function jobPermissions(job: string): NatsPermissions {
  const n = jobNames(job);
  const { streams, kv, obj } = jobStreams(job);
  const all = [...streams, ...kv.map((b) => `KV_${b}`), ...obj.map((b) => `OBJ_${b}`)];
  const api = "$JS.API";
  const perStream = (s: string) => [
    `${api}.STREAM.INFO.${s}`,
    `${api}.STREAM.MSG.GET.${s}`,
    `${api}.DIRECT.GET.${s}`,
    `${api}.DIRECT.GET.${s}.>`,
    `${api}.CONSUMER.CREATE.${s}`,
    `${api}.CONSUMER.CREATE.${s}.>`,
    `${api}.CONSUMER.DURABLE.CREATE.${s}.*`,
    `${api}.CONSUMER.INFO.${s}.*`,
    `${api}.CONSUMER.DELETE.${s}.*`,
    `${api}.CONSUMER.MSG.NEXT.${s}.*`,
    `${api}.CONSUMER.NAMES.${s}`,
    `${api}.CONSUMER.LIST.${s}`,
    `$JS.ACK.${s}.>`,
    `$JS.FC.${s}.>`,
  ];
  return {
    publish: [
      `${n.prefix}.>`,
      `${api}.INFO`,
      ...all.flatMap(perStream),
      // an object store deletes an object (a weight version past `keep`) by purging its chunks
      ...obj.map((b) => `${api}.STREAM.PURGE.OBJ_${b}`),
      ...kv.map((b) => `$KV.${b}.>`),
      ...obj.map((b) => `$O.${b}.>`),
    ],
    // `ooze.<job>.>` holds its inboxes too (names.inbox): a node's connection uses that prefix
    subscribe: [`${n.prefix}.>`],
    allowResponses: true,
  };
}
