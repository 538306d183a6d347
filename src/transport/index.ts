// The transport: the NATS bus, the embedded nats-server, and every NATS name.
export {
  type Bus,
  type BusMsg,
  type BusOptions,
  type BusStatus,
  type BusSubscription,
  connectBus,
  LARGE_HEADER,
  type NatsTarget,
  resolveNatsUrl,
  splitNatsUrl,
  type SubscribeOptions,
  toTransportError,
} from "./bus.ts";
export { findNatsServer, type NatsServerHandle, type NatsServerOptions, startNatsServer } from "./nats-server.ts";
export { type JobNames, jobNames, NAME_SEGMENT } from "./names.ts";
