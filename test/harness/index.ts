// ooze's own test harness: the public ooze/testing module (src/testing: nats-server and cluster, cut
// proxy, engine fault proxy, faults, arbitraries, invariants, waits), ooze/testing/job (a topology's job under test), plus two pieces bound to this
// test setup: useNats, which ties a nats-server to a vitest file's hooks, and the network namespaces
// of the multi-host tests.
export * from "../../src/testing/index.ts";
export * from "../../app/job/testing.ts";
export { makeTestCerts } from "./certs.ts";
export { type TestNats, useNats } from "./nats.ts";
export { createTestNetwork, netnsUnavailable, type TestNetwork } from "./netns.ts";
export { rolloutLogprobGap } from "./rollout-gap.ts";
export { episodeDirsOf } from "./episode-dirs.ts";
