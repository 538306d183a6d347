// Referential (Lewis signalling) game, standalone experiment: a describer sees a secret (1 of 8) and
// writes a short message; a guesser reads only the message's token ids and names the secret; both
// get reward 1 when the guess is right. In-process native Engine (sampling) + Trainer (PPO-clip),
// no NATS/actors. Arms: `--arm lora` (two LoRA adapters over one frozen random base, merged into
// each role's engine after every step) or `--arm full` (a separate fully trained model per role,
// both from the same random init).
//
//   OMP_NUM_THREADS=1 node --import tsx scripts/experiments/referential-game.mts --arm lora --minutes 5
//
// Prints one JSON line per step (step, seconds, success, moving average, entropies, ...), and with
// --out also writes them to a file. Stops at moving-average success >= --target or --minutes.
import { writeFileSync, appendFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { loadNative } from "../../native/load.ts";
import { PRESETS, type PresetName } from "../../native/presets.ts";
import { Trainer, packSamples, type SampleToPack } from "../../native/trainer.ts";
import type { LlamaHfConfig, LoraTargetModule, NativeEngine, NativeTokenEvent } from "../../native/index.d.ts";
import { computeAdvantages, type AdvantageEstimator } from "../../src/algorithms/advantages.ts";
import { BOS_ID, EOS_ID, decodeBytes, encodeBytes } from "../../src/engine/tokenizer.ts";

const { values: a } = parseArgs({
  options: {
    arm: { type: "string", default: "lora" }, // lora | full
    preset: { type: "string", default: "quickstart" },
    seed: { type: "string", default: "0" },
    initStd: { type: "string", default: "0.02" }, // std of the random base (HF default 0.02)
    rank: { type: "string", default: "8" },
    alpha: { type: "string", default: "" }, // default 2·rank
    targets: { type: "string", default: "all" }, // all | qv | comma list
    lr: { type: "string", default: "" }, // default: lora 3e-3, full 3e-4 (both roles)
    lrD: { type: "string", default: "" }, // describer lr (default: lr)
    lrG: { type: "string", default: "" }, // guesser lr (default: lr)
    warmup: { type: "string", default: "0" }, // linear lr warmup steps
    G: { type: "string", default: "8" }, // episodes per secret per step
    K: { type: "string", default: "1" }, // guesses per message
    M: { type: "string", default: "2" }, // max message tokens (EOS stops earlier)
    temp: { type: "string", default: "1" }, // describer sampling (and loss) temperature
    guessTemp: { type: "string", default: "" }, // guesser temperature (default: temp)
    entropy: { type: "string", default: "0" }, // entropy bonus coefficient (both roles)
    entropyD: { type: "string", default: "" }, // the describer's (default: --entropy)
    // entropy bonus per group: this coefficient on the samples of each group (a secret's messages, a
    // message's guesses) whose estimated entropy (mean −logprob of the first sampled token) is below
    // --groupEntropyTarget while the group is not yet all right (0: off)
    groupEntropy: { type: "string", default: "0" },
    groupEntropyTarget: { type: "string", default: "0.5" },
    // the loss's uniform cross-entropy term (train.uniformCoef): coefficient C per trained token; its
    // gradient on the logits, C·(p − 1/V), does not vanish when one token has all the probability,
    // where the entropy's and the sampled token's do. 0: off
    uniform: { type: "string", default: "0" },
    uniformRoles: { type: "string", default: "describer" }, // describer | guesser | both
    estimator: { type: "string", default: "grpo" }, // grpo | dr_grpo | rloo
    // positive signalling: a describer sample's reward gets this bonus when its message differs from
    // the messages of the other seven secrets in the same episode (episode g: each secret's g-th sample)
    distinct: { type: "string", default: "0" },
    failed: { type: "string", default: "0" }, // train.failedGroupAdvantage: −x for a group that failed throughout (both roles)
    guesserGroup: { type: "string", default: "secret" }, // secret | message | batch
    prompt: { type: "string", default: "long" }, // long | last | short (see describerPrompt)
    names: { type: "string", default: "ABCDEFGH" }, // the 8 secrets as the describer sees them, one byte each
    answers: { type: "string", default: "" }, // what the guesser must answer for each (default: names)
    minutes: { type: "string", default: "5" },
    maxSteps: { type: "string", default: "1000000" },
    target: { type: "string", default: "0.9" },
    avg: { type: "string", default: "3" }, // moving-average window (steps)
    evalEvery: { type: "string", default: "10" }, // greedy evaluation every n steps (0: never)
    out: { type: "string", default: "" },
    quiet: { type: "boolean", default: false },
    checkMerge: { type: "boolean", default: false }, // compare engine logits (merged) with the trainer's logprobs once
  },
});

const num = (s: string | undefined, d: number) => (s === undefined || s === "" ? d : Number(s));
const arm = a.arm as "lora" | "full";
if (arm !== "lora" && arm !== "full") throw new Error(`--arm lora|full, got ${a.arm}`);
const cfg: LlamaHfConfig = PRESETS[a.preset as PresetName];
if (!cfg) throw new Error(`unknown preset ${a.preset}`);
const seed = num(a.seed, 0), initStd = num(a.initStd, 0.02);
const rank = num(a.rank, 8), alpha = num(a.alpha, 2 * rank);
const ALL: LoraTargetModule[] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
const targets: LoraTargetModule[] =
  a.targets === "all" ? ALL : a.targets === "qv" ? ["q_proj", "v_proj"] : (a.targets!.split(",") as LoraTargetModule[]);
const lr = num(a.lr, arm === "lora" ? 3e-3 : 3e-4);
const lrD = num(a.lrD, lr), lrG = num(a.lrG, lr), warmup = num(a.warmup, 0);
const G = num(a.G, 8), K = num(a.K, 1), M = num(a.M, 2);
const tempD = num(a.temp, 1), tempG = num(a.guessTemp, tempD);
const entropyCoef = num(a.entropy, 0), entropyCoefD = num(a.entropyD, entropyCoef);
const groupEntropy = num(a.groupEntropy, 0), groupEntropyTarget = num(a.groupEntropyTarget, 0.5);
const uniformCoef = num(a.uniform, 0), uniformRoles = a.uniformRoles!;
const estimator = a.estimator as AdvantageEstimator;
const failedGroupAdvantage = num(a.failed, 0);
const distinctBonus = num(a.distinct, 0);
const guesserGroup = a.guesserGroup as "secret" | "message" | "batch";
const names = a.names!;
if (names.length !== 8) throw new Error("--names: 8 one-byte names");
const answers = a.answers || names; // the byte the guesser must write for each secret
if (answers.length !== 8) throw new Error("--answers: 8 one-byte names");
const maxMs = num(a.minutes, 5) * 60_000, maxSteps = num(a.maxSteps, 1e6), target = num(a.target, 0.9);
const avgN = num(a.avg, 3), evalEvery = num(a.evalEvery, 10);

const addon = loadNative();
addon.gemmThreads(num(process.env.OMP_NUM_THREADS, 1));

// --- prompts (token ids) ---
const cat = (...parts: ArrayLike<number>[]) => {
  const out = new Int32Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) out.set(p, o), (o += p.length);
  return out;
};
const bytes = (s: string) => encodeBytes(s);
// long: "secret: A\nmessage:" / "message: <msg>\nsecret:"; last: the secret (describer) and the
// message (guesser) are the prompt's last tokens: "secret: A" / "message: <msg>" (a random model with
// tied embeddings leans towards repeating the last token, which both roles can build on); short: the
// bare ids, BOS + secret / BOS + message (the secret/message dominates the random model's state);
// chat: what the gateway's built-in chat template renders for one user message (the SDK game,
// examples/agents/referential-openai.mjs), the message travelling as text (decoded, re-encoded).
const describerPrompt = (s: number) =>
  a.prompt === "chat" ? cat([BOS_ID], bytes(`<|user|>${names[s]}\n<|assistant|>`)) :
  a.prompt === "short" ? cat([BOS_ID], bytes(names[s]!)) :
  a.prompt === "last" ? cat([BOS_ID], bytes(`secret: ${names[s]}`)) : cat([BOS_ID], bytes(`secret: ${names[s]}\nmessage:`));
