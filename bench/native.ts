// Native benchmark (`npm run bench -- native [--threads N] [--window S] [--rounds R]`): GEMM GFLOP/s
// on the model presets' training shapes against OpenBLAS cblas_sgemm measured in the same run (same
// thread count, default 1 for both, interleaved per shape), then the same with both restricted to
// AVX2 (ours with OOZE_NO_AVX512, OpenBLAS with OPENBLAS_CORETYPE=Haswell, in a child run with
// --avx2 --gemm-only), the skinny decode shapes, the prefix cache's saving on a synthetic multi-turn
// trace, KV bytes per token, and the engine's prefill/decode tokens/s when the engine is present.
// Last, the 0.5b shapes of Llama 3 and Qwen3 (bench/native/families.ts; `families` in the JSON):
// decode and training tokens/s beside the time OpenBLAS takes for the same step's matrix products
// in the same run, and the share of each step spent outside them (1 − openblas_gemm / step; goal
// ≤ 25 %). Flags: --families llama3,qwen3 (default both; none skips), --families-only (that section
// alone), --family-parts decode,train (default both), --decode-batch B --decode-context C
// --decode-steps S, --train-seqs N --train-seq-len L --train-steps S. Figures and what the shares
// mean: docs/experiments/native-families-bench.md.
// Progress on stderr; one JSON line last on stdout.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { loadNative } from "../native/load.ts";
import { PRESETS } from "../native/presets.ts";
import { buildOpenblasProgram, OpenblasTimer } from "./native/openblas.ts";
import { measureEngine } from "./native/engine-throughput.ts";
import { DEFAULT_TRACE, runPrefixTrace } from "./native/prefix-trace.ts";
import { measureTraining } from "./native/train-throughput.ts";
import { DEFAULT_FAMILY_OPTIONS, measureFamily, type FamilyResult } from "./native/families.ts";
import type { Arch } from "../native/presets.ts";

type Kind = "nt" | "nn" | "tn";
interface Shape {
  model: string;
  layer: string;
  kind: Kind;
  M: number;
  N: number;
  K: number;
}

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? Number(process.argv[i + 1]) : fallback;
}
const threads = arg("threads", 1);
const window = arg("window", 0.08);
const rounds = arg("rounds", 3);
const avx2Only = process.argv.includes("--avx2");
const gemmOnly = process.argv.includes("--gemm-only");
const familiesOnly = process.argv.includes("--families-only");
const familiesArg = (() => {
  const i = process.argv.indexOf("--families");
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : "llama3,qwen3";
})();
const families = familiesArg === "none" ? [] : (familiesArg.split(",") as Arch[]);
const familyParts = (() => {
  const i = process.argv.indexOf("--family-parts");
  const v = i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]!.split(",") : ["decode", "train"];
  return { decode: v.includes("decode"), train: v.includes("train") };
})();
for (const f of families)
  if (f !== "llama3" && f !== "qwen3") {
    process.stderr.write(`--families: unknown family '${f}'; give llama3, qwen3, both (llama3,qwen3) or none\n`);
    process.exit(2);
  }
const familyOptions = {
  ...DEFAULT_FAMILY_OPTIONS,
  batch: arg("decode-batch", DEFAULT_FAMILY_OPTIONS.batch),
  context: arg("decode-context", DEFAULT_FAMILY_OPTIONS.context),
  decodeSteps: arg("decode-steps", DEFAULT_FAMILY_OPTIONS.decodeSteps),
  trainSeqs: arg("train-seqs", DEFAULT_FAMILY_OPTIONS.trainSeqs),
  trainSeqLen: arg("train-seq-len", DEFAULT_FAMILY_OPTIONS.trainSeqLen),
  trainSteps: arg("train-steps", DEFAULT_FAMILY_OPTIONS.trainSteps),
  threads,
  rounds,
};
if (avx2Only) process.env.OOZE_NO_AVX512 = "1"; // read by the kernels on their first call
const log = (msg: string): void => void process.stderr.write(`[bench native] ${msg}\n`);

