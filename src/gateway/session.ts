// One episode's session: token-in/token-out under a chat API. Each request's messages are rendered
// into pieces (template text, and slots for assistant turns the engine sampled, found by their
// text); a request whose pieces extend a trajectory segment sends that segment's ids + the new
// template/user/tool tokens (loss mask 0) and appends the engine's own sampled ids (loss mask 1);
// one that does not (the agent dropped, summarised or compacted turns, or a sub-agent started)
// opens a new segment of the same episode. Sampled ids are never re-encoded.
import { SampleBuilder, type Sample, type SampleStatus } from "../sample.ts";
import type { FleetGenerateRequest, FleetGenerateResult } from "../engine/fleet/types.ts";
import type { WireSamplingParams } from "../engine/protocol.ts";
import { GatewayError } from "./errors.ts";
import { assistantKey, type ChatMessage, type ChatRequest } from "./messages.ts";
import { parseToolCalls, type ChatTemplate, type RenderedPiece } from "./template.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

/** What the gateway needs of a fleet: `Fleet.generate` (and `endSession` when it has one). */
export interface Generator {
  generate(req: FleetGenerateRequest): Promise<FleetGenerateResult>;
  endSession?(sessionId: string): void;
}

/** Settings of a session, from `Gateway.openSession`. */
export interface SessionSettings {
  episodeId: string;
  groupIndex: number;
  /** Chat requests allowed (default: no limit). */
  maxTurns?: number;
  /** Tokens the model may sample over the episode (default: no limit). */
  maxTokens?: number;
  /** Overrides the agent's temperature (RL samples at a known temperature). */
  temperature?: number;
  /** Seed of turn k is samplingSeed + k. */
  samplingSeed?: number;
}

/** What a session shares with its gateway. */
export interface SessionContext {
  generator: Generator;
  tokenizer: ChatTokenizer;
  template: ChatTemplate;
  contextLength: number;
  defaultMaxTokens: number;
}

/** A turn the engine sampled: its exact ids and how the agent will echo it (its key). */
interface SampledTurn {
  ids: Int32Array;
  key: string;
  /** Ended by a stop id: the template's rendering of that id after the turn is already in `ids`. */
  stopEnded: boolean;
}

type Piece = { text: string } | { turn: SampledTurn };

interface Segment {
  builder: SampleBuilder;
  /** The rendering so far: text, turn, text, turn … (always ends with a turn). */
  pieces: Piece[];
  busy: boolean;
  status: SampleStatus;
  turns: number;
  transcript: ChatMessage[];
}

/** One sampled choice, ready for the API layer. */
export interface TurnChoice {
  ids: Int32Array;
  logprobs: Float32Array;
  /** Response text (special tokens skipped, cut at the first stop string); tool-call blocks removed when parsed. */
  content: string;
  toolCalls: { id: string; name: string; arguments: string }[];
  /** "stop" (EOS or a stop string), "length", "tool_calls", or "abort". */
  finish: "stop" | "length" | "tool_calls" | "abort";
  /** The stop string that ended it, if one did. */
  stopSequence: string | null;
}

/** The result of one chat request. */
export interface TurnResult {
  choices: TurnChoice[];
  /** Weight version that sampled the last tokens of the first choice (null when the engine reports none). */
  weightVersion: string | null;
  promptTokens: number;
  cachedTokens: number;
}

/** What `Gateway.closeSession` returns. */
export interface SessionReport {
  /** One per trajectory segment, index 0..n-1 within the episode. */
  samples: Sample[];
  /** Chat requests that reached the session (authenticated). */
  requests: number;
  /** What ended the episode early (a limit, an over-long context, no engine), or null. */
  error: string | null;
}

let callIds = 0;

/** A session's state: its segments, its sampled turns by key, its limits. */
export class Session {
  private readonly segments: Segment[] = [];
  private readonly turnsByKey = new Map<string, SampledTurn>();
  private readonly inFlight = new Set<AbortController>();
  private turns = 0;
  private sampledTokens = 0;
  requests = 0;
  error: string | null = null;
  closed = false;