const guesserPrefix = a.prompt === "short" ? cat([BOS_ID]) : a.prompt === "last" ? cat([BOS_ID], bytes("message: ")) : cat([BOS_ID], bytes("message:"));
const guesserSuffix = a.prompt === "short" ? bytes("") : a.prompt === "last" ? bytes("") : bytes("\nsecret:");
/** The guesser's prompt: the describer's sampled ids verbatim (a stop EOS dropped). */
const guesserPrompt = (msg: Int32Array) =>
  a.prompt === "chat" ? cat([BOS_ID], bytes(`<|user|>${decodeBytes(msg)}\n<|assistant|>`)) : cat(guesserPrefix, msg, guesserSuffix);
/** Right iff the guesser's first sampled token is the secret's byte. */
const isRight = (guess: Int32Array, s: number) => guess.length > 0 && guess[0] === answers.charCodeAt(s);

// --- models ---
const baseParams = addon.initModelParams(cfg, seed, initStd);
const layout = addon.modelLayout(cfg);
const offsetOf = new Map(layout.tensors.map((t) => [t.name, t]));

async function makeTrainer(loraSeed: number): Promise<Trainer> {
  const t = await Trainer.create({ config: cfg, params: baseParams.slice(), seed: null });
  if (arm === "lora") await t.setLora({ rank, alpha, targets, rslora: false, seed: loraSeed });
  return t;
}

