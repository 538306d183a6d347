// Waits with deadlines for tests: poll a condition, or take the next matching event; on timeout they
// throw naming what was awaited, with diagnostics. No bare sleeps.
import type { Bus, BusMsg, BusStatus } from "../transport/bus.ts";
import { TimeoutError } from "../errors.ts";

/** Options of `waitUntil`. */
export interface WaitOptions {
  /** Deadline in milliseconds (default 10 s). */
  timeoutMs?: number;
  /** What is awaited, for the error message ("the consumer to see 3 messages"). */
  what: string;
  /** Extra state to print when the deadline passes. */
  diagnostics?: () => string;
  /** Poll interval (default 20 ms). */
  intervalMs?: number;
}

/**
 * Polls `condition` until it returns a truthy value (returned) or the deadline passes (TimeoutError
 * with `what`, the last error the condition threw, and the diagnostics).
 */
export async function waitUntil<T>(condition: () => T | Promise<T>, opts: WaitOptions): Promise<NonNullable<T>> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const interval = opts.intervalMs ?? 20;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown = null;
  for (;;) {
    try {
      const v = await condition();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      lastError = e;
    }
    if (Date.now() >= deadline) break;
    await new Promise((r) => setTimeout(r, Math.min(interval, Math.max(1, deadline - Date.now()))));
  }
  const parts = [`timed out after ${timeoutMs} ms waiting for ${opts.what}`];
  if (lastError !== null) parts.push(`last error: ${(lastError as Error)?.message ?? String(lastError)}`);
  if (opts.diagnostics) {
    try {
      parts.push(`diagnostics:\n${opts.diagnostics()}`);
    } catch (e) {
      parts.push(`diagnostics failed: ${(e as Error).message}`);
    }
  }
  throw new TimeoutError(parts.join("\n"));
}

/** Resolves with `promise`, or rejects with a TimeoutError naming `what` after `timeoutMs`. */
export async function withDeadline<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new TimeoutError(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Subscribes to `subject` now and returns a promise of the first message that passes `filter`.
 * Call it, then `await bus.flush()` (so the server knows the subscription), then trigger the event;
 * the promise rejects after `timeoutMs` (default 10 s).
 */
export function nextMessage(
  bus: Bus,
  subject: string,
  opts: { timeoutMs?: number; filter?: (m: BusMsg) => boolean } = {},
): Promise<BusMsg> {
  const sub = bus.subscribe(subject);
  const first = (async () => {
    for await (const m of sub) {
      if (opts.filter === undefined || opts.filter(m)) return m;
    }
    throw new TimeoutError(`subscription to '${subject}' ended before a matching message arrived`);
  })();
  return withDeadline(first, opts.timeoutMs ?? 10_000, `a message on '${subject}'`).finally(() => sub.unsubscribe());
}

/** Resolves at the bus's next status event of `type` (e.g. "disconnect", "reconnect"). */
export function nextStatus(bus: Bus, type: BusStatus["type"], timeoutMs = 10_000): Promise<BusStatus> {
  let off = () => {};
  const p = new Promise<BusStatus>((resolve) => {
    off = bus.onStatus((s) => {
      if (s.type === type) resolve(s);
    });
  });
  return withDeadline(p, timeoutMs, `bus status '${type}'`).finally(() => off());
}
