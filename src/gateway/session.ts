// One episode's session: token-in/token-out under a chat API. Each request's messages are rendered
// with the chat template exactly as a server deploying the model would render them (earlier replies
// as the agent sent them back, reasoning included or not). A request whose rendering starts with a
// trajectory segment's text — its prompt and what the engine sampled, as text — extends it: the
// segment's ids + the rest of the rendering encoded (loss mask 0) go to the engine, and the engine's
// own sampled ids are appended (loss mask 1), never re-encoded. One whose rendering does not (the
// template dropped a reply's reasoning or re-wrote a tool call, the agent compacted or edited its
// history, a sub-agent started) splits: a new segment of the same episode opens, its prompt the
// whole rendering encoded.
import { SampleBuilder, type Sample, type SampleStatus } from "../sample.ts";
import type { FleetGenerateRequest, FleetGenerateResult } from "../engine/fleet/types.ts";
import { limitsOfContext, sendableMaxNewTokens } from "../engine/limits.ts";
import type { WireSamplingParams } from "../engine/protocol.ts";
import { GatewayError } from "./errors.ts";
import type { ChatMessage, ChatRequest } from "./messages.ts";
import { parseReply } from "./reply-format.ts";
import type { ChatTemplate } from "./template.ts";
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
  /**
   * The policy a request's model names (several policies per job): its name (recorded on the
   * samples) and its LoRA adapter on the engines (null: the base); null when the job has one policy.
   */
  policyOf?: (model: string | null) => { name: string; lora: string | null } | null;
}

interface Segment {
  builder: SampleBuilder;
  /** The policy whose turns these are (several policies), else undefined: a segment never mixes policies. */
  policy: string | undefined;
  /**
   * What the segment's ids stand for, as text: the renderings encoded into it, and each sampled turn
   * as it decodes (special tokens written out, so a turn's own end-of-turn token is in it). Always
   * ends with a sampled turn.
   */
  text: string;
  busy: boolean;
  status: SampleStatus;
  turns: number;
  transcript: ChatMessage[];
}

