// Token-in, token-out as an invariant: every token a job trained on as the model's own (loss mask 1)
// is a token an engine sampled, in the context it was sampled in. Two records meet here: what the
// engines returned (an engine fault proxy with `record` appends each /generate's input ids and
// output ids, read off the wire, to a JSONL file) and what the trainer trained (`train.recordTokens`:
// OUT/samples.jsonl, each trained sample's tokens and the ranges the model sampled).
//
// A sampled range [s, e) of a trained sample's tokens T holds when a chain of engine outputs covers
// it: an output to a request whose input ids were exactly T[0:s] matches T[s:s+k] (a prefix of the
// output: a client keeps what reached it of a stream that was cut, or stops at a stop string), the
// next one answers T[0:s+k] (a generation resumed after an abort, partial rollout), and so on to e.
// A token decoded and encoded again, a token the environment added under mask 1, a span spliced into
// the wrong context: each leaves a position no engine output reaches.
import { createHash } from "node:crypto";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import type { Invariant, JobOutcome } from "./invariants.ts";
import { readJsonLines } from "./invariants.ts";

/** One line of an engine output record: a /generate's input ids and the ids the engine returned for them. */
export interface EngineOutputRecord {
  input: number[];
  output: number[];
}

/** One line of samples.jsonl (train.recordTokens): the fields tokensAsSampled reads. */
export interface SampleTokensLine {
  step: number;
  index: number;
  tokens: number[];
  /** [start, end) positions in `tokens` sampled by the model (loss mask 1). */
  sampled: [number, number][];
}

type WireOutput = { output_ids?: unknown; meta_info?: { completion_tokens?: unknown }; index?: unknown };

const ids = (x: unknown): number[] | null => (Array.isArray(x) && x.every((v) => Number.isInteger(v)) ? (x as number[]) : null);

/**
 * The (input, output) pairs of one /generate exchange read off the wire: the request's `input_ids`
 * (one list, or a batch of lists; `n` > 1 repeats each input) and the response — a JSON object or
 * list, or an SSE stream whose chunks are cumulative (SGLang's default) or incremental (each carries
 * only new ids: fewer than `meta_info.completion_tokens`, completing the previous chunk's). Requests
 * by `text`, and bodies that cannot be read, give nothing.
 */
export function engineOutputsOf(requestBody: Buffer | string, responseBody: Buffer | string, contentType = ""): EngineOutputRecord[] {
  let req: { input_ids?: unknown; sampling_params?: { n?: unknown } | { n?: unknown }[] };
  try {
    req = JSON.parse(requestBody.toString()) as typeof req;
  } catch {
    return [];
  }
  const single = ids(req.input_ids);
  const batch = single ? [single] : Array.isArray(req.input_ids) ? req.input_ids.map(ids) : [];
  if (batch.length === 0 || batch.some((x) => x === null)) return [];
  const sp = Array.isArray(req.sampling_params) ? req.sampling_params[0] : req.sampling_params;
  const n = typeof sp?.n === "number" && sp.n > 1 ? sp.n : 1;
  const inputs = (batch as number[][]).flatMap((x) => Array.from({ length: n }, () => x));
  const text = responseBody.toString();
  const outputs: (number[] | null)[] = inputs.map(() => null);
  if (contentType.includes("text/event-stream")) {
    for (const event of text.split(/\n\n/)) {
      const data = event.split("\n").find((l) => l.startsWith("data:"))?.slice(5).trim();
      if (!data || data === "[DONE]") continue;
      let chunk: WireOutput;
      try {
        chunk = JSON.parse(data) as WireOutput;
      } catch {
        continue; // a cut stream's last event
      }
      const got = ids(chunk.output_ids);
      const k = typeof chunk.index === "number" ? chunk.index : 0;
      if (got === null || k < 0 || k >= outputs.length) continue;
      const prev = outputs[k] ?? null;
      const total = chunk.meta_info?.completion_tokens;
      const incremental = prev !== null && typeof total === "number" && got.length < total && prev.length + got.length === total;
      outputs[k] = incremental && prev ? [...prev, ...got] : got;
    }
  } else {
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      return [];
    }
    const list = Array.isArray(body) ? body : [body];
    list.forEach((o: WireOutput, k) => {
      if (k < outputs.length) outputs[k] = ids(o?.output_ids);
    });
  }
  return inputs.flatMap((input, k) => (outputs[k] ? [{ input, output: outputs[k] }] : []));
}

