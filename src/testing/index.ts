// ooze/testing: fault testing of a job — a real nats-server (or a cluster of three), a cuttable TCP
// proxy, a fault-injecting HTTP proxy in front of engines, commands that crash or hang on demand, a
// disk that fills up, faults as validated data played against real processes, fast-check arbitraries
// for fault schedules, ready invariants over a job's recorded output (token-exactness included), a
// report, and waits with deadlines. A topology's training job under test is ooze/testing/job
// (app/job/testing.ts), which composes the actors. See
// src/testing/README.md.
export { startTestNats, type NatsServerHandle, type NatsServerOptions } from "./nats.ts";
export { freePort, startTestNatsCluster, type TestNatsCluster, type TestNatsClusterOptions } from "./nats-cluster.ts";
export { COMMAND_FAULTS, createFaultyCommand, type CommandFault, type FaultyCommand } from "./faulty-command.ts";
export { createDiskFiller, mountTmpfs, tmpfsUnavailable, type DiskFiller } from "./disk-full.ts";
export { type CutProxy, createCutProxy } from "./cut-proxy.ts";
export { nextMessage, nextStatus, waitUntil, type WaitOptions, withDeadline } from "./wait.ts";
export {
  ENGINE_FAULT_KINDS,
  engineFaultSpec,
  parseEngineFaultSpec,
  startEngineFaultProxy,
  type EngineFaultKind,
  type EngineFaultProxy,
  type EngineFaultProxyOptions,
  type EngineFaultProxyStats,
  type EngineFaultSpec,
} from "./engine-fault-proxy.ts";
export {
  FAULT_KINDS,
  checkTargets,
  faultSchedule,
  faultSpec,
  parseFaultSchedule,
  playFaults,
  type AppliedFault,
  type FaultKind,
  type FaultPlayer,
  type FaultSpec,
  type FaultTargets,
} from "./faults.ts";
export { checkSchedules, drawableKinds, faultArb, propertyRuns, recordSchedules, scheduleArb, type CheckOptions, type CheckResult, type ScheduleSpace } from "./arbitraries.ts";
export {
  assertInvariants,
  checkInvariants,
  everyEpisodeOnce,
  everySampleOnce,
  finishesWithin,
  noActorLeftCrashed,
  noFailedSamples,
  readJsonLines,
  stalenessWithin,
  versionsIncrease,
  type BatchLine,
  type Invariant,
  type JobOutcome,
  type MetricsLine,
  type Verdict,
} from "./invariants.ts";
export { describeFault, formatReport, replaySchedule, reportOk, writeReport, type FaultReport } from "./report.ts";
export {
  EngineOutputIndex,
  engineOutputsOf,
  tokensAsSampled,
  uncoveredAt,
  type EngineOutputRecord,
  type SampleTokensLine,
  type TokensAsSampledOptions,
} from "./sampled-tokens.ts";
