// The SGLang /generate wire contract (see /work/shared/sglang-api.md): request and response types,
// the server-side request validator (SGLang defaults, null = default, out-of-range → 400 body) and
// the client-side response validator (a malformed response → EngineProtocolError naming URL and field).
import { z } from "zod";
import { EngineProtocolError } from "../errors.ts";
import type { BackendSampling, FinishReason } from "./backend.ts";

// ---------------------------------------------------------------------------------------------
// Wire types

/** `sampling_params` as SGLang accepts it (snake_case; every field optional; null = default). */
export interface WireSamplingParams {
  max_new_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_new_tokens?: number | null;
  stop?: string | string[] | null;
  stop_token_ids?: number[] | null;
  ignore_eos?: boolean | null;
  n?: number | null;
  skip_special_tokens?: boolean | null;
  no_stop_trim?: boolean | null;
  sampling_seed?: number | null;
  [other: string]: unknown;
}

/** A /generate request body. */
export interface WireGenerateRequest {
  text?: string | string[];
  input_ids?: number[] | number[][];
  sampling_params?: WireSamplingParams | WireSamplingParams[];
  rid?: string | string[];
  return_logprob?: boolean | boolean[];
  logprob_start_len?: number | number[];
  top_logprobs_num?: number | number[];
  return_text_in_logprobs?: boolean;
  stream?: boolean;
}

/** finish_reason as it travels. */
export type WireFinishReason = FinishReason;

/** One `[logprob, token_id, text_or_null]` triple. */
export type WireLogprobTriple = [number, number, string | null];

/** `meta_info` of a /generate response. */
export interface WireMetaInfo {
  id: string;
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number;
  e2e_latency: number;
  weight_version: string | null;
  finish_reason: WireFinishReason | null;
  output_token_logprobs?: WireLogprobTriple[];
  input_token_logprobs?: WireLogprobTriple[];
  [other: string]: unknown;
}

/** One /generate response object (a list of these for a batch or n > 1). */
export interface WireGenerateResponse {
  text: string;
  output_ids: number[];
  meta_info: WireMetaInfo;
  /** Position in the batch; set on streamed batch chunks. */
  index?: number;
}

/** SGLang's validation error body. */
export interface WireBadRequest {
  object: "error";
  message: string;
  type: "Bad Request";
  param: null;
  code: 400;
}

/** SGLang's validation error body for `message`. */
export function badRequestBody(message: string): WireBadRequest {
  return { object: "error", message, type: "Bad Request", param: null, code: 400 };
}

/** Sample status used by RL clients for a finish reason: stop → completed, length → truncated, abort → aborted. */
export function finishStatus(reason: FinishReason): "completed" | "truncated" | "aborted" {
  switch (reason.type) {
    case "stop":
      return "completed";
    case "length":
      return "truncated";
    case "abort":
      return "aborted";
  }
}

// ---------------------------------------------------------------------------------------------
// Server side: request validation and normalization

/** SGLang's defaults. */
export const SAMPLING_DEFAULTS = {
  max_new_tokens: 128,
  temperature: 1.0,
  top_p: 1.0,
  top_k: -1,
  min_new_tokens: 0,
  n: 1,
} as const;

const int = z.number().int();
const opt = <T extends z.ZodType>(t: T) => t.nullable().optional();
const tokenId = int.min(0);

const samplingSchema = z.looseObject({
  max_new_tokens: opt(int.min(0)),
  temperature: opt(z.number().min(0, "temperature must be non-negative")),
  top_p: opt(z.number().gt(0, "top_p must be in (0, 1]").lte(1, "top_p must be in (0, 1]")),
  top_k: opt(int.refine((k) => k === -1 || k >= 1, "top_k must be -1 (disable), or at least 1")),
  min_new_tokens: opt(int.min(0, "min_new_tokens must be non-negative")),
  stop: opt(z.union([z.string(), z.array(z.string())])),
  stop_token_ids: opt(z.array(tokenId)),
  ignore_eos: opt(z.boolean()),
  n: opt(int.min(1, "n must be at least 1").max(1024, "n must be at most 1024")),
  skip_special_tokens: opt(z.boolean()),
  no_stop_trim: opt(z.boolean()),
  sampling_seed: opt(int),
});

const perItem = <T extends z.ZodType>(t: T) => opt(z.union([t, z.array(t)]));

