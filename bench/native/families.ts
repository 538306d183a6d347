// The 0.5b shapes of Llama 3 and Qwen3 (familyConfig(arch, "0.5b-shape"), random weights) for
// bench/native.ts: decode and training tokens/s beside the time OpenBLAS (and our own GEMM) takes
// for the same matrix products, measured in the same run. A decode step is one engine step over B
// sequences of one token each at a context of C tokens; a training step is trainStep (forward,
// PPO loss, backward, AdamW) over packed sequences. Each step's GEMMs are listed from the shapes the
// native code runs (forward.cc, train.cc), each distinct shape timed (best of rounds) and multiplied
// by its count; share outside GEMM = 1 − gemm_time / step_time, in CPU time (wall-clock beside it;
// what the figures mean: docs/experiments/native-families-bench.md). Every (family, part) runs in
// its own child process (this file with --child), so that its model (2 GB of weights, 8–10 GB with
// the trainer's AdamW state) is freed before the next, with OMP_NUM_THREADS set to the bench's
// thread count.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { LlamaHfConfig } from "../../native/index.d.ts";
import { loadNative } from "../../native/load.ts";
import { familyConfig, paramCount, type Arch } from "../../native/presets.ts";
import type { OpenblasTimer } from "./openblas.ts";

/** What to measure. */
export interface FamilyOptions {
  /** Decode: sequences per step and the context (shared prompt tokens) they decode at. */
  batch: number;
  context: number;
  decodeSteps: number;
  /** Training: packed sequences × tokens each (the first 16 of each are prompt, the rest loss-masked). */
  trainSeqs: number;
  trainSeqLen: number;
  trainSteps: number;
  threads: number;
  /** Seconds each GEMM shape is timed for, per round; the best of `rounds` is kept. */
  window: number;
  rounds: number;
}

export const DEFAULT_FAMILY_OPTIONS: FamilyOptions = {
  batch: 32,
  context: 256,
  decodeSteps: 6,
  trainSeqs: 2,
  trainSeqLen: 128,
  trainSteps: 2,
  threads: 1,
  window: 0.1,
  rounds: 3,
};

const PROMPT = 16; // training: prompt tokens per sequence (not loss-masked)
/** Rows of lm_head logits train.cc holds at once (its logit_rows): the lm_head GEMMs run per chunk. */
export function logitRows(vocab: number): number {
  return Math.max(32, Math.min(512, Math.floor((16 << 20) / vocab)));
}
/** The engine's KV pool is at least max_position_embeddings slots: the bench caps it (no GEMM shape depends on it). */
const ENGINE_CONTEXT = 4096;

type Kind = "nt" | "nn" | "tn";
/** One GEMM shape of a step and how many times the step runs it. */
export interface Gemm {
  what: string;
  kind: Kind;
  M: number;
  N: number;
  K: number;
  count: number;
}

function dims(c: LlamaHfConfig) {
  const hd = c.head_dim ?? c.hidden_size / c.num_attention_heads;
  return {
    H: c.hidden_size,
    I: c.intermediate_size,
    V: c.vocab_size,
    L: c.num_hidden_layers,
    Q: c.num_attention_heads * hd,
    KV: (c.num_key_value_heads ?? c.num_attention_heads) * hd,
  };
}

/** Adds a shape to a list, merging identical shapes. */
function add(list: Gemm[], g: Omit<Gemm, "count">, count: number): void {
  if (count <= 0) return;
  const same = list.find((x) => x.kind === g.kind && x.M === g.M && x.N === g.N && x.K === g.K);
  if (same) {
    same.count += count;
    if (!same.what.split("+").includes(g.what)) same.what += `+${g.what}`;
  } else list.push({ ...g, count });
}

/** The GEMMs of one engine decode step over B rows (forward.cc forward_step: every Linear as nt, then lm_head). */
export function decodeGemms(c: LlamaHfConfig, B: number): Gemm[] {
  const { H, I, V, L, Q, KV } = dims(c);
  const out: Gemm[] = [];
  add(out, { what: "q_proj", kind: "nt", M: B, N: Q, K: H }, L);
  add(out, { what: "k_proj/v_proj", kind: "nt", M: B, N: KV, K: H }, 2 * L);
  add(out, { what: "o_proj", kind: "nt", M: B, N: H, K: Q }, L);
  add(out, { what: "gate_proj/up_proj", kind: "nt", M: B, N: I, K: H }, 2 * L);
  add(out, { what: "down_proj", kind: "nt", M: B, N: H, K: I }, L);
  add(out, { what: "lm_head", kind: "nt", M: B, N: V, K: H }, 1);
  return out;
}