/** Base + s·B·A for every adapted weight (native GEMM). */
async function mergedParams(t: Trainer): Promise<Float32Array> {
  if (arm === "full") return t.getParams();
  const lora = (await t.getLora())!;
  const s = lora.config.alpha / lora.config.rank, r = lora.config.rank;
  const out = baseParams.slice();
  const byModule = new Map<string, { A?: (typeof lora.tensors)[number]; B?: (typeof lora.tensors)[number] }>();
  for (const ts of lora.tensors) {
    const m = /^base_model\.model\.(.*)\.lora_([AB])\.weight$/.exec(ts.name);
    if (!m) throw new Error(`unexpected adapter tensor ${ts.name}`);
    const e = byModule.get(m[1]!) ?? {};
    e[m[2] as "A" | "B"] = ts;
    byModule.set(m[1]!, e);
  }
  for (const [mod, { A, B }] of byModule) {
    const w = offsetOf.get(`${mod}.weight`)!;
    const [nOut, nIn] = w.shape as [number, number];
    const Bs = lora.params.slice(B!.offset, B!.offset + nOut * r);
    for (let i = 0; i < Bs.length; i++) Bs[i]! *= s;
    const Am = lora.params.subarray(A!.offset, A!.offset + r * nIn).slice();
    const W = out.slice(w.offset, w.offset + nOut * nIn);
    addon.matmul("nn", Bs, Am, W, nOut, nIn, r, true);
    out.set(W, w.offset);
  }
  return out;
}

function makeEngine(params: Float32Array): NativeEngine {
  return new addon.Engine({ config: cfg, params, cacheTokens: 16384, maxRunning: 4096 });
}

