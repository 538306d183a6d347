// What a NATS user confined to one job may publish and subscribe to: the job's own subjects
// (`ooze.<job>.>`, reply inboxes included), the JetStream API calls on the job's own streams, KV
// buckets and object stores (no stream create, update or delete: `ooze up` makes them first), their
// acks and flow control, and replies to requests it received. Everything else on the server is
// denied: another job's subjects and streams, `_INBOX.>`, `$SYS`. Within the job, the training
// loop's data is written by the roles that own it only (`roles`: the actor kinds the user's process
// hosts): samples by the rollout, prompts and batches by the buffer, weights messages and step
// metrics by the trainer, the versions KV record and weight objects by the weight sync. Names come
// from names.ts.
import { jobNames } from "./names.ts";

/** A NATS user's permissions, as nats-server's config writes them (allow lists; all else denied). */
export interface NatsPermissions {
  /** Subjects it may publish to (wildcards allowed). */
  publish: readonly string[];
  /** Subjects it may not publish to although `publish` allows them (nats-server's deny list). */
  publishDeny: readonly string[];
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

/** The training loop's data subjects and who writes them: an actor kind, and what only it may write. */
function loopWriters(job: string): { kind: string; subjects: string[]; kvBuckets: string[]; objBuckets: string[] }[] {
  const n = jobNames(job);
  return [
    { kind: "train.rollout", subjects: [n.trainSamples], kvBuckets: [], objBuckets: [] },
    { kind: "train.buffer", subjects: [n.trainPrompts, n.trainBatches], kvBuckets: [], objBuckets: [] },
    { kind: "train.trainer", subjects: [n.trainWeights, n.trainMetrics], kvBuckets: [], objBuckets: [] },
    { kind: "train.weight-sync", subjects: [], kvBuckets: [n.kvVersions], objBuckets: [n.objWeights] },
  ];
}

/**
 * Permissions of a process of job `job` (an `ooze node`) that hosts actors of the kinds `roles`:
 * read and write the job's data, never another job's nor reconfigure the server's JetStream; the
 * loop's data only as its roles write it (a rollout host cannot publish batches or weights, put the
 * versions record or replace a weight object). Without `roles`, every role's writes are allowed.
 * Stream-level calls are listed one by one, each on the stream's name, because a wildcard in the middle of a JetStream API subject would
 * also match a call on another stream (`$JS.API.CONSUMER.*.*.S.>` matches a consumer named S of
 * any stream).
 */
export function jobPermissions(job: string, roles?: readonly string[]): NatsPermissions {
  const n = jobNames(job);
  const { streams, kv: allKv, obj: allObj } = jobStreams(job);
  const others = roles === undefined ? [] : loopWriters(job).filter((w) => !roles.includes(w.kind));
  const kv = allKv.filter((b) => !others.some((w) => w.kvBuckets.includes(b)));
  const obj = allObj.filter((b) => !others.some((w) => w.objBuckets.includes(b)));
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
      // every stream's reads (the KV and object store of a role it does not host included: they are
      // read by all), its writes only as listed below
      ...[...streams, ...allKv.map((b) => `KV_${b}`), ...allObj.map((b) => `OBJ_${b}`)].flatMap(perStream),
      // an object store deletes an object (a weight version past `keep`) by purging its chunks
      ...obj.map((b) => `${api}.STREAM.PURGE.OBJ_${b}`),
      // a rollout instance that leaves removes its membership entry by purging its subject (actors/rollout/shard.ts)
      `${api}.STREAM.PURGE.KV_${n.kvActors}`,
      ...kv.map((b) => `$KV.${b}.>`),
      ...obj.map((b) => `$O.${b}.>`),
    ],
    publishDeny: others.flatMap((w) => w.subjects),
    // `ooze.<job>.>` holds its inboxes too (names.inbox): a node's connection uses that prefix
    subscribe: [`${n.prefix}.>`],
    allowResponses: true,
  };
}
