// ooze supervision: OTP-style restart policies (pure logic) and supervisor groups.
export * from "./policy.ts";
export { SupervisorGroup, type SupervisedChild, type GroupHost } from "./group.ts";
