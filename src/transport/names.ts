// Every NATS subject, stream, consumer and bucket name ooze uses, defined once. A job's names are
// prefixed by its job id so that several jobs can share one NATS server.

/** Characters allowed in a job id / actor name segment of a subject. */
export const NAME_SEGMENT = /^[A-Za-z0-9_-]+$/;

/** Names for one job. */
export function jobNames(job: string) {
  if (!NAME_SEGMENT.test(job)) throw new Error(`job id '${job}' must match ${NAME_SEGMENT}`);
  const p = `ooze.${job}`;
  const s = job.toUpperCase().replace(/-/g, "_");
  return {
    /** Prefix of every subject of the job. */
    prefix: p,
    /** Request/reply inbox of an actor (tell and ask). */
    actor: (name: string) => `${p}.actor.${name}`,
    /** Durable mailbox subject of an actor (JetStream). */
    mailbox: (name: string) => `${p}.mailbox.${name}`,
    /** Lifecycle events: started, crashed, restarted, escalated, stopped. */
    events: (actor: string, kind: string) => `${p}.events.${actor}.${kind}`,
    eventsAll: `${p}.events.>`,
    /** Dead letters: frames that could not be decoded or validated. */
    deadLetter: (actor: string) => `${p}.dead.${actor}`,
    deadLetterAll: `${p}.dead.>`,
    /** Control plane of a node process (ps, down, engines attach/detach). */
    control: (node: string) => `${p}.control.${node}`,
    controlAll: `${p}.control.*`,
    /** Prefix of the reply inboxes of a job's node processes (so their NATS users need no `_INBOX.>`). */
    inbox: `${p}.inbox`,
    /** Chunked payload parts of a large message. */
    chunk: (id: string) => `${p}.chunk.${id}`,
    /** Data subjects of the training loop's actors (actors/protocol): prompt groups to generate,
     *  samples and group closes, training batches, new weight versions. */
    trainPrompts: `${p}.train.prompts`,
    trainSamples: `${p}.train.samples`,
    trainBatches: `${p}.train.batches`,
    trainWeights: `${p}.train.weights`,
    /** Each trained step's metrics (progress displays, dashboards). */
    trainMetrics: `${p}.train.metrics`,
    // JetStream names (streams, buckets): no dots allowed.
    streamMailboxes: `OOZE_${s}_MAILBOX`,
    streamEvents: `OOZE_${s}_EVENTS`,
    streamDead: `OOZE_${s}_DEAD`,
    streamPrompts: `OOZE_${s}_PROMPTS`,
    streamSamples: `OOZE_${s}_SAMPLES`,
    streamBatches: `OOZE_${s}_BATCHES`,
    streamMetrics: `OOZE_${s}_METRICS`,
    streamWeights: `OOZE_${s}_WEIGHTS`,
    consumer: (name: string) => `ooze_${name}`,
    kvEngines: `ooze_${job}_engines`.replace(/-/g, "_"),
    kvVersions: `ooze_${job}_versions`.replace(/-/g, "_"),
    kvActors: `ooze_${job}_actors`.replace(/-/g, "_"),
    objWeights: `ooze_${job}_weights`.replace(/-/g, "_"),
    objLarge: `ooze_${job}_large`.replace(/-/g, "_"),
  };
}

export type JobNames = ReturnType<typeof jobNames>;
