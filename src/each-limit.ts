// Runs an async function over items with at most `limit` calls in flight. (Fifteen lines: not worth a
// dependency.)

/**
 * Calls `fn` on every item, at most `limit` at once, in order of the items. Every call runs even when
 * one fails; the first failure is then thrown.
 */
export async function eachLimit<T>(items: Iterable<T>, limit: number, fn: (item: T) => Promise<unknown>): Promise<void> {
  const it = items[Symbol.iterator]();
  let failure: { error: unknown } | null = null;
  const worker = async () => {
    for (let n = it.next(); !n.done; n = it.next()) {
      try {
        await fn(n.value);
      } catch (e) {
        failure ??= { error: e };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, limit) }, worker));
  if (failure) throw (failure as { error: unknown }).error;
}