/**
 * lm_head chunk sizes for n rows: train.cc's chunk_rows (at most logit_rows(vocab) each, as equal as
 * can be), or chunks of `fixedRows` and a remainder (builds before chunk_rows: 32).
 */
function chunks(n: number, vocab: number, fixedRows: number | null): number[] {
  const R = fixedRows ?? Math.max(1, Math.ceil(n / Math.max(1, Math.ceil(n / logitRows(vocab)))));
  const out: number[] = [];
  for (let r = 0; r < n; r += R) out.push(Math.min(R, n - r));
  return out;
}

/**
 * The GEMMs of one trainStep over T packed tokens (train.cc): forward nt per Linear, lm_head nt over
 * the `lmForward` loss rows in chunks; backward: lm_head recomputed (nt) then dx (nn) and dW (tn)
 * over the `lmBackward` rows with a gradient, and per Linear dx (nn) and dW (tn).
 */
export function trainGemms(
  c: LlamaHfConfig,
  T: number,
  lmForward: number,
  lmBackward: number,
  fixedRows: number | null = null,
): Gemm[] {
  const { H, I, V, L, Q, KV } = dims(c);
  const out: Gemm[] = [];
  const linears: Array<[string, number, number, number]> = [
    ["q_proj", Q, H, 1],
    ["k_proj/v_proj", KV, H, 2],
    ["o_proj", H, Q, 1],
    ["gate_proj/up_proj", I, H, 2],
    ["down_proj", H, I, 1],
  ];
  for (const [what, o, i, n] of linears) {
    add(out, { what: `${what} fwd`, kind: "nt", M: T, N: o, K: i }, n * L);
    add(out, { what: `${what} dx`, kind: "nn", M: T, N: i, K: o }, n * L);
    add(out, { what: `${what} dW`, kind: "tn", M: o, N: i, K: T }, n * L);
  }
  for (const n of chunks(lmForward, V, fixedRows)) add(out, { what: "lm_head fwd", kind: "nt", M: n, N: V, K: H }, 1);
  for (const n of chunks(lmBackward, V, fixedRows)) {
    add(out, { what: "lm_head recompute", kind: "nt", M: n, N: V, K: H }, 1);
    add(out, { what: "lm_head dx", kind: "nn", M: n, N: H, K: V }, 1);
    add(out, { what: "lm_head dW", kind: "tn", M: V, N: H, K: n }, 1);
  }
  return out;
}

/** Distinct operand sets to cycle through so that each call's operands (≥ 64 MiB in all) come from memory. */
function copiesFor(g: Gemm): number {
  const bytes = 4 * (g.M * g.K + g.N * g.K + g.M * g.N);
  return Math.max(1, Math.min(g.count, Math.ceil((64 << 20) / bytes)));
}

function filled(n: number, salt: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (((i * 7919 + salt) % 1000) / 1000 - 0.5) * 0.1;
  return a;
}

/** Wall-clock and CPU seconds (or ms) of something. */
interface Times {
  wall: number;
  cpu: number;
}

/** Runs fn and returns its wall-clock and this process's CPU milliseconds. */
async function timed(fn: () => Promise<unknown>): Promise<Times> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await fn();
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  return { wall, cpu: (c.user + c.system) / 1000 };
}

/** Seconds per call of our matmul (best of `rounds` windows), cycling through distinct operand sets like the OpenBLAS timer. */
function timeOwn(g: Gemm, window: number, rounds: number): Times {
  const native = loadNative();
  const sets = Array.from({ length: copiesFor(g) }, (_, s) => ({
    A: filled(g.M * g.K, s),
    B: filled(g.N * g.K, s + 1),
    C: new Float32Array(g.M * g.N).fill(0), // touched, like the baseline's
  }));
  let next = 0;
  const call = () => {
    const o = sets[next]!;
    next = (next + 1) % sets.length;
    native.matmul(g.kind, o.A, o.B, o.C, g.M, g.N, g.K, false);
  };
  call();
  const best = { wall: Infinity, cpu: Infinity };
  for (let r = 0; r < rounds; r++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    let calls = 0;
    let dt = 0;
    do {
      call();
      calls++;
      dt = (performance.now() - t0) / 1000;
    } while (dt < window);
    const c = process.cpuUsage(c0);
    best.wall = Math.min(best.wall, dt / calls);
    best.cpu = Math.min(best.cpu, (c.user + c.system) / 1e6 / calls);
  }
  return best;
}

