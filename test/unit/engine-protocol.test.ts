// The /generate wire contract: request normalization (defaults, null = default, batches, n > 1, rid
// rules, 400 messages) and response validation (fields named in EngineProtocolError).
import { describe, expect, it } from "vitest";
import { EngineProtocolError } from "../../src/errors.ts";
import { badRequestBody, finishStatus, parseGenerateRequest, parseGenerateResponse } from "../../src/engine/protocol.ts";

let n = 0;
const rid = () => `r${n++}`;

describe("parseGenerateRequest", () => {
  it("applies SGLang's defaults; null means the default, except max_new_tokens null = no cap", () => {
    const r = parseGenerateRequest({ input_ids: [1, 2], sampling_params: { temperature: null, top_k: null } }, rid);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const it0 = r.call.items[0]!;
    expect(it0.sampling).toEqual({ maxNewTokens: 128, temperature: 1, topP: 1, topK: -1, minNewTokens: 0, stopTokenIds: [], ignoreEos: false, seed: null });
    expect(it0).toMatchObject({ stop: [], skipSpecialTokens: true, noStopTrim: false, returnLogprob: false });
    expect(r.call).toMatchObject({ isBatch: false, stream: false });
    const u = parseGenerateRequest({ input_ids: [1], sampling_params: { max_new_tokens: null } }, rid);
    expect(u.ok && u.call.items[0]!.sampling.maxNewTokens).toBe(null);
  });

  it("expands batches and n > 1 in order with SGLang's rid rules", () => {
    const r = parseGenerateRequest({ input_ids: [[1], [2]], sampling_params: { n: 2, sampling_seed: 10 }, rid: "x" }, rid);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.call.items.map((i) => i.rid)).toEqual(["x_0", "x_1", "x_2", "x_3"]);
    expect(r.call.items.map((i) => i.inputIds![0])).toEqual([1, 1, 2, 2]);
    expect(r.call.items.map((i) => i.sampling.seed)).toEqual([10, 11, 10, 11]);
    const l = parseGenerateRequest({ text: ["a", "b"], rid: ["p", "q"] }, rid);
    expect(l.ok && l.call.items.map((i) => [i.rid, i.text])).toEqual([["p", "a"], ["q", "b"]]);
    const one = parseGenerateRequest({ input_ids: [1], rid: "solo", sampling_params: { n: 3 } }, rid);
    expect(one.ok && one.call.items.map((i) => i.rid)).toEqual(["solo_0", "solo_1", "solo_2"]);
    expect(one.ok && one.call.isBatch).toBe(true);
  });

  it("rejects out-of-range values with a message naming the field", () => {
    const cases: [unknown, string][] = [
      [{ input_ids: [1], sampling_params: { top_p: 1.5 } }, "top_p"],
      [{ input_ids: [1], sampling_params: { top_k: -2 } }, "top_k"],
      [{ input_ids: [1], sampling_params: { min_new_tokens: 3, max_new_tokens: 1 } }, "min_new_tokens"],
      [{ input_ids: [1, 300] }, "vocabulary"],
      [{ input_ids: [1], sampling_params: { stop_token_ids: [999] } }, "stop_token_ids"],
      [{ input_ids: [1], rid: ["a"] }, "rid"],
      [{ input_ids: [[1], [2]], rid: ["a", "a"] }, "distinct"],
      [{ input_ids: [1], return_logprob: true, logprob_start_len: 0 }, "logprob_start_len"],
      [{ text: "a", input_ids: [1] }, "Either"],
    ];
    for (const [body, word] of cases) {
      const r = parseGenerateRequest(body, rid, 259);
      expect(r.ok).toBe(false);
      if (!r.ok) expect(r.message).toContain(word);
    }
    expect(badRequestBody("m")).toEqual({ object: "error", message: "m", type: "Bad Request", param: null, code: 400 });
  });
});

describe("parseGenerateResponse", () => {
  const good = {
    text: "ab",
    output_ids: [97, 98],
    meta_info: {
      id: "r",
      prompt_tokens: 1,
      completion_tokens: 2,
      finish_reason: { type: "stop", matched: 257 },
      output_token_logprobs: [[-1, 97, null], [-2, 98, "b"]],
    },
  };

  it("reads ids from triple position 1 and logprobs from position 0; older servers lack cached_tokens", () => {
    const o = parseGenerateResponse("http://e", good, { wantLogprobs: true, final: true });
    expect(Array.from(o.outputIds)).toEqual([97, 98]);
    expect(Array.from(o.logprobs)).toEqual([-1, -2]);
    expect(o.meta.cachedTokens).toBe(0);
    expect(o.meta.weightVersion).toBe(null);
    expect(finishStatus(o.finishReason!)).toBe("completed");
    expect(finishStatus({ type: "length", length: 2 })).toBe("truncated");
    expect(finishStatus({ type: "abort", message: "" })).toBe("aborted");
  });

  it("names the broken field", () => {
    const bad = structuredClone(good) as any;
    bad.meta_info.output_token_logprobs[1][1] = "98";
    try {
      parseGenerateResponse("http://e/generate", bad, { wantLogprobs: true, final: true });
      throw new Error("no error");
    } catch (e) {
      expect(e).toBeInstanceOf(EngineProtocolError);
      expect((e as EngineProtocolError).field).toBe("meta_info.output_token_logprobs[1][1]");
      expect((e as EngineProtocolError).url).toBe("http://e/generate");
    }
  });

  it("names a broken element of the long lists", () => {
    const field = (mutate: (o: any) => void, wantLogprobs: boolean) => {
      const o = structuredClone(good) as any;
      mutate(o);
      try {
        parseGenerateResponse("http://e", o, { wantLogprobs, final: true });
        return null;
      } catch (e) {
        return (e as EngineProtocolError).field;
      }
    };
    expect(field((o) => (o.output_ids[1] = 2.5), false)).toBe("output_ids[1]");
    expect(field((o) => (o.output_ids = "97,98"), false)).toBe("output_ids");
    expect(field((o) => (o.meta_info.output_token_logprobs[0] = [-1, 97]), true)).toBe("meta_info.output_token_logprobs[0][2]");
    expect(field((o) => (o.meta_info.output_token_logprobs[1][2] = 5), true)).toBe("meta_info.output_token_logprobs[1][2]");
    // A triple with extra entries (newer servers) is accepted; the lists come back as sent.
    expect(field((o) => o.meta_info.output_token_logprobs[1].push({ top: [] }), true)).toBeNull();
    const long = structuredClone(good) as any;
    long.meta_info.output_token_logprobs = Array.from({ length: 500 }, (_, i) => [-i / 10, i, null]);
    const r = parseGenerateResponse("http://e", long, { wantLogprobs: true, final: true });
    expect(Array.from(r.outputIds)).toEqual(Array.from({ length: 500 }, (_, i) => i));
    expect(r.logprobs[499]).toBeCloseTo(-49.9, 4);
  });
});
