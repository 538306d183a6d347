// Child processes that ooze starts (nodes, engines) exit when the process that started them is gone,
// even if it was SIGKILLed and could not stop them: no orphans.
import { processAlive } from "./job-records.ts";

/** Calls `onGone` once when process `pid` no longer runs (checked every second; the timer is unref'd). */
export function watchParent(pid: number, onGone: () => void): void {
  const timer = setInterval(() => {
    if (processAlive(pid)) return;
    clearInterval(timer);
    onGone();
  }, 1_000);
  timer.unref();
}