interface Gen {
  tokens: Int32Array;
  logprobs: Float32Array;
  stopped: boolean;
}
/** Runs requests to completion on one engine. */
async function generate(engine: NativeEngine, prompts: Int32Array[], maxNew: number, temperature: number, seedBase: number): Promise<Gen[]> {
  const outs: { t: number[]; l: number[]; stopped: boolean; done: boolean }[] = prompts.map(() => ({ t: [], l: [], stopped: false, done: false }));
  prompts.forEach((p, i) =>
    engine.add(String(i), p, {
      maxNewTokens: maxNew, temperature, topP: 1, topK: 0, minNewTokens: 0, stopTokenIds: [EOS_ID], ignoreEos: false,
      seed: temperature > 0 ? (seedBase + i) % 2 ** 31 : null,
    }),
  );
  let left = prompts.length;
  while (left > 0) {
    const evs: NativeTokenEvent[] = await engine.step();
    for (const e of evs) {
      const o = outs[Number(e.rid)]!;
      if (e.tokenId >= 0) o.t.push(e.tokenId), o.l.push(e.logprob);
      if (e.finished) {
        if (e.finished.type === "abort") throw new Error(`aborted: ${e.finished.message}`);
        o.stopped = e.finished.type === "stop";
        o.done = true;
        left--;
      }
    }
  }
  return outs.map((o) => ({ tokens: Int32Array.from(o.t), logprobs: Float32Array.from(o.l), stopped: o.stopped }));
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((x, y) => x + y, 0) / xs.length : 0);

/**
 * One step on `samples`; with --groupEntropy, groups whose samples' estimated entropy is below the
 * target and that are not all right get an entropy bonus of their own (their samples accumulated a
 * second time with zero advantage, so only the bonus acts), under the whole batch's normalizer.
 * Returns the metrics and how many groups got the bonus.
 */
async function trainGrouped(
  t: Trainer, samples: SampleToPack[], groupOf: number[], rewardOf: number[], loss: { temperature: number; entropyCoef: number }, lr: number, uniform = 0,
) {
  if (groupEntropy <= 0) return { m: await t.trainStep(packSamples(samples), { ...loss, uniformCoef: uniform }, { lr }), boosted: 0 };
  const byGroup = new Map<number, number[]>();
  samples.forEach((_, i) => byGroup.set(groupOf[i]!, [...(byGroup.get(groupOf[i]!) ?? []), i]));
  const low: SampleToPack[] = [];
  let boosted = 0;
  for (const idx of byGroup.values()) {
    const h = mean(idx.map((i) => -samples[i]!.rolloutLogprobs[0]!));
    if (h < groupEntropyTarget && mean(idx.map((i) => rewardOf[i]!)) < 1) {
      boosted++;
      for (const i of idx) low.push({ ...samples[i]!, advantage: 0 });
    }
  }
  const normalizer = samples.reduce((n, x) => n + x.responseLength, 0);
  await t.zeroGrads();
  const m = await t.accumulate(packSamples(samples), { ...loss, uniformCoef: uniform, normalizer });
  if (low.length > 0) await t.accumulate(packSamples(low), { ...loss, entropyCoef: groupEntropy, normalizer });
  return { m: { ...m, ...(await t.applyGrads({ lr })) }, boosted };
}

