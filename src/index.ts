// Public API of ooze. Everything not exported here (or from ooze/testing, ooze/algorithms) is
// internal. The native addon is not part of the core: import it from native/ where it is needed.
export * from "./errors.ts";
export * from "./sample.ts";
export * from "./actor/index.ts";
export * from "./supervisor/index.ts";
export { connectBus, resolveNatsUrl, type Bus, type BusMsg, type BusOptions, type BusSubscription } from "./transport/bus.ts";
export { startNatsServer, findNatsServer, type NatsServerHandle, type NatsServerOptions } from "./transport/nats-server.ts";
export { jobNames, type JobNames } from "./transport/names.ts";
export * from "./codec/index.ts";
export { loadTopology, parseTopology } from "./topology/load.ts";
export type { Topology, ActorSpec, HostSpec, SupervisionSpec } from "./topology/schema.ts";
export { startNode, type RunningNode } from "./topology/node.ts";
export { EngineClient, EngineHttpError, engineFaultKind } from "./engine/client.ts";
export { Router } from "./engine/fleet/router.ts";
export { startEngineServer, type EngineServer, type EngineServerOptions } from "./engine/server.ts";
export { Fleet, type FleetGenerateRequest, type FleetGenerateResult, type EngineEntry, type FleetOptions, type FaultStats } from "./engine/fleet/fleet.ts";
export type { InferenceBackend, BackendSampling, TokenEvent, FinishReason } from "./engine/backend.ts";