  constructor(
    readonly id: string,
    readonly apiKey: string,
    readonly settings: SessionSettings,
    private readonly ctx: SessionContext,
  ) {}

  /** Requests generating now, and trajectory segments so far. */
  get stats(): { requests: number; inFlight: number; segments: number; sampledTokens: number } {
    return { requests: this.requests, inFlight: this.inFlight.size, segments: this.segments.length, sampledTokens: this.sampledTokens };
  }

  /**
   * Runs one chat request: plan (extend or split), generate, record, and shape the choices. With
   * `onTokens` the generations are streamed from the engines and it sees each choice's sampled ids
   * so far as they come; what is recorded is the same either way.
   */
  async turn(req: ChatRequest, signal: AbortSignal, onTokens?: (choice: number, ids: Int32Array, logprobs: Float32Array) => void): Promise<TurnResult> {
    const s = this.settings;
    if (s.maxTurns !== undefined && this.turns >= s.maxTurns) {
      throw this.fatal(new GatewayError("limit", `session ${this.id}: the episode's limit of ${s.maxTurns} model turns is spent; no more requests are served`));
    }
    if (s.maxTokens !== undefined && this.sampledTokens >= s.maxTokens) {
      throw this.fatal(new GatewayError("limit", `session ${this.id}: the episode's limit of ${s.maxTokens} sampled tokens is spent; no more requests are served`));
    }
    const plan = this.plan(req);
    const input = plan.inputIds;
    const room = this.ctx.contextLength - input.length;
    if (room <= 0) {
      throw this.fatal(
        new GatewayError("context_length", `the conversation is ${input.length} tokens; the model's context length is ${this.ctx.contextLength} tokens, leaving no room for a reply; shorten the messages`, "messages"),
      );
    }
    let maxNew = Math.min(req.maxTokens ?? this.ctx.defaultMaxTokens, room);
    if (s.maxTokens !== undefined) maxNew = Math.min(maxNew, s.maxTokens - this.sampledTokens);
    const turnNo = this.turns++;
    const sampling: WireSamplingParams = {
      max_new_tokens: maxNew,
      temperature: s.temperature ?? req.temperature ?? 1,
      stop_token_ids: [...this.ctx.tokenizer.stopIds],
    };
    if (req.topP !== null) sampling.top_p = req.topP;
    if (req.topK !== null) sampling.top_k = req.topK;
    if (req.stop.length > 0) sampling.stop = req.stop;
    const seed = s.samplingSeed !== undefined ? s.samplingSeed + turnNo : req.seed;
    const ctl = new AbortController();
    const onAbort = () => ctl.abort();
    if (signal.aborted) ctl.abort();
    signal.addEventListener("abort", onAbort, { once: true });
    this.inFlight.add(ctl);
    if (plan.segment) plan.segment.busy = true;
    let settled: PromiseSettledResult<FleetGenerateResult>[];
    try {
      settled = await Promise.allSettled(
        Array.from({ length: req.n }, (_, k) =>
          this.ctx.generator.generate({
            inputIds: input,
            sampling: seed === null ? sampling : { ...sampling, sampling_seed: seed + k },
            sessionId: this.id,
            rid: `${this.id}-t${turnNo}-c${k}`,
            signal: ctl.signal,
            ...(onTokens ? { stream: true, onTokens: (ids: Int32Array, lps: Float32Array) => onTokens(k, ids, lps) } : {}),
          }),
        ),
      );
    } finally {
      if (plan.segment) plan.segment.busy = false;
      signal.removeEventListener("abort", onAbort);
      this.inFlight.delete(ctl);
    }
    if (this.closed) throw new GatewayError("not_found", `session ${this.id} was closed while the request ran`);
    // Choices that were sampled are recorded even when a sibling failed: nothing sampled is lost.
    const results = settled.map((x) => (x.status === "fulfilled" ? x.value : null));
    const choices = results.map((r, k) => {
      if (r === null) return null;
      const choice = this.shape(r, req);
      const first = k === 0 || results.slice(0, k).every((x) => x === null);
      this.record(first ? plan : { ...plan, segment: null, tail: plan.all, envIds: Array.from(input) }, r, choice, req.messages);
      return choice;
    });
    const failed = settled.find((x): x is PromiseRejectedResult => x.status === "rejected");
    if (failed) {
      const e = failed.reason as Error;
      throw this.fatal(new GatewayError("engine", `no engine could serve the request: ${e.message}`, null, { cause: e }));
    }
    const ok = results as FleetGenerateResult[];
    const spans = ok[0]?.weightVersions ?? [];
    return {
      choices: choices as TurnChoice[],
      weightVersion: spans[spans.length - 1]?.version ?? null,
      promptTokens: input.length,
      cachedTokens: ok.reduce((a, r) => a + r.cachedTokens, 0),
    };
  }