/** Seconds of a GEMM list (each shape's best time × its count) with ours and with OpenBLAS (null without it). */
async function timeGemms(list: Gemm[], o: FamilyOptions, blas: OpenblasTimer | null, log: (m: string) => void) {
  const own = { wall: 0, cpu: 0 };
  const openblas = blas ? { wall: 0, cpu: 0 } : null;
  for (const g of list) {
    const t = timeOwn(g, o.window, o.rounds);
    own.wall += t.wall * g.count;
    own.cpu += t.cpu * g.count;
    let line = `  ${g.what} ${g.kind} M=${g.M} N=${g.N} K=${g.K} x${g.count}: ours ${(t.cpu * 1e3).toFixed(2)} ms`;
    if (blas && openblas) {
      const b = await blas.measure(g.kind, g.M, g.N, g.K, o.window, copiesFor(g), o.rounds);
      openblas.wall += b.wall * g.count;
      openblas.cpu += b.cpu * g.count;
      line += `, openblas ${(b.cpu * 1e3).toFixed(2)} ms (CPU, best of ${o.rounds})`;
    }
    log(line);
  }
  return { own, openblas };
}

// ---- the child: one family's decode or training, timed ------------------------------------------

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
}

/** Token ids below `vocab` (avoiding the top of the vocabulary, where the special tokens are). */
function randomTokens(n: number, vocab: number, seed: number): Int32Array {
  const r = lcg(seed);
  return Int32Array.from({ length: n }, () => r() % Math.min(vocab, 100_000));
}

/**
 * Random weights quickly (native.initModelParams draws 0.5B normals in ~20 s): Linear and embedding
 * weights uniform with std 0.02, norm weights 1, biases 0, as the model's layout names them.
 */
function quickParams(config: LlamaHfConfig): Float32Array {
  const { numel, tensors } = loadNative().modelLayout(config);
  const p = new Float32Array(numel);
  const a = 0.02 * Math.sqrt(3);
  let s = 12345;
  for (const t of tensors) {
    const n = t.shape.reduce((x, y) => x * y, 1);
    if (t.name.endsWith(".bias")) continue;
    if (t.shape.length === 1) p.fill(1, t.offset, t.offset + n);
    else
      for (let i = t.offset; i < t.offset + n; i++) {
        s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
        p[i] = (s / 4294967296 - 0.5) * 2 * a;
      }
  }
  return p;
}

/** The median of each. */
function median(ts: Times[]): Times {
  const mid = (xs: number[]) => {
    const v = xs.sort((a, b) => a - b), h = Math.floor(v.length / 2);
    return v.length % 2 ? v[h]! : (v[h - 1]! + v[h]!) / 2;
  };
  return { wall: mid(ts.map((t) => t.wall)), cpu: mid(ts.map((t) => t.cpu)) };
}

/** The least of each. */
function best(ts: Times[]): Times {
  return { wall: Math.min(...ts.map((t) => t.wall)), cpu: Math.min(...ts.map((t) => t.cpu)) };
}

interface DecodeChild {
  /** Milliseconds of each timed step, wall-clock and CPU. */
  steps: Times[];
}
interface TrainChild {
  steps: Times[];
  /** applyGrads alone (AdamW over every parameter), timed twice. */
  optimizer: Times[];
  lmForwardRows: number;
  lmBackwardRows: number;
  clipfrac: number;
}