/** The presets whose shapes are measured (native/presets.ts). */
const MODELS = Object.fromEntries(
  (["quickstart", "base100m"] as const).map((name) => {
    const c = PRESETS[name];
    return [
      name,
      {
        hidden: c.hidden_size,
        intermediate: c.intermediate_size,
        vocab: c.vocab_size,
        layers: c.num_hidden_layers,
        heads: c.num_attention_heads,
        kvHeads: c.num_key_value_heads,
      },
    ];
  }),
);
const TOKENS = 512;

/** Each Linear [out, in] at TOKENS tokens: forward nt, input-grad nn, weight-grad tn. */
function trainingShapes(): Shape[] {
  const out: Shape[] = [];
  const seen = new Set<string>();
  for (const [model, m] of Object.entries(MODELS)) {
    const kv = (m.hidden / m.heads) * m.kvHeads;
    const linears: Array<[string, number, number]> = [
      ["q_proj/o_proj", m.hidden, m.hidden],
      ["k_proj/v_proj", kv, m.hidden],
      ["gate_proj/up_proj", m.intermediate, m.hidden],
      ["down_proj", m.hidden, m.intermediate],
    ];
    if (m.vocab < 1000) linears.push(["lm_head", m.vocab, m.hidden]);
    for (const [layer, o, i] of linears) {
      for (const s of [
        { kind: "nt" as const, M: TOKENS, N: o, K: i },
        { kind: "nn" as const, M: TOKENS, N: i, K: o },
        { kind: "tn" as const, M: o, N: i, K: TOKENS },
      ]) {
        const key = `${s.kind} ${s.M} ${s.N} ${s.K}`;
        if (!seen.has(key)) {
          seen.add(key);
          out.push({ model, layer, ...s });
        }
      }
    }
  }
  return out;
}

/** Decode: a batch of 1 and 8 rows through base100m's gate_proj and down_proj. */
const decodeShapes: Shape[] = [1, 8].flatMap((M) => [
  { model: "base100m", layer: "gate_proj", kind: "nt" as const, M, N: 2048, K: 768 },
  { model: "base100m", layer: "down_proj", kind: "nt" as const, M, N: 768, K: 2048 },
]);

function randomArray(n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = ((i * 7919) % 1000) / 1000 - 0.5;
  return a;
}

const native = loadNative();
native.gemmThreads(threads);

/** Seconds per ooze matmul call over a window of at least `window` seconds (after a warm-up call). */
function timeOoze(s: Shape): number {
  const A = randomArray(s.M * s.K);
  const B = randomArray(s.N * s.K);
  const C = new Float32Array(s.M * s.N);
  native.matmul(s.kind, A, B, C, s.M, s.N, s.K, false);
  const t0 = performance.now();
  let calls = 0;
  let dt = 0;
  do {
    native.matmul(s.kind, A, B, C, s.M, s.N, s.K, false);
    calls++;
    dt = (performance.now() - t0) / 1000;
  } while (dt < window);
  return dt / calls;
}

interface Timed {
  shape: Shape;
  ooze: number;
  openblas: number | null;
}

/** Interleaves ooze and OpenBLAS per shape for `rounds` rounds; keeps each one's best. */
async function timeAll(shapes: Shape[], blas: OpenblasTimer | null): Promise<Timed[]> {
  const res: Timed[] = [];
  for (const s of shapes) {
    let best = Infinity;
    let bestBlas = Infinity;
    for (let r = 0; r < rounds; r++) {
      best = Math.min(best, timeOoze(s));
      if (blas) bestBlas = Math.min(bestBlas, await blas.time(s.kind, s.M, s.N, s.K, window));
    }
    const gf = (t: number) => ((2 * s.M * s.N * s.K) / t / 1e9).toFixed(1);
    log(
      `${s.model} ${s.layer} ${s.kind} M=${s.M} N=${s.N} K=${s.K}: ooze ${gf(best)} GFLOP/s` +
        (blas ? `, openblas ${gf(bestBlas)} GFLOP/s` : ""),
    );
    res.push({ shape: s, ooze: best, openblas: blas ? bestBlas : null });
  }
  return res;
}

