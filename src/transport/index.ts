// The transport: the NATS bus, the embedded nats-server, every NATS name, and a job's NATS permissions.
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
export { ADMIN_USER, findNatsServer, type NatsServerHandle, type NatsServerOptions, type NatsUser, startNatsServer } from "./nats-server.ts";
export { jobPermissions, jobStreams, type NatsPermissions } from "./permissions.ts";
export { type JobNames, jobNames, NAME_SEGMENT } from "./names.ts";
