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
  /** The LoRA adapter (its name as loaded) per request: one for all, or one per batch item (null: the base). */
  lora_path?: string | (string | null)[] | null;
}

/** finish_reason as it travels; SGLang adds `status_code` and `err_type` to an abort it decided itself (400: the request was refused). */
export type WireFinishReason = FinishReason & { status_code?: number; err_type?: string };

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
  lora_path: opt(z.union([z.string().min(1, "lora_path must name a loaded adapter"), z.array(z.string().min(1, "lora_path must name a loaded adapter").nullable())])),
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
  /** max_new_tokens as the request gave it (null: absent or null): SGLang checks the length against this, not the default. */
  maxNewTokensSent: number | null;
  stop: string[];
  skipSpecialTokens: boolean;
  noStopTrim: boolean;
  returnLogprob: boolean;
  returnTextInLogprobs: boolean;
  /** The LoRA adapter's name (`lora_path`), or null for the base. */
  lora: string | null;
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
    if (Array.isArray(r.lora_path) && !batchInput) return { ok: false, message: "lora_path: a list is only allowed for a batch input" };
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
      const lora = pick(r.lora_path, i, "lora_path", count) ?? null;
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
          maxNewTokensSent: s.max_new_tokens ?? null,
          stop,
          skipSpecialTokens: s.skip_special_tokens ?? true,
          noStopTrim: s.no_stop_trim ?? false,
          returnLogprob,
          returnTextInLogprobs: r.return_text_in_logprobs ?? false,
          lora,
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

/** A response that breaks the contract: where (a path below the response) and what. */
class Malformed extends Error {
  constructor(
    readonly path: readonly PropertyKey[],
    message: string,
  ) {
    super(message);
  }
}

const kind = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
const bad = (path: readonly PropertyKey[], want: string, v: unknown): Malformed =>
  new Malformed(path, v === undefined ? `missing (expected ${want})` : `expected ${want}, got ${kind(v)}${typeof v === "number" ? ` ${v}` : ""}`);

function object(v: unknown, path: readonly PropertyKey[]): Record<string, unknown> {
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw bad(path, "an object", v);
  return v as Record<string, unknown>;
}
function count(v: unknown, path: readonly PropertyKey[]): number {
  if (!Number.isSafeInteger(v) || (v as number) < 0) throw bad(path, "an integer ≥ 0", v);
  return v as number;
}
function optional<T>(v: unknown, path: readonly PropertyKey[], check: (v: unknown, path: readonly PropertyKey[]) => T): T | undefined {
  return v === undefined ? undefined : check(v, path);
}
function text(v: unknown, path: readonly PropertyKey[]): string {
  if (typeof v !== "string") throw bad(path, "a string", v);
  return v;
}
function textOrNull(v: unknown, path: readonly PropertyKey[]): string | null {
  if (v !== null && typeof v !== "string") throw bad(path, "a string or null", v);
  return v;
}
function finite(v: unknown, path: readonly PropertyKey[]): number {
  if (typeof v !== "number" || !Number.isFinite(v)) throw bad(path, "a finite number", v);
  return v;
}
function idList(v: unknown, path: readonly PropertyKey[]): number[] {
  if (!Array.isArray(v)) throw bad(path, "a list of token ids", v);
  for (let i = 0; i < v.length; i++) if (!Number.isSafeInteger(v[i])) throw bad([...path, i], "an integer token id", v[i]);
  return v as number[];
}
/** output_token_logprobs: [logprob, id, text|null, ...] per token. */
function tripleList(v: unknown, path: readonly PropertyKey[]): unknown[][] {
  if (!Array.isArray(v)) throw bad(path, "a list of [logprob, id, text] triples", v);
  for (let i = 0; i < v.length; i++) {
    const t: unknown = v[i];
    if (!Array.isArray(t)) throw bad([...path, i], "a [logprob, id, text] triple", t);
    if (typeof t[0] !== "number" || !Number.isFinite(t[0])) throw bad([...path, i, 0], "a finite logprob", t[0]);
    if (!Number.isSafeInteger(t[1])) throw bad([...path, i, 1], "an integer token id", t[1]);
    if (t[2] !== null && typeof t[2] !== "string") throw bad([...path, i, 2], "a string or null", t[2]);
  }
  return v as unknown[][];
}
function finishReason(v: unknown, path: readonly PropertyKey[]): FinishReason | null {
  if (v === null) return null;
  const o = object(v, path);
  if (o.type === "stop") {
    const m = o.matched;
    if (m !== undefined && m !== null && typeof m !== "string" && !Number.isSafeInteger(m)) throw bad([...path, "matched"], "a token id, a string or null", m);
    return { type: "stop", matched: (m as number | string | null | undefined) ?? -1 };
  }
  if (o.type === "length") return { type: "length", length: count(o.length, [...path, "length"]) };
  if (o.type === "abort") return { type: "abort", message: optional(o.message, [...path, "message"], textOrNull) ?? "" };
  throw new Malformed(path, `expected a finish reason of type stop, length or abort, got ${JSON.stringify(o.type) ?? "none"}`);
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
  try {
    const r = object(json, []);
    const m = object(r.meta_info, ["meta_info"]);
    const at = (f: string): PropertyKey[] => ["meta_info", f];
    const fr = finishReason(m.finish_reason, at("finish_reason"));
    if (opts.final && fr === null) throw new Malformed(at("finish_reason"), "is null in a final response");
    // Both lists are checked when present, whichever is used.
    const ids = optional(r.output_ids, ["output_ids"], idList);
    const triples = optional(m.output_token_logprobs, at("output_token_logprobs"), tripleList);
    let outputIds: Int32Array;
    let logprobs: Float32Array;
    if (opts.wantLogprobs) {
      if (triples === undefined) throw new Malformed(at("output_token_logprobs"), "missing although return_logprob was requested");
      outputIds = new Int32Array(triples.length);
      logprobs = new Float32Array(triples.length);
      for (let i = 0; i < triples.length; i++) {
        outputIds[i] = triples[i]![1] as number;
        logprobs[i] = triples[i]![0] as number;
      }
    } else {
      if (ids === undefined) throw new Malformed(["output_ids"], "missing");
      outputIds = Int32Array.from(ids);
      logprobs = new Float32Array(0);
    }
    const id = text(m.id, at("id"));
    return {
      rid: id,
      text: optional(r.text, ["text"], text) ?? "",
      outputIds,
      logprobs,
      finishReason: fr,
      index: optional(r.index, ["index"], count) ?? null,
      meta: {
        id,
        promptTokens: count(m.prompt_tokens, at("prompt_tokens")),
        completionTokens: count(m.completion_tokens, at("completion_tokens")),
        cachedTokens: optional(m.cached_tokens, at("cached_tokens"), count) ?? 0,
        e2eLatency: optional(m.e2e_latency, at("e2e_latency"), finite) ?? null,
        weightVersion: optional(m.weight_version, at("weight_version"), textOrNull) ?? null,
        raw: m,
      },
    };
  } catch (e) {
    if (e instanceof Malformed) throw new EngineProtocolError(url, fieldOf(e.path, prefix), e.message);
    throw e;
  }
}
