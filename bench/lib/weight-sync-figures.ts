// Weight-sync figures for `npm run bench -- loop`: the size of one step's lossless delta
// (actors/weight-sync/delta.ts) against the full checkpoint, its apply time, and whether the applied
// weights equal the trainer's byte for byte, from two consecutive version directories of a run.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { Trainer } from "../../native/trainer.ts";
import { applyDelta, decodeDelta, encodeDelta, type TensorSlot } from "../../actors/weight-sync/delta.ts";

/** The bench's weight-sync fields. */
export interface WeightSyncFigures {
  delta_bytes: number;
  full_bytes: number;
  delta_vs_full: number;
  apply_ms: number;
  bit_exact: boolean;
}

/** Measures the delta between the two newest `vN` directories under `weightsDir`. */
export async function weightSyncFigures(weightsDir: string): Promise<WeightSyncFigures> {
  const versions = readdirSync(weightsDir).filter((d) => /^v\d+$/.test(d)).map((d) => Number(d.slice(1))).sort((a, b) => a - b).slice(-2);
  if (versions.length < 2) throw new Error(`${weightsDir}: need two version directories, found ${versions.length}`);
  const [a, b] = versions as [number, number];
  const ta = await Trainer.create({ modelDir: join(weightsDir, `v${a}`) });
  const tb = await Trainer.create({ modelDir: join(weightsDir, `v${b}`) });
  const base = await ta.getParams(), next = await tb.getParams();
  const layout: TensorSlot[] = ta.info().tensors.map((t) => ({ name: t.name, offset: t.offset, numel: t.shape.reduce((x, y) => x * y, 1) }));
  const bytes = encodeDelta(layout, base, next, String(a), String(b));
  const target = base.slice();
  const t0 = performance.now();
  applyDelta(layout, target, String(a), decodeDelta(bytes));
  const applyMs = performance.now() - t0;
  const bitExact = Buffer.compare(Buffer.from(target.buffer), Buffer.from(next.buffer)) === 0;
  const fullBytes = statSync(join(weightsDir, `v${b}`, "model.safetensors")).size;
  return {
    delta_bytes: bytes.length,
    full_bytes: fullBytes,
    delta_vs_full: Number((bytes.length / fullBytes).toFixed(4)),
    apply_ms: Number(applyMs.toFixed(2)),
    bit_exact: bitExact,
  };
}
