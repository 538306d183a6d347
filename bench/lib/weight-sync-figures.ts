// Weight-sync figures for `npm run bench -- loop`: the size of one trainer step's lossless delta
// (actors/weight-sync/delta.ts) against the full fp32 checkpoint that a full sync ships, its apply
// time, and whether the applied weights equal the trainer's byte for byte — measured on the bf16
// wire (what the engines hold with DeltaWeightSync wire "bf16": the trainer's weights rounded to
// bf16; bit_exact compares with that export) and on the fp32 wire (the trainer's exact weights).
// The main step is the run's own last step (two newest version directories); fine-tuning sized steps
// (lr 1e-5 and 1e-6 by default, as real models are tuned: one AdamW step each from the run's last
// checkpoint, its optimizer moments restored, on a synthetic policy-gradient batch) show how the
// ratio depends on the update's size.
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createNativeBackend } from "../../native/engine.ts";
import { loadNative } from "../../native/load.ts";
import { Trainer } from "../../native/trainer.ts";
import { DELTA_LOAD_FORMAT, engineWeightLoader } from "../../actors/weight-sync/engine-loader.ts";
import { EngineClient } from "../../src/engine/client.ts";
import { startEngineServer } from "../../src/engine/server.ts";
import { applyDelta, decodeDelta, encodeDelta, roundToBf16, type DeltaWire, type TensorSlot } from "../../actors/weight-sync/delta.ts";
import { latestCheckpoint } from "../../actors/protocol/state.ts";
import { mulberry32 } from "../../src/random.ts";

/** One delta measured on one wire. */
export interface DeltaFigure {
  delta_bytes: number;
  /** delta_bytes / the fp32 checkpoint's model.safetensors (what a full sync ships). */
  delta_vs_full: number;
  /** Decode + checksums + apply in process, best of 3, ms. */
  apply_ms: number;
  bit_exact: boolean;
  /** Share of the wire's elements that changed. */
  changed: number;
  /**
   * A floor for any lossless coding of the step that codes values one by one: the zero-order entropy
   * of the values' changes (new bit pattern minus old, as integers), in bytes, against the full
   * checkpoint. A dense optimizer step moves every value by |Δw|/ulp(w) steps, about log2 of that
   * in bits each: delta_vs_full near this figure means the coder is at the bound, not wasteful.
   */
  entropy_vs_full: number;
}

/** The bench's weight-sync fields (main figures: the bf16 wire on the run's last step). */
export interface WeightSyncFigures {
  delta_wire: DeltaWire;
  delta_workload: string;
  delta_bytes: number;
  full_bytes: number;
  delta_vs_full: number;
  /** The same delta against a bf16 full checkpoint (2 bytes per parameter). */
  delta_vs_full_bf16: number;
  apply_ms: number;
  bit_exact: boolean;
  /**
   * The step's update through an engine server (`ooze serve`'s loader, in process): ms of
   * /update_weights_from_disk with the bf16 delta (weights already in memory) and with the full checkpoint.
   */
  engine_delta_update_ms: number;
  engine_full_update_ms: number;
  /** The same step on the fp32 wire (lossless against the trainer's fp32 weights). */
  delta_fp32: DeltaFigure;
  /** Fine-tuning-sized steps, one per learning rate (empty when none was asked for). */
  delta_finetune: { lr: number; workload: string; bf16: DeltaFigure; fp32: DeltaFigure }[];
}

/** Options of weightSyncFigures. */
export interface WeightSyncFigureOptions {
  /** Learning rates of the fine-tuning-sized steps (default [1e-5, 1e-6]; [] skips them). */
  fineTuneLrs?: number[];
  /** The run's description for delta_workload (default: the directory's versions). */
  runWorkload?: string;
}

const layoutOf = (t: Trainer): TensorSlot[] => t.info().tensors.map((x) => ({ name: x.name, offset: x.offset, numel: x.shape.reduce((a, b) => a * b, 1) }));