  /** Ends the session: in-flight requests are aborted (their turns are not recorded); the segments become samples. */
  close(): SessionReport {
    this.closed = true;
    for (const c of this.inFlight) c.abort();
    const samples = this.segments.map((seg, i) => {
      const sample = seg.builder.build(null, seg.status, { segment: i, session: this.id, turns: seg.turns, transcript: seg.transcript.map(transcriptEntry) });
      return { ...sample, index: i };
    });
    return { samples, requests: this.requests, error: this.error };
  }

  private fatal(e: GatewayError): GatewayError {
    this.error = e.message;
    return e;
  }

  /** Finds the segment this request extends (or none) and the tokens to send. */
  private plan(req: ChatRequest): { segment: Segment | null; tail: Piece[]; all: Piece[]; envIds: number[]; inputIds: Int32Array } {
    const msgs = req.messages;
    const keys = msgs.map((m) => (m.role === "assistant" ? assistantKey(m.content, m.toolCalls) : null));
    const slots = new Set<number>();
    keys.forEach((k, i) => {
      if (k !== null && this.turnsByKey.has(k)) slots.add(i);
    });
    const rendered = this.ctx.template.renderPieces(msgs, req.tools, slots);
    const all: Piece[] = rendered.map((p) => ("text" in p ? p : { turn: this.turnsByKey.get(keys[p.message]!)! }));
    let best: Segment | null = null;
    for (const seg of this.segments) {
      if (seg.busy || (best && best.pieces.length >= seg.pieces.length)) continue;
      if (extends_(seg.pieces, rendered, keys)) best = seg;
    }
    if (best) {
      const tail = all.slice(best.pieces.length);
      const envIds = this.tokens(tail, best.pieces[best.pieces.length - 1]!);
      const prior = best.builder.tokens;
      const inputIds = new Int32Array(prior.length + envIds.length);
      inputIds.set(prior);
      inputIds.set(envIds, prior.length);
      return { segment: best, tail, all, envIds, inputIds };
    }
    const envIds = this.tokens(all, null);
    return { segment: null, tail: all, all, envIds, inputIds: Int32Array.from(envIds) };
  }

  /** Token ids of pieces: text encoded (minus the stop token a sampled turn already holds), turns as sampled. */
  private tokens(pieces: readonly Piece[], before: Piece | null): number[] {
    const out: number[] = [];
    let prev = before;
    for (const p of pieces) {
      if ("turn" in p) for (const id of p.turn.ids) out.push(id);
      else {
        let text = p.text;
        if (prev && "turn" in prev && prev.turn.stopEnded) {
          const last = prev.turn.ids[prev.turn.ids.length - 1]!;
          const shown = this.ctx.tokenizer.specialText.get(last);
          if (shown !== undefined && text.startsWith(shown)) text = text.slice(shown.length);
        }
        for (const id of this.ctx.tokenizer.encode(text)) out.push(id);
      }
      prev = p;
    }
    return out;
  }

