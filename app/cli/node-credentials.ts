// NATS credentials of a job's node processes when `ooze up` runs the embedded nats-server: one user
// per host of the topology, confined to the job's subjects and streams (src/transport/permissions.ts),
// while `ooze up` itself (and ps, down, dash through the job record) is the unrestricted user. Since a
// node's user may not create or change streams, `ooze up` makes every stream, KV bucket and object
// store of the job first, with the configs the actors ask for. A host started elsewhere gets its
// credentials as an env file beside the job record (owner-only), removed when the job stops.
import { randomBytes } from "node:crypto";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { StorageType } from "@nats-io/jetstream";
import { ensureTrainStreams } from "../../actors/protocol/streams.ts";
import { trainOf } from "../../actors/protocol/context.ts";
import { MEMBER_TTL_MS } from "../../actors/rollout/shard.ts";
import { ensureMailboxStream } from "../../src/actor/durable.ts";
import { ensureEventsStream } from "../../src/actor/remote.ts";
import type { Topology } from "../../src/topology/schema.ts";
import { LARGE_TTL_MS, type Bus } from "../../src/transport/bus.ts";
import { jobNames } from "../../src/transport/names.ts";
import type { NatsUser } from "../../src/transport/nats-server.ts";
import { jobPermissions } from "../../src/transport/permissions.ts";
import { jobsDir } from "./job-records.ts";

/**
 * One NATS user per host of `topology`, each with a fresh password and the job's permissions for the
 * actor kinds placed on that host (an actor without placement runs on the first host).
 */
export function nodeUsers(job: string, topology: Pick<Topology, "hosts" | "actors">): Map<string, NatsUser> {
  const first = topology.hosts[0]?.name;
  return new Map(
    topology.hosts.map((h) => {
      const kinds = topology.actors.filter((a) => (a.placement ?? first) === h.name).map((a) => a.kind);
      return [h.name, { user: `node-${job}-${h.name}`, password: randomBytes(24).toString("hex"), permissions: jobPermissions(job, kinds) }];
    }),
  );
}

/** Makes (idempotently) every stream, KV bucket and object store the job's actors use, as they would. */
export async function ensureJobAssets(bus: Bus, topology: Topology, job: string): Promise<void> {
  const names = jobNames(job);
  await ensureEventsStream(bus, names);
  await ensureMailboxStream(bus, names);
  if (topology.train !== undefined) await ensureTrainStreams(bus, names, trainOf(topology));
  await bus.kv(names.kvEngines, { history: 1 });
  await bus.kv(names.kvVersions, { history: 8 });
  await bus.kv(names.kvActors, { history: 1, ttl: MEMBER_TTL_MS });
  await bus.obj(names.objWeights, { storage: StorageType.File });
  await bus.obj(names.objLarge, { ttl: LARGE_TTL_MS * 1_000_000, storage: StorageType.File });
}

/** The env file a host started elsewhere sources before `ooze node` (mode 0600); returns its path. */
export function writeHostCredentials(job: string, host: string, natsUrl: string, u: NatsUser): string {
  const file = hostCredentialsFile(job, host);
  writeFileSync(file, `OOZE_NATS_URL=${natsUrl}\nOOZE_NATS_USER=${u.user}\nOOZE_NATS_PASSWORD=${u.password}\n`, { mode: 0o600 });
  return file;
}

/** Removes the env files of `hosts`. */
export function removeHostCredentials(job: string, hosts: readonly string[]): void {
  for (const h of hosts) rmSync(hostCredentialsFile(job, h), { force: true });
}

function hostCredentialsFile(job: string, host: string): string {
  return join(jobsDir(), `${job}.${host}.nats.env`);
}