/** Encodes, decodes and applies one delta on `wire`; sizes against `fullBytes`. */
function measure(layout: TensorSlot[], base: Float32Array, next: Float32Array, wire: DeltaWire, fullBytes: number): DeltaFigure {
  const b = wire === "bf16" ? roundToBf16(base) : base;
  const n = wire === "bf16" ? roundToBf16(next) : next;
  const bytes = encodeDelta(layout, b, n, "1", "2", { wire });
  // Decode, checksums and apply in process; the best of 3 (the first call also compiles the code).
  let target = b.slice(), applyMs = Infinity;
  for (let k = 0; k < 3; k++) {
    target = b.slice();
    const t0 = performance.now();
    applyDelta(layout, target, "1", decodeDelta(bytes));
    applyMs = Math.min(applyMs, performance.now() - t0);
  }
  const bu = new Uint32Array(b.buffer), nu = new Uint32Array(n.buffer);
  let changed = 0;
  const counts = new Map<number, number>();
  for (let i = 0; i < bu.length; i++) {
    if (bu[i] !== nu[i]) changed++;
    const d = (nu[i]! - bu[i]!) | 0;
    counts.set(d, (counts.get(d) ?? 0) + 1);
  }
  let bits = 0;
  for (const c of counts.values()) bits -= c * Math.log2(c / bu.length);
  return {
    delta_bytes: bytes.length,
    delta_vs_full: Number((bytes.length / fullBytes).toFixed(4)),
    apply_ms: Number(applyMs.toFixed(2)),
    bit_exact: Buffer.compare(Buffer.from(target.buffer), Buffer.from(n.buffer)) === 0,
    changed: Number((changed / bu.length).toFixed(4)),
    entropy_vs_full: Number((bits / 8 / fullBytes).toFixed(4)),
  };
}

/**
 * Times, on an engine server, the bf16 delta of the step a → b and a full load of b. First two
 * warm-up deltas (a → a perturbed → a) bring the engine to steady state: weights in memory, decoders
 * compiled, as after the first steps of a run.
 */
async function engineUpdateMs(dirA: string, dirB: string): Promise<{ delta: number; full: number }> {
  const native = loadNative();
  const root = mkdtempSync(join(tmpdir(), "ooze-bench-ws-"));
  const ma = native.loadModelDir(dirA), mb = native.loadModelDir(dirB);
  const layout = ma.tensors.map((t) => ({ name: t.name, offset: t.offset, numel: t.shape.reduce((x, y) => x * y, 1) }));
  const ra = roundToBf16(ma.params);
  const rounded = [ra, roundToBf16(ma.params.map((x, i) => x * (1 + 1e-2 * Math.sin(i)))), ra, roundToBf16(mb.params)];
  const base = join(root, "v0-bf16");
  native.saveModelDir(base, ma.config, ra, "0");
  const files = [1, 2, 3].map((k) => {
    const f = join(root, `v${k - 1}-v${k}.ooze-delta`);
    writeFileSync(f, encodeDelta(layout, rounded[k - 1]!, rounded[k]!, String(k - 1), String(k), { wire: "bf16" }));
    return f;
  });
  const backend = createNativeBackend({ modelDir: base });
  const server = await startEngineServer({ backend, weightVersion: "0", loadWeights: engineWeightLoader(backend, base) });
  try {
    const c = new EngineClient(server.url);
    const update = async (modelPath: string, version: string, loadFormat?: string): Promise<number> => {
      const t0 = performance.now();
      const r = await c.updateWeightsFromDisk({ modelPath, weightVersion: version, ...(loadFormat ? { loadFormat } : {}) });
      if (!r.success) throw new Error(`bench: engine update to ${version} failed: ${r.message}`);
      return performance.now() - t0;
    };
    await update(files[0]!, "1", DELTA_LOAD_FORMAT);
    await update(files[1]!, "2", DELTA_LOAD_FORMAT);
    const delta = await update(files[2]!, "3", DELTA_LOAD_FORMAT);
    const full = await update(dirB, "4");
    return { delta, full };
  } finally {
    await server.close();
    backend.close();
    rmSync(root, { recursive: true, force: true });
  }
}