async function childDecode(arch: Arch, o: FamilyOptions): Promise<DecodeChild> {
  const native = loadNative();
  const config = { ...familyConfig(arch, "0.5b-shape"), max_position_embeddings: ENGINE_CONTEXT };
  const params = quickParams(config);
  const eng = new native.Engine({ config, params, cacheTokens: ENGINE_CONTEXT, maxRunning: o.batch });
  try {
    const sampling = (n: number, seed: number) => ({
      maxNewTokens: n, temperature: 1, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: true, seed,
    });
    // The shared prompt is prefilled once and cached; every sequence then decodes at that context.
    const prompt = randomTokens(o.context, config.vocab_size, 7);
    eng.add("prefill", prompt, sampling(1, 0));
    while (eng.running() > 0) await eng.step();
    for (let b = 0; b < o.batch; b++) eng.add(`d${b}`, prompt, sampling(o.decodeSteps + 2, b + 1));
    await eng.step(); // each sequence's last prompt token, one row each: a first, untimed decode-like step
    const times: Times[] = [];
    for (let s = 0; s < o.decodeSteps; s++) {
      let n = 0;
      times.push(await timed(async () => void (n = (await eng.step()).length)));
      if (n !== o.batch) throw new Error(`decode step gave ${n} tokens, expected ${o.batch}`);
    }
    return { steps: times };
  } finally {
    eng.close();
  }
}

async function childTrain(arch: Arch, o: FamilyOptions): Promise<TrainChild> {
  const { Trainer, packSamples } = await import("../../native/trainer.ts");
  const config = familyConfig(arch, "0.5b-shape");
  const trainer = await Trainer.create({ config, params: quickParams(config), seed: null });
  const samples = Array.from({ length: o.trainSeqs }, (_, i) => {
    const resp = o.trainSeqLen - PROMPT;
    return {
      tokens: randomTokens(o.trainSeqLen, config.vocab_size, 100 + i),
      responseLength: resp,
      lossMask: new Uint8Array(resp).fill(1),
      rolloutLogprobs: null,
      advantage: i % 2 === 0 ? 1 : -1,
    };
  });
  const batch = packSamples(samples);
  // The old policy is the current one and lr is 0 (AdamW still does all its work), so every ratio is
  // 1, no token is clipped and every loss row has a gradient, as in a first PPO epoch.
  batch.oldLogprobs = (await trainer.logprobs(batch)).logprobs;
  const loss = { klCoef: 0, entropyCoef: 0 };
  const optim = { lr: 0 };
  await trainer.applyGrads(optim); // allocates the AdamW moments: not part of a timed step
  const times: Times[] = [];
  let clipfrac = 0;
  for (let s = 0; s < o.trainSteps; s++) {
    times.push(await timed(async () => void (clipfrac = Math.max(clipfrac, (await trainer.trainStep(batch, loss, optim)).clipfrac))));
  }
  const optimizer = [await timed(() => trainer.applyGrads(optim)), await timed(() => trainer.applyGrads(optim))];
  const rows = o.trainSeqs * (o.trainSeqLen - PROMPT);
  return { steps: times, optimizer, lmForwardRows: rows, lmBackwardRows: rows, clipfrac };
}

// ---- the parent: children, then the GEMM lists timed ---------------------------------------------

/** One family's figures (times in ms; shares in [0, 1], null without OpenBLAS). */
export interface FamilyResult {
  params_m: number;
  decode: Record<string, number | string | null> | null;
  train: Record<string, number | string | null> | null;
  error: string | null;
}

const here = fileURLToPath(import.meta.url);

function optionArgs(o: FamilyOptions): string[] {
  return Object.entries(o).flatMap(([k, v]) => [`--${k}`, String(v)]);
}

function runChild<T>(part: "decode" | "train", arch: Arch, o: FamilyOptions): T {
  const r = spawnSync(process.execPath, [...process.execArgv, here, "--child", part, "--arch", arch, ...optionArgs(o)], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, OMP_NUM_THREADS: String(o.threads) },
    maxBuffer: 1 << 20,
  });
  const last = r.stdout?.trim().split("\n").pop();
  if (r.status !== 0 || !last) throw new Error(`${arch} ${part} child failed (status ${r.status}, signal ${r.signal})`);
  return JSON.parse(last) as T;
}

const r3 = (x: number): number => Number(x.toFixed(3));
const r1 = (x: number): number => Number(x.toFixed(1));

