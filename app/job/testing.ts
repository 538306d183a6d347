// ooze/testing/job: a topology's training job under test — the loop's actors, the native trainer and
// the engines started on a NATS of their own, with the targets of faults and the invariants that fit
// the topology. Its own entry point because it composes the actors: ooze/testing (src/testing/)
// stays free of them. See src/testing/README.md.
export type { JobInvariants, JobUnderTest, JobUnderTestOptions } from "./job-types.ts";
export { runJobSchedule, startJobUnderTest } from "./job-under-test.ts";