/** A synthetic policy-gradient batch: 16 random byte sequences of 48 tokens, advantages ±1, on-policy old logprobs. */
async function syntheticStep(t: Trainer, lr: number): Promise<void> {
  const rand = mulberry32(12345);
  const seqs = 16, len = 48;
  const tokens = new Int32Array(seqs * len).map(() => 32 + Math.floor(rand() * 95));
  const cuSeqlens = new Int32Array(seqs + 1).map((_, i) => i * len);
  const lossMask = new Uint8Array(seqs * len).map((_, i) => (i % len >= 8 ? 1 : 0));
  const advantages = new Float32Array(seqs * len).map((_, i) => (Math.floor(i / len) % 2 === 0 ? 1 : -1));
  const { logprobs } = await t.logprobs({ tokens, cuSeqlens });
  await t.trainStep({ tokens, cuSeqlens, lossMask, advantages, oldLogprobs: logprobs, rolloutLogprobs: null, refLogprobs: null }, {}, { lr });
}

/** Measures the delta between the two newest `vN` directories under `weightsDir` (a run's `out/weights`), and a fine-tuning-sized step. */
export async function weightSyncFigures(weightsDir: string, opts: WeightSyncFigureOptions = {}): Promise<WeightSyncFigures> {
  const versions = readdirSync(weightsDir).filter((d) => /^v\d+$/.test(d)).map((d) => Number(d.slice(1))).sort((x, y) => x - y).slice(-2);
  if (versions.length < 2) throw new Error(`${weightsDir}: need two version directories, found ${versions.length}`);
  const [a, b] = versions as [number, number];
  const engine = await engineUpdateMs(join(weightsDir, `v${a}`), join(weightsDir, `v${b}`));
  const ta = await Trainer.create({ modelDir: join(weightsDir, `v${a}`) });
  const tb = await Trainer.create({ modelDir: join(weightsDir, `v${b}`) });
  const base = await ta.getParams(), next = await tb.getParams();
  const layout = layoutOf(ta);
  const fullBytes = statSync(join(weightsDir, `v${b}`, "model.safetensors")).size;
  const bf16 = measure(layout, base, next, "bf16", fullBytes);
  const fp32 = measure(layout, base, next, "fp32", fullBytes);

  const finetune: WeightSyncFigures["delta_finetune"] = [];
  for (const lr of opts.fineTuneLrs ?? [1e-5, 1e-6]) {
    const ckpt = latestCheckpoint(dirname(weightsDir));
    const from = ckpt && existsSync(join(ckpt.dir, "optimizer.bin")) ? ckpt.dir : join(weightsDir, `v${b}`);
    const t = await Trainer.create({ modelDir: from });
    const start = await t.getParams();
    await syntheticStep(t, lr);
    const after = await t.getParams();
    const moments = from === join(weightsDir, `v${b}`) ? "fresh AdamW moments" : "its AdamW moments restored";
    finetune.push({
      lr,
      workload: `one AdamW step at lr ${lr} from the run's last checkpoint (${moments}) on a synthetic policy-gradient batch (16 random byte sequences x 48 tokens, advantages +-1, PPO clip loss)`,
      bf16: measure(layoutOf(t), start, after, "bf16", fullBytes),
      fp32: measure(layoutOf(t), start, after, "fp32", fullBytes),
    });
  }
  return {
    delta_wire: "bf16",
    delta_workload: `one trainer step of the bench's own sync run: v${a} -> v${b}${opts.runWorkload ? ` (${opts.runWorkload})` : ""}; engines hold bf16-rounded weights and bit_exact compares them with the trainer's bf16 export; delta_fp32 is the same step on the lossless fp32 wire`,
    delta_bytes: bf16.delta_bytes,
    full_bytes: fullBytes,
    delta_vs_full: bf16.delta_vs_full,
    delta_vs_full_bf16: Number((bf16.delta_bytes / (base.length * 2)).toFixed(4)),
    apply_ms: bf16.apply_ms,
    bit_exact: bf16.bit_exact,
    engine_delta_update_ms: Number(engine.delta.toFixed(1)),
    engine_full_update_ms: Number(engine.full.toFixed(1)),
    delta_fp32: fp32,
    delta_finetune: finetune,
  };
}