/** One sampled choice, ready for the API layer. */
export interface TurnChoice {
  ids: Int32Array;
  logprobs: Float32Array;
  /** The reply's reasoning (its `<think>` block's text, for a model that reasons), or null. */
  reasoning: string | null;
  /** Response text (the prefill and what was sampled, special tokens skipped, cut at the first stop string; reasoning and parsed calls removed). */
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

/** How a request goes to the engine: the segment it extends (or none) and the ids to send. */
interface Plan {
  segment: Segment | null;
  /** The template's rendering of the request. */
  rendered: string;
  /** The part of `rendered` past the segment's text (all of it without a segment), and its ids. */
  tail: string;
  envIds: number[];
  /** The segment's ids + envIds: what `rendered` reads as. */
  inputIds: Int32Array;
  /** The policy the request's model names (several policies), else undefined. */
  policy: string | undefined;
}

/** A session's state: its segments, its limits. */
export class Session {
  private readonly segments: Segment[] = [];
  private readonly inFlight = new Set<AbortController>();
  private turns = 0;
  /** Generation attempts (rid and seed numbering): a turn the engines failed is not a turn, but its rid is not reused. */
  private attempts = 0;
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
    const policy = this.ctx.policyOf?.(req.model) ?? null;
    const plan = this.plan(req, policy?.name);
    const input = plan.inputIds;
    // What SGLang serves (src/engine/limits.ts): a reply of at most the context left less its reserve.
    const room = sendableMaxNewTokens(limitsOfContext(this.ctx.contextLength), input.length);
    if (room <= 0) {
      throw this.fatal(
        new GatewayError("context_length", `the conversation is ${input.length} tokens; the model's context length is ${this.ctx.contextLength} tokens, leaving no room for a reply; shorten the messages`, "messages"),
      );
    }
    let maxNew = Math.min(req.maxTokens ?? this.ctx.defaultMaxTokens, room);
    if (s.maxTokens !== undefined) maxNew = Math.min(maxNew, s.maxTokens - this.sampledTokens);
    this.turns++;
    const turnNo = this.attempts++;
    const sampling: WireSamplingParams = {
      max_new_tokens: maxNew,
      temperature: s.temperature ?? req.temperature ?? 1,
      stop_token_ids: [...this.ctx.tokenizer.stopIds],
    };
    if (req.topP !== null) sampling.top_p = req.topP;
    if (req.topK !== null) sampling.top_k = req.topK;
    const stop = [...req.stop, ...req.output.stop];
    if (stop.length > 0) sampling.stop = stop;
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
            ...(policy ? { lora: policy.lora } : {}),
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
      this.record(first ? plan : { ...plan, segment: null, tail: plan.rendered, envIds: Array.from(input) }, r, choice, req.messages);
      return choice;
    });
    const failed = settled.find((x): x is PromiseRejectedResult => x.status === "rejected");
    // No engine sampled anything (the fleet's re-dispatches to other engines spent): not the policy's
    // turn, so not charged to maxTurns — the agent's retry of the 503 gets its turn back.
    if (results.every((r) => r === null)) this.turns--;
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

  /**
   * Renders the request and finds the segment it extends: the longest one (not being extended by a
   * running request) whose text the rendering starts with and goes past. The comparison is of text,
   * so a sampled turn matches whenever the template writes it back exactly as it decodes, however
   * its text would re-encode; the ids sent are the segment's own followed by the rest encoded.
   */
  private plan(req: ChatRequest, policy: string | undefined): Plan {
    // The prefill (a forced call's opening) is prompt the gateway wrote at the start of the reply.
    const rendered = this.ctx.template.render(req.messages, req.tools, req.output.templateVars) + req.output.prefill;
    let best: Segment | null = null;
    for (const seg of this.segments) {
      if (seg.busy || seg.policy !== policy || (best && best.text.length >= seg.text.length)) continue;
      if (rendered.length > seg.text.length && rendered.startsWith(seg.text)) best = seg;
    }
    const tail = best ? rendered.slice(best.text.length) : rendered;
    const envIds = this.ctx.tokenizer.encode(tail);
    const prior = best?.builder.tokens ?? new Int32Array(0);
    const inputIds = new Int32Array(prior.length + envIds.length);
    inputIds.set(prior);
    inputIds.set(envIds, prior.length);
    return { segment: best, rendered, tail, envIds, inputIds, policy };
  }

  /** Decodes a result into the response shape (reasoning, text, tool calls, finish): the prefill and the sampled text, parsed as the reply plan says. */
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
    const parsed = parseReply(req.output.prefill + text, req.output.parse);
    const toolCalls = parsed.toolCalls.map((c) => ({ id: `call_${this.id.slice(0, 8)}_${++callIds}`, ...c }));
    const finish = r.status === "aborted" ? "abort" : toolCalls.length > 0 ? "tool_calls" : r.status === "truncated" && stopSequence === null ? "length" : "stop";
    return { ids: r.outputIds, logprobs: r.logprobs, reasoning: parsed.reasoning, content: parsed.content, toolCalls, finish, stopSequence };
  }

  /** Appends a generation to its segment (or opens one) — once, whatever the client does next. */
  private record(
    plan: Pick<Plan, "segment" | "tail" | "envIds" | "policy">,
    r: FleetGenerateResult,
    choice: TurnChoice,
    messages: ChatMessage[],
  ): void {
    // A generation aborted before its first token leaves no turn: the retried request plans afresh.
    if (r.outputIds.length === 0) return;
    this.sampledTokens += r.outputIds.length;
    let seg = plan.segment;
    if (!seg) {
      seg = {
        builder: new SampleBuilder(this.segments.length, this.settings.groupIndex, this.settings.episodeId, messages.map(transcriptEntry), plan.envIds, plan.policy),
        policy: plan.policy,
        text: "",
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
    seg.text += plan.tail + this.ctx.tokenizer.decode(r.outputIds, false);
    seg.turns++;
    seg.status = r.status;
    const answer: ChatMessage = { role: "assistant", content: choice.content, toolCalls: choice.toolCalls, toolCallId: null };
    if (choice.reasoning !== null) answer.reasoningContent = choice.reasoning;
    seg.transcript = [...messages, answer];
  }
}

function transcriptEntry(m: ChatMessage): Record<string, unknown> {
  const e: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.toolCalls.length > 0) e.tool_calls = m.toolCalls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }));
  if (m.toolCallId !== null) e.tool_call_id = m.toolCallId;
  if (m.reasoningContent !== undefined) e.reasoning_content = m.reasoningContent;
  return e;
}