/** Measures one family: decode and training in child processes, then their GEMM lists here. */
export async function measureFamily(
  arch: Arch,
  o: FamilyOptions,
  blas: OpenblasTimer | null,
  log: (m: string) => void,
  parts: { decode: boolean; train: boolean } = { decode: true, train: true },
): Promise<FamilyResult> {
  const config = familyConfig(arch, "0.5b-shape");
  const res: FamilyResult = { params_m: r1(paramCount(config) / 1e6), decode: null, train: null, error: null };
  /**
   * A step's figures beside its GEMMs': tokens/s from the median step; the shares outside GEMM from
   * the best step against each shape's best time (CPU time: other processes on the machine inflate
   * wall-clock times, by different amounts at different moments; wall-clock shares beside them).
   */
  const figures = (tokens: number, steps: Times[], g: Awaited<ReturnType<typeof timeGemms>>, adamw: Times | null) => {
    const mid = median(steps), b = best(steps);
    const ob = g.openblas;
    const share = (gemmS: number, stepMs: number) => r3(1 - (gemmS * 1e3) / stepMs);
    return {
      step_ms: r1(mid.wall),
      tokens_per_s: r1((tokens / mid.wall) * 1e3),
      step_cpu_ms: r1(b.cpu),
      gemm_cpu_ms: r1(g.own.cpu * 1e3),
      openblas_gemm_cpu_ms: ob ? r1(ob.cpu * 1e3) : null,
      share_outside_gemm: ob ? share(ob.cpu, b.cpu) : null,
      share_outside_gemm_wall: ob ? share(ob.wall, b.wall) : null,
      share_outside_own_gemm: share(g.own.cpu, b.cpu),
      ...(adamw
        ? {
            adamw_cpu_ms: r1(adamw.cpu),
            share_outside_gemm_without_adamw: ob ? share(ob.cpu, b.cpu - adamw.cpu) : null,
          }
        : {}),
    };
  };
  try {
    if (parts.decode) {
      log(`${arch} 0.5b-shape decode: batch ${o.batch} at context ${o.context}, ${o.decodeSteps} steps`);
      const d = runChild<DecodeChild>("decode", arch, o);
      const mid = median(d.steps);
      log(`${arch} decode: ${((o.batch / mid.wall) * 1e3).toFixed(1)} tokens/s (${mid.wall.toFixed(1)} ms/step, ${best(d.steps).cpu.toFixed(1)} ms CPU at best); its GEMMs:`);
      const g = await timeGemms(decodeGemms(config, o.batch), o, blas, log);
      res.decode = { batch: o.batch, context: o.context, ...figures(o.batch, d.steps, g, null) };
    }
    if (parts.train) {
      const T = o.trainSeqs * o.trainSeqLen;
      log(`${arch} 0.5b-shape training: ${o.trainSeqs} x ${o.trainSeqLen} tokens packed, ${o.trainSteps} steps`);
      const t = runChild<TrainChild>("train", arch, o);
      const mid = median(t.steps), adamw = best(t.optimizer);
      log(
        `${arch} training: ${((T / mid.wall) * 1e3).toFixed(1)} tokens/s (${mid.wall.toFixed(0)} ms/step, ${best(t.steps).cpu.toFixed(0)} ms CPU at best, ` +
          `AdamW ${adamw.cpu.toFixed(0)} ms CPU, clipfrac ${t.clipfrac}); its GEMMs:`,
      );
      // OOZE_BENCH_LOGIT_ROWS: fixed lm_head chunks of that many rows, for measuring a build older
      // than train.cc's chunk_rows (which had chunks of 32) through OOZE_NATIVE_PATH.
      const fixedRows = process.env.OOZE_BENCH_LOGIT_ROWS ? Number(process.env.OOZE_BENCH_LOGIT_ROWS) : null;
      const list = trainGemms(config, T, t.lmForwardRows, t.lmBackwardRows, fixedRows);
      const g = await timeGemms(list, o, blas, log);
      res.train = { tokens: T, sequences: o.trainSeqs, ...figures(T, t.steps, g, adamw) };
    }
  } catch (e) {
    res.error = (e as Error).message;
    log(`${arch}: ${res.error}`);
  }
  return res;
}

// ---- child entry ---------------------------------------------------------------------------------

if (process.argv.includes("--child")) {
  const get = (k: string): string => {
    const i = process.argv.indexOf(`--${k}`);
    if (i < 0 || process.argv[i + 1] === undefined) throw new Error(`families child: --${k} missing`);
    return process.argv[i + 1]!;
  };
  const o = Object.fromEntries(
    Object.keys(DEFAULT_FAMILY_OPTIONS).map((k) => [k, Number(get(k))]),
  ) as unknown as FamilyOptions;
  const arch = get("arch") as Arch;
  const out = get("child") === "decode" ? await childDecode(arch, o) : await childTrain(arch, o);
  process.stdout.write(`${JSON.stringify(out)}\n`);
}