async function main() {
  const t0 = Date.now();
  const desc = await makeTrainer(seed * 2 + 101), guess = await makeTrainer(seed * 2 + 202);
  let engD = makeEngine(await mergedParams(desc)), engG = makeEngine(await mergedParams(guess));
  const settings = {
    arm, preset: a.preset, seed, initStd, rank: arm === "lora" ? rank : null, alpha: arm === "lora" ? alpha : null,
    targets: arm === "lora" ? targets : null, lrD, lrG, warmup, G, K, M, tempD, tempG, entropyCoef, entropyCoefD, groupEntropy, groupEntropyTarget, estimator, guesserGroup,
    uniformCoef, uniformRoles, failedGroupAdvantage, distinctBonus, prompt: a.prompt, names, answers, threads: process.env.OMP_NUM_THREADS ?? null,
    trainable: arm === "lora" ? desc.info().lora!.numParams : desc.info().numParams,
  };
  const log = (o: object) => {
    const line = JSON.stringify(o);
    if (!a.quiet || !("step" in o) || (o as { step: number }).step % 10 === 0) console.log(line);
    if (a.out) appendFileSync(a.out, line + "\n");
  };
  if (a.out) writeFileSync(a.out, "");
  log({ settings });
  const hist: number[] = [];
  let reached: { step: number; seconds: number } | null = null;
  let step = 0;
  let tSample = 0, tTrain = 0, tSync = 0;
  const lossCfgD = { temperature: tempD, entropyCoef: entropyCoefD }, lossCfgG = { temperature: tempG, entropyCoef };
  for (; step < maxSteps && Date.now() - t0 < maxMs; step++) {
    const ta = Date.now();
    // 1. describers: G episodes per secret
    const secrets: number[] = [];
    for (let s = 0; s < 8; s++) for (let g = 0; g < G; g++) secrets.push(s);
    const dPrompts = secrets.map(describerPrompt);
    const dOut = await generate(engD, dPrompts, M, tempD, step * 1_000_003 + 17);
    const messages = dOut.map((o) => (o.stopped ? o.tokens.subarray(0, o.tokens.length - 1) : o.tokens));
    // 2. guessers: K guesses per message
    const gPrompts: Int32Array[] = [], gEp: number[] = [];
    messages.forEach((m, i) => {
      for (let k = 0; k < K; k++) gPrompts.push(guesserPrompt(m)), gEp.push(i);
    });
    const gOut = await generate(engG, gPrompts, 1, tempG, step * 1_000_003 + 500_000);
    const tb = Date.now();
    tSample += tb - ta;
    // 3. rewards
    const gReward = gOut.map((o, j) => (isRight(o.tokens, secrets[gEp[j]!]!) ? 1 : 0));
    const dReward = messages.map((_, i) => mean(gReward.slice(i * K, i * K + K)));
    const success = mean(gReward);
    // 4. advantages
    const msgKey = messages.map((m) => Array.from(m).join(","));
    const shaped = dReward.map((r, i) => {
      if (distinctBonus === 0) return r;
      const g = i % G, s = secrets[i]!;
      for (let s2 = 0; s2 < 8; s2++) if (s2 !== s && msgKey[s2 * G + g] === msgKey[i]) return r;
      return r + distinctBonus;
    });
    const dAdv = computeAdvantages(secrets.map((s, i) => ({ groupIndex: s, rolloutId: String(i), reward: shaped[i]! })), estimator, { failedGroupAdvantage });
    const gGroupOf = (j: number) =>
      guesserGroup === "secret" ? secrets[gEp[j]!]! : guesserGroup === "batch" ? 0 : gEp[j]!; // message: the K guesses of one message
    const gAdv = computeAdvantages(gReward.map((r, j) => ({ groupIndex: gGroupOf(j), rolloutId: String(j), reward: r })), estimator, { failedGroupAdvantage });
    // 5. train
    const sample = (prompt: Int32Array, o: Gen, adv: number): SampleToPack => ({
      tokens: cat(prompt, o.tokens), responseLength: o.tokens.length, lossMask: new Uint8Array(o.tokens.length).fill(1),
      rolloutLogprobs: o.logprobs, advantage: adv,
    });
    const lrScale = warmup > 0 ? Math.min(1, (step + 1) / warmup) : 1;
    const dKeep = dOut.map((_, i) => i).filter((i) => dOut[i]!.tokens.length > 0);
    const gKeep = gOut.map((_, j) => j).filter((j) => gOut[j]!.tokens.length > 0);
    const dS = dKeep.map((i) => sample(dPrompts[i]!, dOut[i]!, dAdv[i]!));
    const gS = gKeep.map((j) => sample(gPrompts[j]!, gOut[j]!, gAdv[j]!));
    const uD = uniformRoles !== "guesser" ? uniformCoef : 0, uG = uniformRoles !== "describer" ? uniformCoef : 0;
    const tD = await trainGrouped(desc, dS, dKeep.map((i) => secrets[i]!), dKeep.map((i) => dReward[i]!), lossCfgD, lrD * lrScale, uD);
    const tG = await trainGrouped(guess, gS, gKeep.map((j) => gEp[j]!), gKeep.map((j) => gReward[j]!), lossCfgG, lrG * lrScale, uG);
    const mD = tD.m, mG = tG.m;
    const tc = Date.now();
    tTrain += tc - tb;
    // 6. weight sync
    engD.close(), engG.close();
    engD = makeEngine(await mergedParams(desc));
    engG = makeEngine(await mergedParams(guess));
    tSync += Date.now() - tc;
    if (a.checkMerge && step === 3) {
      const seq = cat(dPrompts[0]!, dOut[0]!.tokens);
      const lp = (await desc.logprobs({ tokens: seq, cuSeqlens: new Int32Array([0, seq.length]) })).logprobs;
      const lg = engD.forwardLogits(seq), V = cfg.vocab_size;
      let maxErr = 0;
      for (let i = 1; i < seq.length; i++) {
        const row = lg.subarray((i - 1) * V, i * V);
        const mx = Math.max(...row);
        const lse = mx + Math.log(row.reduce((z, x) => z + Math.exp(x - mx), 0));
        maxErr = Math.max(maxErr, Math.abs(row[seq[i]!]! - lse - lp[i]!));
      }
      const l = await desc.getLora();
      console.log(JSON.stringify({ checkMerge: { maxAbsLogprobErr: maxErr, adapterAbsMax: l ? Math.max(...Array.from(l.params, Math.abs)) : null } }));
    }
    // 7. log
    hist.push(success);
    const ma = mean(hist.slice(-avgN));
    const seconds = (Date.now() - t0) / 1000;
    const distinctMsgs = new Set(msgKey).size;
    // messages used per secret: the most common message's share
    const top = Array.from({ length: 8 }, (_, s) => {
      const c = new Map<string, number>();
      msgKey.forEach((k, i) => secrets[i] === s && c.set(k, (c.get(k) ?? 0) + 1));
      return Math.max(...c.values()) / G;
    });
    const rec: Record<string, unknown> = {
      step, seconds: +seconds.toFixed(1), success: +success.toFixed(3), ma: +ma.toFixed(3),
      guessLetter: +mean(gOut.map((o) => (o.tokens.length && answers.includes(String.fromCharCode(o.tokens[0]!)) ? 1 : 0))).toFixed(3),
      distinctMsgs, msgTop: +mean(top).toFixed(2), entD: +mD.entropy.toFixed(3), entG: +mG.entropy.toFixed(3),
      gnD: +mD.gradNorm.toFixed(3), gnG: +mG.gradNorm.toFixed(3),
      ...(groupEntropy > 0 ? { boostD: tD.boosted, boostG: tG.boosted } : {}),
    };
    if (evalEvery > 0 && step % evalEvery === 0) {
      const eD = await generate(engD, Array.from({ length: 8 }, (_, s) => describerPrompt(s)), M, 0, 0);
      const eM = eD.map((o) => (o.stopped ? o.tokens.subarray(0, o.tokens.length - 1) : o.tokens));
      const eG = await generate(engG, eM.map(guesserPrompt), 1, 0, 0);
      rec.greedy = mean(eG.map((o, s) => (isRight(o.tokens, s) ? 1 : 0)));
      rec.msgs = eM.map((m) => JSON.stringify(Buffer.from(Array.from(m).filter((x) => x < 256)).toString("latin1"))).join(" ");
    }
    log(rec);
    if (!reached && hist.length >= avgN && ma >= target) {
      reached = { step, seconds };
      break;
    }
  }
  log({
    done: true, reached, steps: step + (reached ? 1 : 0), seconds: (Date.now() - t0) / 1000, lastMa: mean(hist.slice(-avgN)),
    best: Math.max(...hist.map((_, i) => mean(hist.slice(Math.max(0, i - avgN + 1), i + 1)))),
    timeSplit: { sample: tSample / 1000, train: tTrain / 1000, sync: tSync / 1000 },
  });
  engD.close(), engG.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
