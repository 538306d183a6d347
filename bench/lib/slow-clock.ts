// What counts in engine time, on a bench's slowed clock. The benches serve their simulated engines S
// times slower than the serving model, so that a thousand engines fit on two cores; whatever the
// controller times in engine time must then be S times longer too, or the bench measures the slowed
// clock instead of the controller: with the fleet's progress deadlines at their real-time values, most
// turns at 256 engines were aborted and dispatched again (bench inflight, Dec 2); with the engines'
// keep-alive at its real-time 30 s, turns of ~20 s left sockets idle past it and a rollout process at
// 1,024 engines connected again for most requests (bench scale, Dec 2: ~10 % of its main thread).

/** The fleet's settings S times longer: progress deadlines (and their floor), health checks. */
export function slowFleet(slow: number) {
  return { progressTimeoutMs: 10_000 * slow, progressTimeoutPerTokenMs: 50 * slow, minProgressTimeoutMs: 1_000 * slow, healthIntervalMs: 5_000 * slow };
}

/**
 * Keep-alive S times longer: the simulated engines' (`ooze sim-engine --keep-alive-ms`, 30 s by
 * default) and the clients' cap on it (src/engine/http.ts's setMaxIdleMs / OOZE_HTTP_MAX_IDLE_MS, 60 s).
 */
export function slowKeepAlive(slow: number): { engineMs: number; clientCapMs: number } {
  return { engineMs: 30_000 * slow, clientCapMs: 60_000 * slow };
}
