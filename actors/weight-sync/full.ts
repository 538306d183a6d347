// Full weight sync: the trainer has saved version N as a model directory (safetensors); it is put in
// a FullStore (full-store.ts: the directory itself, or the job's object store) and every engine is
// walked through pause → update_weights_from_disk → continue by the target (the fleet checks each
// engine's reported version). Versions only increase; a sync that fails because an engine just died
// is retried while its replacement comes up, and one that fails because the stored checkpoint is
// missing or corrupt stores it again first.
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

/**
 * Loads the model directory `dir` as `version` on every engine of `target` through `store`, retrying
 * up to `attempts` times. `location`, when given, is where `store` already holds it; it is stored
 * (again) when it is not, or when the target found the stored copy missing or corrupt.
 */
export async function loadFull(
  target: WeightTarget, store: FullStore, dir: string, version: number, attempts: number, log: (line: string) => void, location: string | null = null,
): Promise<void> {
  let where = location;
  for (let attempt = 1; ; attempt++) {
    try {
      where ??= await store.put(dir, version);
      await target.updateWeights(where, String(version));
      return;
    } catch (e) {
      if (attempt >= attempts) throw e;
      if (storedCopyBad(e)) where = null;
      log(`weight sync to version ${version} failed (${(e as Error).message}); ${where === null ? "storing the checkpoint again and " : ""}retrying`);
      await new Promise((r) => setTimeout(r, Math.min(2000, 200 * attempt)));
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

  /** Loads `dir` as `version` on every engine (retrying up to `attempts` times), then prunes the store (a failure is logged). */
  async push(dir: string, version: number, attempts = 20): Promise<void> {
    assertIncreasing(version, this.last);
    await loadFull(this.target, this.store, dir, version, attempts, this.log);
    this.last = version;
    await this.store.prune(version).catch((e: unknown) => this.log(`weight sync: pruning old full checkpoints failed (${(e as Error).message})`));
  }
}