const requestSchema = z.looseObject({
  text: opt(z.union([z.string(), z.array(z.string()).min(1, "the batch is empty")])),
  input_ids: opt(
    z.union([
      z.array(tokenId).min(1, "input_ids is empty"),
      z.array(z.array(tokenId).min(1, "input_ids is empty")).min(1, "the batch is empty"),
    ]),
  ),
  sampling_params: opt(z.union([samplingSchema, z.array(samplingSchema)])),
  rid: perItem(z.string().min(1)),
  return_logprob: perItem(z.boolean()),
  logprob_start_len: perItem(int.min(-1)),
  top_logprobs_num: perItem(int.min(0)),
  return_text_in_logprobs: opt(z.boolean()),
  stream: opt(z.boolean()),
});

/** One request of a (possibly batched) /generate call, defaults applied. */
export interface GenerateItem {
  rid: string;
  /** Position in the response list. */
  index: number;
  /** Exactly one of inputIds and text is non-null. */
  inputIds: Int32Array | null;
  text: string | null;
  sampling: BackendSampling;
  stop: string[];
  skipSpecialTokens: boolean;
  noStopTrim: boolean;
  returnLogprob: boolean;
  returnTextInLogprobs: boolean;
}

/** A validated /generate request. */
export interface GenerateCall {
  items: GenerateItem[];
  /** true → the response is a list (batch input or n > 1). */
  isBatch: boolean;
  stream: boolean;
}

/** Result of validation: a call, or the message of a 400. */
export type ParseResult = { ok: true; call: GenerateCall } | { ok: false; message: string };

function issueText(err: z.ZodError): string {
  const first = err.issues[0];
  if (!first) return "invalid request";
  const path = first.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("");
  return `${path.replace(/^\./, "") || "body"}: ${first.message}`;
}

function pick<T>(v: T | T[] | null | undefined, i: number, name: string, count: number): T | undefined {
  if (v === null || v === undefined) return undefined;
  if (!Array.isArray(v)) return v;
  if (v.length !== count) throw new Error(`${name}: a list must have one entry per input (${count}), got ${v.length}`);
  return v[i];
}

/**
 * Validates and normalizes a /generate body. `newRid` makes fresh request ids; `vocabSize`, when
 * given, bounds token ids. Never throws.
 */
export function parseGenerateRequest(body: unknown, newRid: () => string, vocabSize?: number): ParseResult {
  const parsed = requestSchema.safeParse(body);
  if (!parsed.success) return { ok: false, message: issueText(parsed.error) };
  const r = parsed.data;
  const hasText = r.text !== undefined && r.text !== null;
  const hasIds = r.input_ids !== undefined && r.input_ids !== null;
  if (hasText === hasIds) return { ok: false, message: "Either text or input_ids should be provided, not both and not neither." };
  try {
    let inputs: (Int32Array | string)[];
    let batchInput: boolean;
    if (hasIds) {
      const ids = r.input_ids!;
      batchInput = Array.isArray(ids[0]);
      const lists = (batchInput ? ids : [ids]) as number[][];
      inputs = lists.map((l, i) => {
        if (vocabSize !== undefined) {
          const bad = l.findIndex((t) => t >= vocabSize);
          if (bad >= 0) throw new Error(`input_ids${batchInput ? `[${i}]` : ""}[${bad}]: token id ${l[bad]} is outside the vocabulary (size ${vocabSize})`);
        }
        return Int32Array.from(l);
      });
    } else {
      batchInput = Array.isArray(r.text);
      inputs = batchInput ? (r.text as string[]) : [r.text as string];
    }
    const count = inputs.length;
    const sp = r.sampling_params;
    if (Array.isArray(sp) && !batchInput) return { ok: false, message: "sampling_params: a list is only allowed for a batch input" };
    if (Array.isArray(r.rid) && !batchInput) return { ok: false, message: "rid: a list is only allowed for a batch input" };
    const items: GenerateItem[] = [];
    let anyN = false;
    for (let i = 0; i < count; i++) {
      const s: z.infer<typeof samplingSchema> = pick(sp, i, "sampling_params", count) ?? {};
      const n = s.n ?? SAMPLING_DEFAULTS.n;
      if (n > 1) anyN = true;
      const maxNew = s.max_new_tokens === undefined ? SAMPLING_DEFAULTS.max_new_tokens : s.max_new_tokens;
      const minNew = s.min_new_tokens ?? SAMPLING_DEFAULTS.min_new_tokens;
      if (maxNew !== null && minNew > maxNew) {
        throw new Error(`sampling_params.min_new_tokens (${minNew}) must not exceed max_new_tokens (${maxNew})`);
      }
      const stopTokenIds = s.stop_token_ids ?? [];
      if (vocabSize !== undefined) {
        const bad = stopTokenIds.find((t) => t >= vocabSize);
        if (bad !== undefined) throw new Error(`sampling_params.stop_token_ids: token id ${bad} is outside the vocabulary (size ${vocabSize})`);
      }
      const stop = s.stop === undefined || s.stop === null ? [] : typeof s.stop === "string" ? [s.stop] : s.stop;
      const returnLogprob = pick(r.return_logprob, i, "return_logprob", count) ?? false;
      const startLen = pick(r.logprob_start_len, i, "logprob_start_len", count) ?? -1;
      const topN = pick(r.top_logprobs_num, i, "top_logprobs_num", count) ?? 0;
      if (returnLogprob && startLen !== -1) {
        throw new Error("logprob_start_len: prompt logprobs are not supported by this engine; use -1 (output tokens only)");
      }
      if (returnLogprob && topN > 0) throw new Error("top_logprobs_num: top logprobs are not supported by this engine; use 0");
      const ridIn = pick(r.rid, i, "rid", count);
      const input = inputs[i]!;
      for (let j = 0; j < n; j++) {
        const baseRid = ridIn ?? null;
        let rid: string;
        if (baseRid === null) rid = newRid();
        else if (!batchInput && n === 1) rid = baseRid;
        else if (Array.isArray(r.rid)) rid = n === 1 ? baseRid : `${baseRid}_${j}`;
        else rid = `${baseRid}_${i * n + j}`;
        items.push({
          rid,
          index: items.length,
          inputIds: typeof input === "string" ? null : input,
          text: typeof input === "string" ? input : null,
          sampling: {
            maxNewTokens: maxNew,
            temperature: s.temperature ?? SAMPLING_DEFAULTS.temperature,
            topP: s.top_p ?? SAMPLING_DEFAULTS.top_p,
            topK: s.top_k ?? SAMPLING_DEFAULTS.top_k,
            minNewTokens: minNew,
            stopTokenIds,
            ignoreEos: s.ignore_eos ?? false,
            // Parallel samples of one input must differ: derive a seed per sample.
            seed: s.sampling_seed === undefined || s.sampling_seed === null ? null : s.sampling_seed + j,
          },
          stop,
          skipSpecialTokens: s.skip_special_tokens ?? true,
          noStopTrim: s.no_stop_trim ?? false,
          returnLogprob,
          returnTextInLogprobs: r.return_text_in_logprobs ?? false,
        });
      }
    }
    const rids = new Set(items.map((it) => it.rid));
    if (rids.size !== items.length) return { ok: false, message: "rid: request ids in one call must be distinct" };
    return { ok: true, call: { items, isBatch: batchInput || anyN, stream: r.stream ?? false } };
  } catch (e) {
    return { ok: false, message: e instanceof Error ? e.message : String(e) };
  }
}

