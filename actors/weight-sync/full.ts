// Full weight sync: the trainer has saved version N as a model directory (safetensors); every engine
// is walked through pause → update_weights_from_disk → continue by the target (the fleet checks
// each engine's reported version). Versions only increase; a sync that fails because an engine just
// died is retried while its replacement comes up.
import { OozeError } from "../../src/errors.ts";

/** What a weight sync drives: a Fleet, the loop's Generator, or the fleet actor (whose implementations forward opts). */
export interface WeightTarget {
  updateWeights(path: string, version: string, opts?: { loadFormat?: string; fullModelDir?: string }): Promise<unknown>;
}

/** Refuses a version that is not above the engines' one (versions only increase). */
export function assertIncreasing(version: number, last: number): void {
  if (!(version > last)) throw new OozeError("CONFIG_INVALID", `weight sync: version ${version} is not above the engines' ${last}; versions only increase`);
}

/** Loads the model directory `dir` as `version` on every engine of `target`, retrying up to `attempts` times. */
export async function loadFull(target: WeightTarget, dir: string, version: number, attempts: number, log: (line: string) => void): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await target.updateWeights(dir, String(version));
      return;
    } catch (e) {
      if (attempt >= attempts) throw e;
      log(`weight sync to version ${version} failed (${(e as Error).message}); retrying`);
      await new Promise((r) => setTimeout(r, Math.min(2000, 200 * attempt)));
    }
  }
}

/** Pushes full checkpoints to the engines, one increasing version at a time. */
export class FullWeightSync {
  private last: number;

  constructor(private readonly target: WeightTarget, initialVersion: number, private readonly log: (line: string) => void = () => undefined) {
    this.last = initialVersion;
  }

  /** The version the engines serve. */
  get version(): number {
    return this.last;
  }

  /** Loads `dir` as `version` on every engine (retrying up to `attempts` times). */
  async push(dir: string, version: number, attempts = 20): Promise<void> {
    assertIncreasing(version, this.last);
    await loadFull(this.target, dir, version, attempts, this.log);
    this.last = version;
  }
}
