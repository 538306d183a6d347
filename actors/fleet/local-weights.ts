// The fleet actor's local copies of full checkpoints that reach it through the job's object store:
// a temp directory owned by the actor holds the model directory of the version its engines serve
// (the Fleet loads it onto engines that join late or restart) and, during an update, the incoming
// one. A full checkpoint is fetched from its object (actors/weight-sync/full-store.ts, checksums
// verified); after a delta, the new version is made locally from the served copy and the delta (the
// delta's per-tensor checksums verified), so only the delta crosses the network. Once an update is
// settled, the copy the fleet serves stays and every other one is removed. The base of LoRA
// adapters, when this host does not have it where they name it, is fetched once into `bases/` and stays.
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadNative } from "../../native/load.ts";
import { OozeError } from "../../src/errors.ts";
import type { Bus } from "../../src/transport/bus.ts";
import { applyDelta, decodeDelta, tensorLayout } from "../weight-sync/delta.ts";
import type { ObjectRef } from "../weight-sync/delta-store.ts";
import { fetchFullObject } from "../weight-sync/full-store.ts";

/** The subdirectory of the base models LoRA adapters came with (kept: every version's adapters name one). */
const BASES = "bases";

/** The file a copy made from a delta does not take from its base (the weights are written anew). */
const WEIGHTS_FILE = "model.safetensors";

/** Local model directories of one fleet actor, under one temp directory. */
export class LocalWeights {
  /** The temp directory (removed by close). */
  readonly root: string;
  private served: { version: string; dir: string } | null = null;
  private seq = 0;

  constructor(job: string) {
    this.root = mkdtempSync(join(tmpdir(), `ooze-fleet-${job.replace(/[^A-Za-z0-9_-]/g, "_")}-weights-`));
  }

  /** The local copy of the version the engines serve, or null. */
  get current(): { version: string; dir: string } | null {
    return this.served;
  }

  private newDir(version: string): string {
    return join(this.root, `v${version.replace(/[^A-Za-z0-9._-]/g, "_")}-${++this.seq}`);
  }

  /** Fetches the full checkpoint object `ref` of `version` into a new local directory (verified); returns it. */
  async fetch(bus: Bus, ref: ObjectRef, version: string): Promise<string> {
    const dir = this.newDir(version);
    const got = await fetchFullObject(bus, ref, dir, join(this.root, BASES));
    if (got !== version) {
      rmSync(dir, { recursive: true, force: true });
      throw new OozeError("CHECKPOINT_INVALID", `full checkpoint object '${ref.bucket}/${ref.name}' holds weight version '${got}', not '${version}'; it was stored under the wrong name`);
    }
    return dir;
  }

  /**
   * Makes `version` locally from the served copy and the delta file `deltaFile` (checked: the delta's
   * base must be the served version and every tensor's checksum must match); returns the new
   * directory. Throws CHECKPOINT_INVALID, leaving nothing behind, when there is no served copy or the
   * delta does not apply to it.
   */
  fromDelta(deltaFile: string, version: string): string {
    const base = this.served;
    if (!base) throw new OozeError("CHECKPOINT_INVALID", `fleet: no local copy of the served weights to apply the delta to version '${version}' to`);
    const native = loadNative();
    const m = native.loadModelDir(base.dir);
    const delta = decodeDelta(readFileSync(deltaFile));
    if (delta.version !== version) throw new OozeError("CHECKPOINT_INVALID", `fleet: the weight delta ${deltaFile} leads to version '${delta.version}', not '${version}'`);
    applyDelta(tensorLayout(m.tensors), m.params, base.version, delta);
    const dir = this.newDir(version);
    const part = `${dir}.part`;
    try {
      native.saveModelDir(part, m.config, m.params, version);
      // The base copy's other files (config.json as stored, tokenizer files, …) come along unchanged.
      for (const name of readdirSync(base.dir)) {
        const from = join(base.dir, name);
        if (name !== WEIGHTS_FILE && statSync(from).isFile()) copyFileSync(from, join(part, name));
      }
      renameSync(part, dir);
    } catch (e) {
      rmSync(part, { recursive: true, force: true });
      throw e;
    }
    return dir;
  }

  /**
   * After an update to `version` from the local copy `dir`: when the fleet now serves `version`, `dir`
   * becomes the served copy and every other local copy is removed; otherwise `dir` is removed.
   */
  settle(fleetVersion: string | null, version: string, dir: string): void {
    if (fleetVersion !== version) {
      if (dir !== this.served?.dir) rmSync(dir, { recursive: true, force: true });
      return;
    }
    this.served = { version, dir };
    for (const name of existsSync(this.root) ? readdirSync(this.root) : []) {
      const path = join(this.root, name);
      if (path !== dir && name !== BASES) rmSync(path, { recursive: true, force: true });
    }
  }

  /** Takes `dir`, which is not this actor's (an earlier incarnation's copy), as the served copy of `version`; it is never removed. */
  adopt(version: string, dir: string): void {
    this.served = { version, dir };
  }

  /** Fetches `ref` as the served copy of `version` (a restarted fleet whose recorded copy is gone); returns its directory. */
  async restore(bus: Bus, ref: ObjectRef, version: string): Promise<string> {
    const dir = await this.fetch(bus, ref, version);
    this.settle(version, version, dir);
    return dir;
  }

  /** Removes every local copy (the engines hold their weights in memory). */
  close(): void {
    this.served = null;
    rmSync(this.root, { recursive: true, force: true });
  }
}
