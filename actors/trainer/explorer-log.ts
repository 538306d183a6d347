// The trainer's explorer files (train.explorer): each trained step's samples — with their advantage
// — and the step's failed episodes, one JSON line per sample in OUT/explorer/step-NNNNNNNN.jsonl,
// for the dashboard's trajectory explorer (app/dash/explorer.ts). Token ids, loss mask and sampled
// logprobs are base64 of the little-endian typed arrays (Int32, Uint8, Float32): exact (logprobs bit
// for bit), a third the size of JSON numbers, and encoded natively (no per-number formatting on the
// trainer's event loop). A step's file is written whole (a step trained again after a restart
// replaces it), after the step's metrics, off the loop's path: writes queue one after another and the
// trainer does not wait for them (it flushes them when it stops). Files of steps more than keepSteps
// behind are deleted. OUT/explorer/meta.json names the tokenizer to decode with. The time the writes
// take is counted (`takeSeconds`: the trainer's `explorer_seconds` metric), an upper bound of what
// the files cost the loop: were every write on the loop's path, the loop would slow by exactly that.
import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Sample, VersionSpan } from "../../src/sample.ts";

/** Version of the explorer record format. */
export const EXPLORER_FORMAT = 1;

/** One line of an explorer step file. */
export interface ExplorerRecord {
  v: number;
  step: number;
  index: number;
  group: number;
  rolloutId: string;
  status: Sample["status"];
  /** Trained at this step (false: a failed episode the step dropped). */
  trained: boolean;
  reward: number | null;
  /** The advantage its model tokens were trained with; null for a failed episode. */
  advantage: number | null;
  promptLength: number;
  responseLength: number;
  /** base64 of Int32Array (prompt then response ids). */
  tokens: string;
  /** base64 of Uint8Array over the response: 1 sampled by the model, 0 environment / template. */
  lossMask: string;
  /** base64 of Float32Array over the response: the engine's logprob of each sampled token (0 elsewhere). */
  logprobs: string;
  /** Response positions [start, end) by the weight version that sampled them. */
  versions: VersionSpan[];
  prompt: unknown;
  metadata: Record<string, unknown>;
}

/** What OUT/explorer/meta.json says. */
export interface ExplorerMeta {
  v: number;
  /** The model directory whose tokenizer.json decodes the ids, or null for the byte tokenizer. */
  tokenizer: string | null;
  keepSteps: number;
}

const b64 = (a: Int32Array | Uint8Array | Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("base64");

/** The explorer record of a sample of `step` (advantage null: not trained). */
export function explorerRecord(step: number, s: Sample, advantage: number | null): ExplorerRecord {
  return {
    v: EXPLORER_FORMAT, step, index: s.index, group: s.groupIndex, rolloutId: s.rolloutId, status: s.status, trained: advantage !== null,
    reward: s.reward, advantage, promptLength: s.tokens.length - s.responseLength, responseLength: s.responseLength,
    tokens: b64(s.tokens), lossMask: b64(s.lossMask), logprobs: b64(s.rolloutLogprobs), versions: s.weightVersions,
    prompt: s.prompt ?? null, metadata: s.metadata,
  };
}

/** The file of step `step` in `dir`. */
export const explorerStepFile = (dir: string, step: number) => join(dir, `step-${String(step).padStart(8, "0")}.jsonl`);

/** Step of an explorer file name, or null for another file. */
export function explorerFileStep(name: string): number | null {
  const m = /^step-(\d+)\.jsonl$/.exec(name);
  return m ? Number(m[1]) : null;
}

/** Writes a run's explorer files in the background, one step after another. */
export class ExplorerLog {
  private chain: Promise<void> = Promise.resolve();
  private readonly dir: string;
  /** Seconds of writes finished since the last takeSeconds(): all of it, and the encoding (on the event loop). */
  private seconds = 0;
  private encodeSeconds = 0;

  constructor(
    out: string,
    private readonly keepSteps: number,
    tokenizer: string | null,
    private readonly warn: (line: string) => void,
  ) {
    this.dir = join(out, "explorer");
    mkdirSync(this.dir, { recursive: true });
    const meta: ExplorerMeta = { v: EXPLORER_FORMAT, tokenizer, keepSteps };
    writeFileSync(join(this.dir, "meta.json"), JSON.stringify(meta));
  }

  /** Deletes the files of steps after `step` (a resumed run trains them again). */
  cutAfter(step: number): void {
    for (const f of readdirSync(this.dir)) {
      const s = explorerFileStep(f);
      if (s !== null && s > step) rmSync(join(this.dir, f), { force: true });
    }
  }

  /** Queues step `step`'s file: its trained samples, then its failed episodes; returns at once. */
  write(step: number, trained: readonly (Sample & { advantage: number })[], failed: readonly Sample[]): void {
    // the samples are the batch's own (the trainer does not change them): encoding waits for the queue too
    this.chain = this.chain.then(async () => {
      const t0 = performance.now();
      let encoded = t0;
      try {
        const lines = [...trained.map((s) => explorerRecord(step, s, s.advantage)), ...failed.map((s) => explorerRecord(step, s, null))];
        const text = lines.map((r) => `${JSON.stringify(r)}\n`).join("");
        encoded = performance.now();
        await writeFile(explorerStepFile(this.dir, step), text);
        this.prune(step);
      } catch (e) {
        this.warn(`trainer: explorer file of step ${step} not written: ${(e as Error).message}`);
      }
      this.seconds += (performance.now() - t0) / 1000;
      this.encodeSeconds += (encoded - t0) / 1000;
    });
  }

  /** Seconds the writes finished since the last call took (wall time; `encode`: building the lines), and resets them. */
  takeSeconds(): { total: number; encode: number } {
    const r = { total: this.seconds, encode: this.encodeSeconds };
    this.seconds = this.encodeSeconds = 0;
    return r;
  }

  /** Waits for the queued writes. */
  flush(): Promise<void> {
    return this.chain;
  }

  private prune(step: number): void {
    for (const f of readdirSync(this.dir)) {
      const s = explorerFileStep(f);
      if (s !== null && s <= step - this.keepSteps) rmSync(join(this.dir, f), { force: true });
    }
  }
}
