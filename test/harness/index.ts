// ooze/testing: the test harness — a real nats-server per test file, fault injectors (kill/restart on
// the server handle, a cuttable TCP proxy), and waits with deadlines.
export { startTestNats, type TestNats, useNats } from "./nats.ts";
export { type CutProxy, createCutProxy } from "./cut-proxy.ts";
export { nextMessage, nextStatus, waitUntil, type WaitOptions, withDeadline } from "./wait.ts";
export { freePort, startTestNatsCluster, type TestNatsCluster, type TestNatsClusterOptions } from "./nats-cluster.ts";
export { createTestNetwork, netnsUnavailable, type TestNetwork } from "./netns.ts";
