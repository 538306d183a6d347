// The engine server's scheduling loop over an InferenceBackend: one loop calls backend.step() while
// anything runs (continuous batching: concurrent requests share steps), dispatches TokenEvents to
// request records, checks stop strings, and implements abort, pause (abort | retract | in_place),
// continue, and the drain-and-hold that a weight update needs.
import { OozeError } from "../errors.ts";
import type { BackendSampling, FinishReason, InferenceBackend, TokenEvent } from "./backend.ts";
import { decodeBytes } from "./tokenizer.ts";

/** Pause modes of /pause_generation. */
export type PauseMode = "abort" | "retract" | "in_place";

/** One request as the scheduler tracks it. */
export interface SchedRequest {
  rid: string;
  /** The prompt as received. */
  promptIds: Int32Array;
  sampling: BackendSampling;
  stop: readonly string[];
  /** The LoRA adapter it runs under (null: the base). A retracted request resumes under the adapter loaded by that name then. */
  lora: string | null;
  /** Health checks and other internal requests are left out of loads. */
  internal: boolean;
  outIds: number[];
  logprobs: number[];
  cachedTokens: number;
  finish: FinishReason | null;
  /** Set when the request failed inside the engine (the response is an error, not a finish reason). */
  error: string | null;
  /** Tokens generated before the request was last re-admitted after a retraction (0 if never retracted). */
  resumedAt: number;
  /** Character index (in the decoded output) where a matched stop string begins. */
  stopAt: number | null;
  /** queued: not yet in the backend (paused / held); running: in the backend; retracted: out of the backend until continue. */
  state: "queued" | "running" | "retracted" | "done";
  /** Called after each new token and once when done. */
  onUpdate: (r: SchedRequest) => void;
}

/** Makes a request record for `submit`. */
export function newSchedRequest(
  rid: string,
  promptIds: Int32Array,
  sampling: BackendSampling,
  stop: readonly string[],
  onUpdate: (r: SchedRequest) => void,
  internal = false,
  lora: string | null = null,
): SchedRequest {
  return { rid, promptIds, sampling, stop, lora, internal, outIds: [], logprobs: [], cachedTokens: 0, finish: null, error: null, resumedAt: 0, stopAt: null, state: "queued", onUpdate };
}

/** The scheduling loop of one engine server. */
export class Scheduler {
  private readonly reqs = new Map<string, SchedRequest>();
  private paused: PauseMode | null = null;
  /** New requests wait (a weight update is pending). */
  private held = false;
  /** No steps run (weights are being replaced). */
  private frozen = false;
  private looping = false;
  private idleWaiters: (() => void)[] = [];
  private drainWaiters: (() => void)[] = [];

  constructor(private readonly backend: InferenceBackend) {}

  /** The current pause mode, or null. */
  get pauseMode(): PauseMode | null {
    return this.paused;
  }

  /** Whether a request id is in use. */
  has(rid: string): boolean {
    return this.reqs.has(rid);
  }

  /** Requests in the backend, and requests waiting (queued, retracted, or beyond the backend's batch). */
  counts(maxRunning: number): { running: number; waiting: number } {
    let inBackend = 0;
    let waiting = 0;
    for (const r of this.reqs.values()) {
      if (r.internal) continue;
      if (r.state === "running") inBackend++;
      else if (r.state === "queued" || r.state === "retracted") waiting++;
    }
    const running = Math.min(inBackend, maxRunning);
    return { running, waiting: waiting + inBackend - running };
  }

  /** Whether any request runs or waits. */
  busy(): boolean {
    return this.reqs.size > 0 || this.backend.running() > 0;
  }

  /**
   * Admits requests (all or none): into the backend at once, or queued while paused or held.
   * Throws the backend's error (BAD_REQUEST for a prompt longer than the context).
   */
  submit(batch: SchedRequest[]): void {
    for (const r of batch) {
      if (this.reqs.has(r.rid)) throw new OozeError("BAD_REQUEST", `rid '${r.rid}' is already in use`);
    }
    const added: SchedRequest[] = [];
    try {
      for (const r of batch) {
        if (!this.admissionHalted()) {
          this.admit(r, r.promptIds, r.sampling);
          added.push(r);
        }
      }
    } catch (e) {
      for (const r of added) this.backend.abort(r.rid);
      throw e;
    }
    for (const r of batch) this.reqs.set(r.rid, r);
    this.kick();
  }

  /** Aborts one request (finish_reason abort); false if unknown. */
  abort(rid: string, message = "Aborted by /abort_request"): boolean {
    const r = this.reqs.get(rid);
    if (!r) return false;
    if (r.state === "running") this.backend.abort(rid);
    this.finish(r, { type: "abort", message });
    return true;
  }

  /** Aborts every request (internal ones too). */
  abortAll(message = "Aborted by /abort_request (abort_all)"): number {
    const rids = [...this.reqs.keys()];
    for (const rid of rids) this.abort(rid, message);
    return rids.length;
  }

