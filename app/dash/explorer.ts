// The trajectory explorer's data: a run directory's explorer files (DIR/explorer/step-*.jsonl, written
// by the trainer: actors/trainer/explorer-log.ts) read into the episode table the page filters and
// sorts, and one episode in full — every trajectory segment of it with its tokens decoded one by one
// (the run's tokenizer.json when meta.json names a model directory that has one, else the byte
// tokenizer), loss mask, sampled logprobs and weight-version spans — with the other episodes of its
// group. Files are parsed once per change (size and mtime), so a page refreshing the table each step
// reads only the new step's file.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { explorerFileStep, type ExplorerMeta, type ExplorerRecord } from "../../actors/trainer/explorer-log.ts";
import { BOS_ID, BYTE_VOCAB, decodeBytes, EOS_ID, PAD_ID } from "../../src/engine/tokenizer.ts";
import { OozeError } from "../../src/errors.ts";
import { loadHfChatModel } from "../../src/gateway/tokenizer.ts";

/** One row of the episode table (one trajectory segment; an episode's segments share `episode`). */
export interface ExplorerRow {
  step: number;
  index: number;
  group: number;
  /** The episode: its rolloutId (segments of one agent episode share it). */
  episode: string;
  /** Trajectory segment within the episode, and how many the episode had (agent episodes). */
  segment: number;
  segments: number;
  status: string;
  trained: boolean;
  reward: number | null;
  advantage: number | null;
  /** Weight versions that sampled it, oldest first ([] for none). */
  versions: string[];
  /** Sampled under more than one weight version (a partial rollout). */
  partial: boolean;
  promptLength: number;
  responseLength: number;
  /** Response tokens the model sampled (loss mask 1). */
  modelTokens: number;
  turns: number | null;
  /** Agent episodes: the agent's exit code (or signal) and seconds. */
  agentExit: string | null;
  seconds: number | null;
  /** Why it failed (metadata.error), or null. */
  error: string | null;
  /** The prompt as text (clipped). */
  prompt: string;
  /** The response as text (clipped): what the page's search reads, with prompt and error. */
  response: string;
}

/** One segment of an episode, in full. */
export interface ExplorerSegment extends ExplorerRow {
  /** Every token (prompt then response): its id and its text. */
  ids: number[];
  pieces: string[];
  /** Over the response. */
  lossMask: number[];
  logprobs: number[];
  spans: { start: number; end: number; version: string }[];
  metadata: Record<string, unknown>;
  promptValue: unknown;
}

/** What the page's episode view shows. */
export interface ExplorerEpisode {
  step: number;
  episode: string;
  /** The episode's segments, in segment order (one for a plain task). */
  segments: ExplorerSegment[];
  /** The rows of its group at that step (the prompt's other episodes too). */
  group: ExplorerRow[];
}

/** The table of a run's explorer files. */
export interface ExplorerTable {
  dir: string;
  tokenizer: string;
  steps: number[];
  rows: ExplorerRow[];
  /** Why there is nothing (no explorer directory yet, explorer off), or a malformed file; null when fine. */
  error: string | null;
}

interface Decoder {
  name: string;
  piece(id: number): string;
  text(ids: ArrayLike<number>): string;
}

const byteDecoder: Decoder = {
  name: "bytes",
  piece: (id) =>
    id === BOS_ID ? "<bos>" : id === EOS_ID ? "<eos>" : id === PAD_ID ? "<pad>" : id >= BYTE_VOCAB || id < 0 ? `<${id}>`
    : id >= 32 && id < 127 ? String.fromCharCode(id) : id === 10 ? "\n" : `\\x${id.toString(16).padStart(2, "0")}`,
  text: (ids) => decodeBytes(ids, true),
};

const hfDecoders = new Map<string, Decoder>();

/** The decoder of a run: its model directory's tokenizer.json, else bytes. */
function decoderOf(meta: ExplorerMeta | null): Decoder {
  const dir = meta?.tokenizer ?? null;
  if (dir === null || !existsSync(join(dir, "tokenizer.json"))) return byteDecoder;
  let d = hfDecoders.get(dir);
  if (!d) {
    const tok = loadHfChatModel(dir).tokenizer;
    d = { name: dir, piece: (id) => tok.decode([id], false), text: (ids) => tok.decode(ids, true) };
    hfDecoders.set(dir, d);
  }
  return d;
}

const fromB64 = (s: string) => {
  const b = Buffer.from(s, "base64");
  // a copy at offset 0: typed-array views need an aligned offset
  return new Uint8Array(b).buffer;
};

interface Decoded {
  rec: ExplorerRecord;
  ids: Int32Array;
  mask: Uint8Array;
  logprobs: Float32Array;
}

function decodeRecord(rec: ExplorerRecord): Decoded {
  return { rec, ids: new Int32Array(fromB64(rec.tokens)), mask: new Uint8Array(fromB64(rec.lossMask)), logprobs: new Float32Array(fromB64(rec.logprobs)) };
}

const clip = (s: string, n: number) => (s.length > n ? `${s.slice(0, n)}…` : s);
const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);

function promptText(p: unknown): string {
  if (typeof p === "string") return p;
  if (Array.isArray(p)) return p.map((m) => (m && typeof m === "object" && "content" in m ? String((m as { content: unknown }).content) : JSON.stringify(m))).join(" | ");
  return p === null || p === undefined ? "" : JSON.stringify(p);
}

