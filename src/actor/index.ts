// ooze actors: typed definitions, the actor system on nact, remoting over NATS, durable mailboxes.
export * from "./types.ts";
export { defineActor } from "./define.ts";
export { createSystem, type ActorSystem, type SystemOptions, type Supervisor } from "./system.ts";
export { attachBus, remoteRef, remoteLayer, subjectOf, type AttachOptions, type RemoteLayer } from "./remote.ts";
export {
  durableRef,
  serveDurable,
  ensureMailboxStream,
  type DurableMailbox,
  type DurableOptions,
  type DurableRef,
  type DurableStats,
} from "./durable.ts";
export { startActors, type ActorSpecInput, type KindResolver, type StartActorsOptions, type StartedActor } from "./specs.ts";
export { serveControl, controlRequest, type ControlRequest, type PsReply, type DownReply, type CrashReply } from "./control.ts";
