// ooze's own test harness: the public ooze/testing module (src/testing: nats-server, cut proxy,
// engine fault proxy, faults, waits) plus useNats, which ties a nats-server to a vitest file.
export * from "../../src/testing/index.ts";
export { type TestNats, useNats } from "./nats.ts";
export { freePort, startTestNatsCluster, type TestNatsCluster, type TestNatsClusterOptions } from "./nats-cluster.ts";
export { createTestNetwork, netnsUnavailable, type TestNetwork } from "./netns.ts";