  /** Pauses: abort (in-flight finish as aborted), retract (out of the backend, resumed on continue), in_place (kept). */
  async pause(mode: PauseMode): Promise<void> {
    this.paused = mode;
    await this.waitIdle();
    if (this.paused !== mode) return; // continued (or re-paused) meanwhile
    if (mode === "abort") this.abortAll("Aborted by /pause_generation (mode abort)");
    if (mode === "retract") {
      for (const r of this.reqs.values()) {
        if (r.state !== "running") continue;
        this.backend.abort(r.rid);
        r.state = "retracted";
      }
    }
  }

  /** Ends a pause: retracted and queued requests go (back) into the backend. */
  resume(): void {
    this.paused = null;
    if (!this.held) this.readmit();
    this.kick();
  }

  /**
   * Holds new requests and, unless paused, lets running ones finish; resolves when no step runs
   * and (unless paused) nothing is in the backend. Returns the number of requests kept paused.
   */
  async holdAndDrain(): Promise<number> {
    this.held = true;
    if (this.paused === null) {
      this.kick();
      while ([...this.reqs.values()].some((r) => r.state === "running")) {
        await new Promise<void>((resolve) => this.drainWaiters.push(resolve));
      }
    }
    this.frozen = true;
    await this.waitIdle();
    return [...this.reqs.values()].filter((r) => r.state !== "done").length;
  }

  /** Ends a hold. */
  release(): void {
    this.held = false;
    this.frozen = false;
    if (this.paused === null) this.readmit();
    this.kick();
  }

  /** Resolves when no step is in flight. */
  waitIdle(): Promise<void> {
    if (!this.looping) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private admissionHalted(): boolean {
    return this.paused !== null || this.held;
  }

  private halted(): boolean {
    return this.paused !== null || this.frozen;
  }

  private admit(r: SchedRequest, ids: Int32Array, sampling: BackendSampling): void {
    const adm = this.backend.add(r.rid, ids, sampling, r.lora);
    if (r.state === "queued") r.cachedTokens = adm.cachedTokens;
    r.state = "running";
  }

  private readmit(): void {
    for (const r of [...this.reqs.values()]) {
      if (r.state !== "queued" && r.state !== "retracted") continue;
      try {
        if (r.state === "queued") this.admit(r, r.promptIds, r.sampling);
        else {
          // Resume a retracted request from prompt + tokens so far, with the remaining budget.
          const done = r.outIds.length;
          r.resumedAt = done;
          const ids = new Int32Array(r.promptIds.length + done);
          ids.set(r.promptIds);
          ids.set(r.outIds, r.promptIds.length);
          this.admit(r, ids, {
            ...r.sampling,
            maxNewTokens: r.sampling.maxNewTokens === null ? null : Math.max(1, r.sampling.maxNewTokens - done),
            minNewTokens: Math.max(0, r.sampling.minNewTokens - done),
          });
        }
      } catch (e) {
        this.fail(r, e instanceof Error ? e.message : String(e));
      }
    }
  }

  private kick(): void {
    if (!this.looping) void this.loop();
  }

  private async loop(): Promise<void> {
    this.looping = true;
    try {
      while (!this.halted() && this.backend.running() > 0) {
        let events: TokenEvent[];
        try {
          events = await this.backend.step();
        } catch (e) {
          const msg = `the engine failed during a step: ${e instanceof Error ? e.message : String(e)}`;
          for (const r of [...this.reqs.values()]) {
            if (r.state !== "running") continue;
            this.backend.abort(r.rid);
            this.fail(r, msg);
          }
          continue;
        }
        for (const ev of events) this.dispatch(ev);
      }
    } finally {
      this.looping = false;
      const w = this.idleWaiters;
      this.idleWaiters = [];
      for (const f of w) f();
      this.notifyDrain();
    }
  }

  private dispatch(ev: TokenEvent): void {
    const r = this.reqs.get(ev.rid);
    if (!r || r.state !== "running") return;
    r.outIds.push(ev.tokenId);
    r.logprobs.push(ev.logprob);
    if (ev.finished) {
      let f = ev.finished;
      // After a retraction the backend counts only the tokens since re-admission.
      if (f.type === "length" && r.resumedAt > 0) f = { type: "length", length: f.length + r.resumedAt };
      this.finish(r, f);
      return;
    }
    if (r.stop.length > 0 && r.outIds.length >= r.sampling.minNewTokens) {
      const text = decodeBytes(r.outIds, true);
      let best: { at: number; s: string } | null = null;
      for (const s of r.stop) {
        if (s === "") continue;
        const at = text.indexOf(s);
        if (at >= 0 && (best === null || at < best.at)) best = { at, s };
      }
      if (best) {
        this.backend.abort(r.rid);
        r.stopAt = best.at;
        this.finish(r, { type: "stop", matched: best.s });
        return;
      }
    }
    r.onUpdate(r);
  }

  private finish(r: SchedRequest, f: FinishReason): void {
    if (r.state === "done") return;
    r.state = "done";
    r.finish = f;
    this.reqs.delete(r.rid);
    r.onUpdate(r);
    this.notifyDrain();
  }

  private fail(r: SchedRequest, message: string): void {
    r.error = message;
    this.finish(r, { type: "abort", message });
  }

  private notifyDrain(): void {
    const w = this.drainWaiters;
    this.drainWaiters = [];
    for (const f of w) f();
  }
}
