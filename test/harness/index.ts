// ooze/testing: the test harness — a real nats-server per test file, fault injectors, waits with
// deadlines.
export {};