/** Total flops / total time over a set of timings (a model-weighted mean), for ooze and OpenBLAS. */
function aggregate(ts: Timed[]): { ooze: number; openblas: number | null } {
  const flops = ts.reduce((a, t) => a + 2 * t.shape.M * t.shape.N * t.shape.K, 0);
  const tOoze = ts.reduce((a, t) => a + t.ooze, 0);
  const tBlas = ts.every((t) => t.openblas !== null) ? ts.reduce((a, t) => a + t.openblas!, 0) : null;
  return { ooze: flops / tOoze / 1e9, openblas: tBlas === null ? null : flops / tBlas / 1e9 };
}

const round = (x: number | null, d = 3): number | null => (x === null ? null : Number(x.toFixed(d)));

log(`threads: ${threads} for ooze and for OpenBLAS; window ${window}s x ${rounds} rounds, best kept`);
const built = buildOpenblasProgram();
let blas: OpenblasTimer | null = null;
let openblasNote = `cblas_sgemm from Debian libopenblas, OPENBLAS_NUM_THREADS=${threads}`;
if ("path" in built) {
  blas = new OpenblasTimer(built.path, threads, avx2Only ? { OPENBLAS_CORETYPE: "Haswell" } : {});
  if (avx2Only) openblasNote += ", OPENBLAS_CORETYPE=Haswell (AVX2 kernels)";
}
else {
  openblasNote = `OpenBLAS unavailable: ${built.reason}`;
  log(openblasNote);
}

/**
 * The 0.5b family shapes, one family at a time (each part in its own child process), with a fresh
 * OpenBLAS baseline process for their GEMM lists.
 */
async function familiesSection(): Promise<Record<string, FamilyResult | string>> {
  const out: Record<string, FamilyResult | string> = {};
  if (families.length === 0) return out;
  log(
    `families (0.5b-shape): decode batch ${familyOptions.batch} at context ${familyOptions.context}; training ` +
      `${familyOptions.trainSeqs} x ${familyOptions.trainSeqLen} tokens; threads ${threads} (OMP_NUM_THREADS) and OPENBLAS_NUM_THREADS=${threads}`,
  );
  const fblas = "path" in built ? new OpenblasTimer(built.path, threads) : null;
  try {
    for (const f of families) out[f] = await measureFamily(f, familyOptions, fblas, log, familyParts);
  } finally {
    fblas?.close();
  }
  return out;
}

if (familiesOnly) {
  blas?.close();
  const fam = await familiesSection();
  process.stdout.write(`${JSON.stringify({ bench: "native", threads, openblas: openblasNote, families: fam })}\n`);
  process.exit(0);
}

let train: Timed[];
let decode: Timed[];
try {
  train = await timeAll(trainingShapes(), blas);
  decode = await timeAll(decodeShapes, blas);
} finally {
  blas?.close();
}
const all = aggregate(train);
const perModel = Object.fromEntries(
  Object.keys(MODELS).map((m) => {
    const a = aggregate(train.filter((t) => t.shape.model === m));
    return [m, { gemm_gflops: round(a.ooze, 1), openblas_gflops: round(a.openblas, 1) }];
  }),
);
const dec = aggregate(decode);
const peak = peakGflops(native.gemmKernel(), threads);
const gemmResult = {
  gemm_kernel: native.gemmKernel(),
  gemm_gflops: round(all.ooze, 1),
  openblas_gflops: round(all.openblas, 1),
  gemm_vs_openblas: all.openblas === null ? null : round(all.ooze / all.openblas),
  // shares of the cores' nominal peak (peak_note says how it is reckoned)
  peak_gflops: peak && round(peak.gflops, 1),
  gemm_of_peak: peak && round(all.ooze / peak.gflops),
  openblas_of_peak: peak && all.openblas !== null ? round(all.openblas / peak.gflops) : null,
  peak_note: peak?.note ?? "no clock in /proc/cpuinfo",
  openblas: openblasNote,
};

/**
 * The nominal peak fp32 GFLOP/s of `threads` cores for the kernel's vector width: lanes (8 for
 * AVX2, 16 for AVX-512) × 2 flops per FMA × 2 FMA pipes per core (Haswell and later, Zen 2 and
 * later; some AVX-512 parts have one 512-bit pipe, where this halves the share) × the clock
 * /proc/cpuinfo reports (a VM's nominal clock; turbo makes the real peak higher).
 */