  /** Decodes a result into the response shape (text, tool calls, finish). */
  private shape(r: FleetGenerateResult, req: ChatRequest): TurnChoice {
    let text = this.ctx.tokenizer.decode(r.outputIds, true);
    let stopSequence: string | null = null;
    let cut = -1;
    for (const s of req.stop) {
      const k = text.indexOf(s);
      if (k >= 0 && (cut < 0 || k < cut)) {
        cut = k;
        stopSequence = s;
      }
    }
    if (cut >= 0) text = text.slice(0, cut);
    const parsed = req.tools.length > 0 ? parseToolCalls(text) : { content: text, toolCalls: [] };
    const toolCalls = parsed.toolCalls.map((c) => ({ id: `call_${this.id.slice(0, 8)}_${++callIds}`, ...c }));
    const finish = r.status === "aborted" ? "abort" : toolCalls.length > 0 ? "tool_calls" : r.status === "truncated" && stopSequence === null ? "length" : "stop";
    return { ids: r.outputIds, logprobs: r.logprobs, content: parsed.content, toolCalls, finish, stopSequence };
  }

  /** Appends a generation to its segment (or opens one) — once, whatever the client does next. */
  private record(
    plan: { segment: Segment | null; tail: Piece[]; envIds: number[] },
    r: FleetGenerateResult,
    choice: TurnChoice,
    messages: ChatMessage[],
  ): void {
    // A generation aborted before its first token leaves no turn: the retried request plans afresh.
    if (r.outputIds.length === 0) return;
    this.sampledTokens += r.outputIds.length;
    const last = r.outputIds[r.outputIds.length - 1];
    const turn: SampledTurn = {
      ids: r.outputIds,
      key: assistantKey(choice.content, choice.toolCalls),
      stopEnded: r.finishReason.type === "stop" && last !== undefined && this.ctx.tokenizer.stopIds.includes(last),
    };
    let seg = plan.segment;
    if (!seg) {
      seg = {
        builder: new SampleBuilder(this.segments.length, this.settings.groupIndex, this.settings.episodeId, messages.map(transcriptEntry), plan.envIds),
        pieces: [],
        busy: false,
        status: "pending",
        turns: 0,
        transcript: [],
      };
      this.segments.push(seg);
    } else seg.builder.appendEnv(plan.envIds);
    let at = 0;
    for (const span of r.weightVersions) {
      if (span.start > at) seg.builder.appendModel(r.outputIds.subarray(at, span.start), r.logprobs.subarray(at, span.start), "unknown");
      seg.builder.appendModel(r.outputIds.subarray(span.start, span.end), r.logprobs.subarray(span.start, span.end), span.version);
      at = span.end;
    }
    if (at < r.outputIds.length) seg.builder.appendModel(r.outputIds.subarray(at), r.logprobs.subarray(at), "unknown");
    seg.pieces.push(...plan.tail, { turn });
    seg.turns++;
    seg.status = r.status;
    seg.transcript = [...messages, { role: "assistant", content: choice.content, toolCalls: choice.toolCalls, toolCallId: null }];
    this.turnsByKey.set(turn.key, turn);
  }
}

/** Whether a request's pieces extend a segment's: same text pieces, same sampled turns, and more after. */
function extends_(have: readonly Piece[], want: readonly RenderedPiece[], keys: readonly (string | null)[]): boolean {
  if (want.length <= have.length) return false;
  for (let i = 0; i < have.length; i++) {
    const h = have[i]!;
    const w = want[i]!;
    if ("text" in h) {
      if (!("text" in w) || w.text !== h.text) return false;
    } else if (!("message" in w) || keys[w.message] !== h.turn.key) return false;
  }
  return true;
}

function transcriptEntry(m: ChatMessage): Record<string, unknown> {
  const e: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.toolCalls.length > 0) e.tool_calls = m.toolCalls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }));
  if (m.toolCallId !== null) e.tool_call_id = m.toolCallId;
  return e;
}