const digest = (xs: ArrayLike<number>, end: number): string => {
  const h = createHash("sha1");
  h.update(Buffer.from(Int32Array.from({ length: end }, (_, i) => xs[i]!).buffer));
  return h.digest("base64");
};

/** Engine outputs by the digest of their input ids. */
export class EngineOutputIndex {
  private readonly byInput = new Map<string, number[][]>();
  size = 0;

  add(r: EngineOutputRecord): void {
    const key = digest(r.input, r.input.length);
    const list = this.byInput.get(key) ?? [];
    list.push(r.output);
    this.byInput.set(key, list);
    this.size++;
  }

  /** Outputs of requests whose input was exactly tokens[0:end]. */
  answers(tokens: ArrayLike<number>, end: number): readonly number[][] {
    return this.byInput.get(digest(tokens, end)) ?? [];
  }
}

/**
 * The first position of [s, e) in `tokens` that no chain of engine outputs reaches from s, or null
 * when e is reached (see the file comment).
 */
export function uncoveredAt(tokens: ArrayLike<number>, s: number, e: number, index: EngineOutputIndex): number | null {
  const reached = new Set<number>([s]);
  let frontier = [s];
  let furthest = s;
  while (frontier.length > 0) {
    const next: number[] = [];
    for (const q of frontier) {
      for (const out of index.answers(tokens, q)) {
        for (let k = 0; k < out.length && q + k < e && out[k] === tokens[q + k]; k++) {
          const p = q + k + 1;
          if (reached.has(p)) continue;
          reached.add(p);
          next.push(p);
          furthest = Math.max(furthest, p);
        }
      }
    }
    if (reached.has(e)) return null;
    frontier = next;
  }
  return furthest;
}

/** Options of tokensAsSampled. */
export interface TokensAsSampledOptions {
  /** Engine output records (JSONL); default every *.jsonl under JOB_DIR/engine-outputs/. */
  engineOutputs?: (job: JobOutcome) => string[];
}

/**
 * Every trained sample's model tokens equal what an engine sampled, in the context it sampled them
 * (see the file comment). Needs the job's trainer to record tokens (`train.recordTokens: true`,
 * OUT/samples.jsonl) and the engines' outputs recorded (startEngineFaultProxy's `record`); a trained
 * sample with no token record fails, and so does a job with trained samples and no engine record.
 */
export function tokensAsSampled(o: TokensAsSampledOptions = {}): Invariant {
  return {
    name: "every trained token is one an engine sampled",
    check(job) {
      const files = o.engineOutputs?.(job) ?? defaultEngineOutputs(job.dir);
      const index = new EngineOutputIndex();
      for (const f of files) for (const r of readJsonLines<EngineOutputRecord>(f)) index.add(r);
      const trained = readJsonLines<{ step: number; trained: number[] }>(join(job.dir, "batches.jsonl"));
      const records = new Map<string, SampleTokensLine>();
      for (const r of readJsonLines<SampleTokensLine>(join(job.dir, "samples.jsonl"))) records.set(`${r.step}:${r.index}`, r);
      let samples = 0;
      let tokens = 0;
      const bad: string[] = [];
      for (const b of trained) {
        for (const i of b.trained) {
          const r = records.get(`${b.step}:${i}`);
          if (!r) {
            bad.push(`step ${b.step} sample ${i}: no token record in samples.jsonl (is train.recordTokens on?)`);
            continue;
          }
          samples++;
          for (const [s, e] of r.sampled) {
            tokens += e - s;
            const at = uncoveredAt(r.tokens, s, e, index);
            if (at !== null) {
              bad.push(`step ${b.step} sample ${i}: model tokens ${s}..${e} not sampled by any engine from position ${at} (token ${r.tokens[at]}, context of ${at} tokens)`);
              break;
            }
          }
        }
      }
      const head = `${samples} trained samples, ${tokens} model tokens against ${index.size} engine outputs from ${files.length} record(s)`;
      if (samples > 0 && index.size === 0) return { ok: false, detail: `${head}: no engine output recorded (give the engine proxies a record file)` };
      return bad.length === 0 ? { ok: true, detail: head } : { ok: false, detail: `${head}; ${bad.length} not as sampled: ${bad.slice(0, 3).join("; ")}${bad.length > 3 ? "; …" : ""}` };
    },
  };
}

/** The engine output records under DIR/engine-outputs/. */
function defaultEngineOutputs(dir: string): string[] {
  const d = join(dir, "engine-outputs");
  return existsSync(d) ? readdirSync(d).filter((f) => f.endsWith(".jsonl")).sort().map((f) => join(d, f)) : [];
}
