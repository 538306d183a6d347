// ooze actors: typed definitions, the actor system on nact, remoting over NATS, durable mailboxes.
export * from "./types.ts";
export { defineActor } from "./define.ts";
export { createSystem, type ActorSystem, type SystemOptions, type Supervisor } from "./system.ts";