function peakGflops(kernel: string, threads: number): { gflops: number; note: string } | null {
  let mhz = NaN;
  try {
    mhz = Number(/^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1]);
  } catch {
    return null;
  }
  if (!(mhz > 0)) return null;
  const lanes = kernel.startsWith("avx512") ? 16 : 8;
  const gflops = (lanes * 2 * 2 * mhz * threads) / 1000;
  return { gflops, note: `${lanes} fp32 lanes x 2 (FMA) x 2 FMA pipes x ${mhz.toFixed(0)} MHz (/proc/cpuinfo) x ${threads} thread(s)` };
}
if (gemmOnly) {
  process.stdout.write(`${JSON.stringify(gemmResult)}\n`);
  process.exit(0);
}

/** The AVX2-only comparison, in a child process (the kernel choice is fixed per process). */
function avx2Run(): typeof gemmResult | null {
  log("AVX2 only: ours with OOZE_NO_AVX512=1 vs OpenBLAS with OPENBLAS_CORETYPE=Haswell (child run)");
  const args = ["--avx2", "--gemm-only", "--threads", String(threads), "--window", String(window), "--rounds", String(rounds)];
  const r = spawnSync(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), ...args], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  const last = r.stdout?.trim().split("\n").pop();
  try {
    return last ? (JSON.parse(last) as typeof gemmResult) : null;
  } catch {
    return null;
  }
}
const avx2 = avx2Run();

log("prefix cache: synthetic multi-turn trace (32 sessions x 4 turns x group 4, budget 16384 tokens)");
const trace = runPrefixTrace(native, { ...DEFAULT_TRACE, budgetTokens: 16_384 });
log(`prefix cache: ${trace.hitTokens}/${trace.promptTokens} prompt tokens matched, ${trace.evictedTokens} evicted`);

const q = MODELS.quickstart!;
const kvBytesPerToken = 2 * q.layers * ((q.hidden / q.heads) * q.kvHeads) * 4;

log("engine: prefill and decode through createNativeBackend (quickstart preset)");
const engine = await measureEngine("quickstart");
log(`engine: ${engine.note}`);

log("training: forward+backward+loss+AdamW steps (quickstart: 16 x 128 tokens; base100m: 2 x 128 tokens)");
const trainQuick = await measureTraining("quickstart", 16, 128, 5);
log(`training quickstart: ${trainQuick.tokensPerS.toFixed(0)} tokens/s (${trainQuick.stepMs.toFixed(0)} ms/step)`);
const trainBig = await measureTraining("base100m", 2, 128, 2);
log(`training base100m: ${trainBig.tokensPerS.toFixed(0)} tokens/s (${trainBig.stepMs.toFixed(0)} ms/step)`);

const familyResults = await familiesSection();

const result = {
  bench: "native",
  threads,
  ...gemmResult,
  gemm_by_model: perModel,
  gemm_shapes: `Linear layers of quickstart (h${q.hidden}/i${q.intermediate}/v${q.vocab}) and base100m (h${MODELS.base100m!.hidden}/i${MODELS.base100m!.intermediate}) at M=${TOKENS} tokens: forward nt, dx nn, dW tn`,
  gemv_decode_gflops: round(dec.ooze, 1),
  openblas_decode_gflops: round(dec.openblas, 1),
  gemv_vs_openblas: dec.openblas === null ? null : round(dec.ooze / dec.openblas),
  gemm_avx2_gflops: avx2?.gemm_gflops ?? null,
  openblas_haswell_gflops: avx2?.openblas_gflops ?? null,
  gemm_avx2_vs_openblas_haswell: avx2?.gemm_vs_openblas ?? null,
  prefix_cache_prefill_saved: round(trace.savedFraction),
  prefix_cache_trace: trace,
  kv_bytes_per_token: kvBytesPerToken,
  prefill_tokens_per_s: round(engine.prefillTokensPerS, 0),
  decode_tokens_per_s: round(engine.decodeTokensPerS, 0),
  engine_note: engine.note,
  train_tokens_per_s: round(trainQuick.tokensPerS, 0),
  train_tokens_per_s_base100m: round(trainBig.tokensPerS, 0),
  families: familyResults,
};
process.stdout.write(`${JSON.stringify(result)}\n`);