// ---------------------------------------------------------------------------------------------
// Client side: response validation

const finishSchema = z.union([
  z.looseObject({ type: z.literal("stop"), matched: z.union([int, z.string(), z.null()]).optional() }),
  z.looseObject({ type: z.literal("length"), length: int.min(0) }),
  z.looseObject({ type: z.literal("abort"), message: z.union([z.string(), z.null()]).optional() }),
]);

const tripleSchema = z.tuple([z.number(), int, z.union([z.string(), z.null()])]).rest(z.unknown());

const metaSchema = z.looseObject({
  id: z.string(),
  prompt_tokens: int.min(0),
  completion_tokens: int.min(0),
  cached_tokens: int.min(0).optional(),
  e2e_latency: z.number().optional(),
  weight_version: z.union([z.string(), z.null()]).optional(),
  finish_reason: z.union([finishSchema, z.null()]),
  output_token_logprobs: z.array(tripleSchema).optional(),
});

const responseSchema = z.looseObject({
  text: z.string().optional(),
  output_ids: z.array(int).optional(),
  meta_info: metaSchema,
  index: int.min(0).optional(),
});

/** A validated /generate response object, in ooze's shapes. */
export interface GenerateOutput {
  rid: string;
  text: string;
  /** Sampled ids: from output_token_logprobs position 1 when logprobs were returned, else output_ids. */
  outputIds: Int32Array;
  /** Logprobs from output_token_logprobs position 0; empty when logprobs were not requested. */
  logprobs: Float32Array;
  /** null only on a streamed chunk before the last. */
  finishReason: FinishReason | null;
  index: number | null;
  meta: GenerateMeta;
}

/** meta_info in ooze's shapes; `raw` keeps every field the server sent. */
export interface GenerateMeta {
  id: string;
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
  e2eLatency: number | null;
  weightVersion: string | null;
  raw: Record<string, unknown>;
}

function fieldOf(path: readonly PropertyKey[], prefix: string): string {
  let s = prefix;
  for (const p of path) s += typeof p === "number" ? `[${p}]` : `${s ? "." : ""}${String(p)}`;
  return s || "body";
}