function rowOf(d: Decoded, dec: Decoder): ExplorerRow {
  const { rec } = d;
  const md = rec.metadata ?? {};
  const versions = [...new Set(rec.versions.map((s) => s.version))];
  const agent = md.agent && typeof md.agent === "object" ? (md.agent as { exitCode?: unknown; signal?: unknown; seconds?: unknown }) : null;
  let modelTokens = 0;
  for (const m of d.mask) modelTokens += m;
  return {
    step: rec.step, index: rec.index, group: rec.group, episode: rec.rolloutId,
    segment: num(md.segment) ?? 0, segments: num(md.segments) ?? 1,
    status: rec.status, trained: rec.trained, reward: rec.reward, advantage: rec.advantage,
    versions, partial: versions.length > 1,
    promptLength: rec.promptLength, responseLength: rec.responseLength, modelTokens,
    turns: num(md.turns),
    agentExit: agent ? (agent.signal ? String(agent.signal) : agent.exitCode === null || agent.exitCode === undefined ? null : String(agent.exitCode)) : null,
    seconds: agent ? num(agent.seconds) : null,
    error: typeof md.error === "string" ? md.error : null,
    prompt: clip(promptText(rec.prompt), 300),
    response: clip(dec.text(d.ids.subarray(rec.promptLength)), 1000),
  };
}

/** A run directory's explorer files, cached per file (size and mtime). */
export class ExplorerReader {
  private readonly cache = new Map<string, { key: string; recs: Decoded[]; rows: ExplorerRow[] | null; bad: string | null }>();

  private dirOf(run: string): string {
    return join(resolve(run), "explorer");
  }

  private meta(dir: string): ExplorerMeta | null {
    try {
      return JSON.parse(readFileSync(join(dir, "meta.json"), "utf8")) as ExplorerMeta;
    } catch {
      return null;
    }
  }

  private stepFile(dir: string, file: string): { recs: Decoded[]; bad: string | null } {
    const path = join(dir, file);
    const st = statSync(path);
    const key = `${st.size}:${st.mtimeMs}`;
    const hit = this.cache.get(path);
    if (hit && hit.key === key) return hit;
    const recs: Decoded[] = [];
    let bad: string | null = null;
    readFileSync(path, "utf8").split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      try {
        const rec = JSON.parse(line) as ExplorerRecord;
        if (typeof rec.step !== "number" || typeof rec.tokens !== "string") throw new Error("not an explorer record");
        recs.push(decodeRecord(rec));
      } catch (e) {
        bad ??= `${path} line ${i + 1}: ${(e as Error).message}`;
      }
    });
    const entry = { key, recs, rows: null, bad };
    this.cache.set(path, entry);
    return entry;
  }

  private files(dir: string): { step: number; file: string }[] {
    return readdirSync(dir)
      .map((file) => ({ step: explorerFileStep(file), file }))
      .filter((f): f is { step: number; file: string } => f.step !== null)
      .sort((a, b) => a.step - b.step);
  }

  /** The episode table of run directory `run` (its newest `maxSteps` steps). */
  table(run: string, maxSteps = 1000): ExplorerTable {
    const dir = this.dirOf(run);
    if (!existsSync(dir))
      return { dir, tokenizer: "bytes", steps: [], rows: [], error: `no explorer files in ${resolve(run)} yet (the trainer writes explorer/ after each step unless train.explorer.keepSteps is 0)` };
    const meta = this.meta(dir);
    const dec = decoderOf(meta);
    const files = this.files(dir).slice(-maxSteps);
    const rows: ExplorerRow[] = [];
    let error: string | null = null;
    for (const f of files) {
      let entry;
      try {
        entry = this.stepFile(dir, f.file);
      } catch {
        continue; // pruned while listed
      }
      const cached = this.cache.get(join(dir, f.file))!;
      cached.rows ??= entry.recs.map((d) => rowOf(d, dec));
      rows.push(...cached.rows);
      error ??= entry.bad;
    }
    return { dir, tokenizer: dec.name, steps: files.map((f) => f.step), rows, error };
  }

  /** One episode (every segment of it) of step `step`, found by one of its sample indices, with its group. */
  episode(run: string, step: number, index: number): ExplorerEpisode {
    const dir = this.dirOf(run);
    if (!existsSync(dir)) throw new OozeError("BAD_REQUEST", `no explorer files in ${resolve(run)}`);
    const file = this.files(dir).find((f) => f.step === step);
    if (!file) throw new OozeError("BAD_REQUEST", `step ${step} is not in ${dir} (kept: the newest train.explorer.keepSteps steps)`);
    const dec = decoderOf(this.meta(dir));
    const { recs } = this.stepFile(dir, file.file);
    const me = recs.find((d) => d.rec.index === index);
    if (!me) throw new OozeError("BAD_REQUEST", `step ${step} has no sample ${index}`);
    const segments = recs
      .filter((d) => d.rec.rolloutId === me.rec.rolloutId && d.rec.group === me.rec.group)
      .map((d): ExplorerSegment => ({
        ...rowOf(d, dec),
        ids: Array.from(d.ids),
        pieces: Array.from(d.ids, (id) => dec.piece(id)),
        lossMask: Array.from(d.mask),
        logprobs: Array.from(d.logprobs),
        spans: d.rec.versions,
        metadata: d.rec.metadata,
        promptValue: d.rec.prompt,
      }))
      .sort((a, b) => a.segment - b.segment || a.index - b.index);
    const group = recs.filter((d) => d.rec.group === me.rec.group).map((d) => rowOf(d, dec)).sort((a, b) => a.index - b.index);
    return { step, episode: me.rec.rolloutId, segments, group };
  }
}
