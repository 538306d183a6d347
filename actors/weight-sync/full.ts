// Full weight sync: the trainer has saved version N as a model directory (safetensors); every engine
// is walked through pause → update_weights_from_disk → continue by the Generator (the fleet checks
// each engine's reported version). Versions only increase; a sync that fails because an engine just
// died is retried while its replacement comes up.
import { OozeError } from "../../src/errors.ts";
import type { Generator } from "../loop/engines.ts";

/** Pushes full checkpoints to the engines, one increasing version at a time. */
export class FullWeightSync {
  private last: number;

  constructor(private readonly gen: Generator, initialVersion: number, private readonly log: (line: string) => void = () => undefined) {
    this.last = initialVersion;
  }

  /** The version the engines serve. */
  get version(): number {
    return this.last;
  }

  /** Loads `dir` as `version` on every engine (retrying up to `attempts` times). */
  async push(dir: string, version: number, attempts = 20): Promise<void> {
    if (!(version > this.last)) throw new OozeError("CONFIG_INVALID", `weight sync: version ${version} is not above the engines' ${this.last}; versions only increase`);
    for (let attempt = 1; ; attempt++) {
      try {
        await this.gen.updateWeights(dir, String(version));
        this.last = version;
        return;
      } catch (e) {
        if (attempt >= attempts) throw e;
        this.log(`weight sync to version ${version} failed (${(e as Error).message}); retrying`);
        await new Promise((r) => setTimeout(r, Math.min(2000, 200 * attempt)));
      }
    }
  }
}