type Triple = [number, number, string | null, ...unknown[]];

/** A list of token ids the schema accepts (checked by hand: it is the long part of a response). */
function idList(v: unknown): v is number[] {
  if (!Array.isArray(v)) return false;
  for (const x of v) if (!Number.isSafeInteger(x)) return false;
  return true;
}

/** A list of [logprob, id, text|null] triples the schema accepts. */
function tripleList(v: unknown): v is Triple[] {
  if (!Array.isArray(v)) return false;
  for (const t of v) {
    if (!Array.isArray(t) || t.length < 3 || typeof t[0] !== "number" || !Number.isFinite(t[0]) || !Number.isSafeInteger(t[1]) || (t[2] !== null && typeof t[2] !== "string")) return false;
  }
  return true;
}

/**
 * The response with its long lists (output_ids, output_token_logprobs) set aside when they are
 * well-formed — checked by hand, a subset of what the schema accepts — so that the schema only walks
 * the rest: a streamed answer sends every list again in every chunk. A list that fails the hand check
 * stays in, and the schema reports it as it would.
 */
function setAsideLists(json: unknown): { subject: unknown; ids: number[] | null; triples: Triple[] | null } {
  if (!json || typeof json !== "object" || Array.isArray(json)) return { subject: json, ids: null, triples: null };
  const o = json as Record<string, unknown>;
  const m = o.meta_info;
  const ids = idList(o.output_ids) ? o.output_ids : null;
  const meta = m && typeof m === "object" && !Array.isArray(m) ? (m as Record<string, unknown>) : null;
  const triples = meta && tripleList(meta.output_token_logprobs) ? meta.output_token_logprobs : null;
  if (ids === null && triples === null) return { subject: json, ids, triples };
  const subject: Record<string, unknown> = { ...o };
  if (ids !== null) subject.output_ids = [];
  if (triples !== null) subject.meta_info = { ...meta, output_token_logprobs: [] };
  return { subject, ids, triples };
}

/**
 * Validates one /generate response object from `url`. `wantLogprobs` requires
 * output_token_logprobs; `final` requires a finish_reason. Throws EngineProtocolError.
 */
export function parseGenerateResponse(
  url: string,
  json: unknown,
  opts: { wantLogprobs: boolean; final: boolean; prefix?: string },
): GenerateOutput {
  const prefix = opts.prefix ?? "";
  const aside = setAsideLists(json);
  const parsed = responseSchema.safeParse(aside.subject);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new EngineProtocolError(url, fieldOf(issue.path, prefix), issue.message);
  }
  const r = parsed.data;
  if (aside.ids !== null) r.output_ids = aside.ids;
  const m = r.meta_info;
  if (aside.triples !== null) m.output_token_logprobs = aside.triples;
  const field = (f: string) => fieldOf([], prefix ? `${prefix}.${f}` : f);
  if (opts.final && m.finish_reason === null) throw new EngineProtocolError(url, field("meta_info.finish_reason"), "is null in a final response");
  let outputIds: Int32Array;
  let logprobs: Float32Array;
  if (opts.wantLogprobs) {
    const triples = m.output_token_logprobs;
    if (triples === undefined) throw new EngineProtocolError(url, field("meta_info.output_token_logprobs"), "missing although return_logprob was requested");
    outputIds = new Int32Array(triples.length);
    logprobs = new Float32Array(triples.length);
    triples.forEach((t, i) => {
      outputIds[i] = t[1];
      logprobs[i] = t[0];
    });
  } else {
    if (r.output_ids === undefined) throw new EngineProtocolError(url, field("output_ids"), "missing");
    outputIds = Int32Array.from(r.output_ids);
    logprobs = new Float32Array(0);
  }
  const fr = m.finish_reason;
  let finishReason: FinishReason | null = null;
  if (fr) {
    if (fr.type === "stop") finishReason = { type: "stop", matched: fr.matched ?? -1 };
    else if (fr.type === "length") finishReason = { type: "length", length: fr.length };
    else finishReason = { type: "abort", message: fr.message ?? "" };
  }
  return {
    rid: m.id,
    text: r.text ?? "",
    outputIds,
    logprobs,
    finishReason,
    index: r.index ?? null,
    meta: {
      id: m.id,
      promptTokens: m.prompt_tokens,
      completionTokens: m.completion_tokens,
      cachedTokens: m.cached_tokens ?? 0,
      e2eLatency: m.e2e_latency ?? null,
      weightVersion: m.weight_version ?? null,
      raw: m as Record<string, unknown>,
    },
  };
}
