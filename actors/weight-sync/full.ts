// Full weight sync: the trainer has saved version N as a model directory (safetensors); it is put in
// a FullStore (full-store.ts: the directory itself, or the job's object store) and every engine is
// walked through pause → update_weights_from_disk → continue by the target (the fleet checks each
// engine's reported version). Versions only increase; a sync that fails because an engine just died
// is retried while its replacement comes up, and one that fails because the stored checkpoint is
// missing or corrupt stores it again first.
import { setTimeout as sleep } from "node:timers/promises";
import { OozeError } from "../../src/errors.ts";
import { directFullStore, type FullStore } from "./full-store.ts";

/** What a weight sync drives: a Fleet, the loop's Generator, or the fleet actor (whose implementations forward opts). */
export interface WeightTarget {
  updateWeights(path: string, version: string, opts?: { loadFormat?: string; fullModelDir?: string }): Promise<unknown>;
}

/** Refuses a version that is not above the engines' one (versions only increase). */
export function assertIncreasing(version: number, last: number): void {
  if (!(version > last)) throw new OozeError("CONFIG_INVALID", `weight sync: version ${version} is not above the engines' ${last}; versions only increase`);
}

/** A stored checkpoint the target could not use (missing or corrupt: CHECKPOINT_INVALID); storing it again may help. */
function storedCopyBad(e: unknown): boolean {
  return e instanceof OozeError && e.code === "CHECKPOINT_INVALID";
}

/** How a push goes: its tries, and the signal that ends it (its actor stopping). */
export interface PushOptions {
  /** Tries of a full update before the push fails (default 20). */
  attempts?: number;
  /** Aborted when the push's owner stops: no further try, and the push rejects with ACTOR_STOPPED. */
  signal?: AbortSignal;
}

/** Rejects with ACTOR_STOPPED when `signal` is aborted. */
function throwIfStopped(signal: AbortSignal | undefined, version: number): void {
  if (signal?.aborted) throw new OozeError("ACTOR_STOPPED", `weight sync to version ${version}: stopped`);
}

/**
 * Loads the model directory `dir` as `version` on every engine of `target` through `store`, retrying
 * up to `attempts` times, but not once `signal` is aborted nor after a failure that cannot pass (a
 * connection closed for good: a non-retryable TRANSPORT error). `location`, when given, is where
 * `store` already holds it; it is stored (again) when it is not, or when the target found the stored
 * copy missing or corrupt.
 */
export async function loadFull(
  target: WeightTarget, store: FullStore, dir: string, version: number, log: (line: string) => void, opts: PushOptions & { location?: string | null } = {},
): Promise<void> {
  const attempts = opts.attempts ?? 20;
  let where = opts.location ?? null;
  for (let attempt = 1; ; attempt++) {
    throwIfStopped(opts.signal, version);
    try {
      where ??= await store.put(dir, version);
      await target.updateWeights(where, String(version));
      return;
    } catch (e) {
      throwIfStopped(opts.signal, version);
      if (attempt >= attempts || (e instanceof OozeError && e.code === "TRANSPORT" && !e.retryable)) throw e;
      if (storedCopyBad(e)) where = null;
      log(`weight sync to version ${version} failed (${(e as Error).message}); ${where === null ? "storing the checkpoint again and " : ""}retrying`);
      // (an abort ends the pause early; the loop's check then rejects)
      await sleep(Math.min(2000, 200 * attempt), undefined, opts.signal ? { signal: opts.signal } : {}).catch(() => {});
    }
  }
}

/** Pushes full checkpoints to the engines, one increasing version at a time. */
export class FullWeightSync {
  private last: number;

  /** `store`: where each checkpoint goes (default: the directory itself, which the engines must read). */
  constructor(
    private readonly target: WeightTarget,
    initialVersion: number,
    private readonly log: (line: string) => void = () => undefined,
    private readonly store: FullStore = directFullStore,
  ) {
    this.last = initialVersion;
  }

  /** The version the engines serve. */
  get version(): number {
    return this.last;
  }

  /** Loads `dir` as `version` on every engine (retried: see PushOptions), then prunes the store (a failure is logged). */
  async push(dir: string, version: number, opts: PushOptions = {}): Promise<void> {
    assertIncreasing(version, this.last);
    await loadFull(this.target, this.store, dir, version, this.log, opts);
    this.last = version;
    await this.store.prune(version).catch((e: unknown) => this.log(`weight sync: pruning old full checkpoints failed (${(e as Error).message})`));
  }
}
