// Properties of the fleet's bookkeeping: PartialRollout assembles any sequence of dispatches from
// cumulative chunks into exactly the tokens each dispatch delivered, in order, with weight-version
// spans that cover the output and give each token the version of the chunk that first carried it;
// weight versions order numerically; model signatures differ exactly where the servers disagree.
// Cases: OOZE_PROPERTY_RUNS (default 100; these are pure and fast).
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { compareVersions, modelSignature, signatureDiff } from "../../src/engine/fleet/model.ts";
import { PartialRollout } from "../../src/engine/fleet/partial.ts";

const RUNS = Number(process.env.OOZE_PROPERTY_RUNS ?? 100);

/** One dispatch: the tokens it delivered and the chunk boundaries (cumulative lengths) with versions. */
const dispatchArb = fc
  .record({
    tokens: fc.array(fc.integer({ min: 0, max: 300 }), { maxLength: 12 }),
    cuts: fc.array(fc.integer({ min: 0, max: 12 }), { maxLength: 5 }),
    versions: fc.array(fc.constantFrom("1", "2", "3"), { minLength: 6, maxLength: 6 }),
  })
  .map(({ tokens, cuts, versions }) => {
    const ends = [...new Set([...cuts.map((c) => Math.min(c, tokens.length)), tokens.length])].sort((a, b) => a - b);
    return { tokens, chunks: ends.map((end, i) => ({ end, version: versions[i % versions.length]! })) };
  });

describe("PartialRollout", () => {
  it("keeps every delivered token once, in order, with covering version spans", () => {
    fc.assert(
      fc.property(fc.array(dispatchArb, { maxLength: 6 }), (dispatches) => {
        const acc = new PartialRollout();
        const want: number[] = [];
        const wantVersion: string[] = [];
        for (const d of dispatches) {
          acc.beginAttempt();
          let seen = 0;
          d.chunks.forEach((c, i) => {
            const ids = d.tokens.slice(0, c.end);
            acc.update(ids, ids.map((t) => -t / 100), c.version, i === d.chunks.length - 1);
            for (let k = seen; k < c.end; k++) {
              want.push(d.tokens[k]!);
              wantVersion.push(c.version);
            }
            seen = Math.max(seen, c.end);
          });
        }
        expect(Array.from(acc.outputIds())).toEqual(want);
        expect(Array.from(acc.logprobs())).toEqual(want.map((t) => Math.fround(-t / 100)));
        expect(acc.length).toBe(want.length);
        const spans = acc.weightVersions();
        const got: string[] = [];
        let at = 0;
        for (const [i, s] of spans.entries()) {
          expect(s.start).toBe(at);
          expect(s.end).toBeGreaterThan(s.start);
          if (i > 0) expect(s.version).not.toBe(spans[i - 1]!.version);
          for (let k = s.start; k < s.end; k++) got.push(s.version);
          at = s.end;
        }
        expect(at).toBe(want.length);
        expect(got).toEqual(wantVersion);
        expect(Array.from(acc.continuation([256, 1]))).toEqual([256, 1, ...want]);
      }),
      { numRuns: RUNS },
    );
  });

  it("a shorter final chunk (a trimmed stop token) truncates the dispatch's tail and its span", () => {
    const acc = new PartialRollout();
    acc.beginAttempt();
    acc.update([5, 6], [-1, -2], "1");
    acc.beginAttempt();
    acc.update([7, 8, 2], [-3, -4, -5], "2");
    acc.update([7, 8], [-3, -4], "2", true);
    expect(Array.from(acc.outputIds())).toEqual([5, 6, 7, 8]);
    expect(acc.weightVersions()).toEqual([
      { start: 0, end: 2, version: "1" },
      { start: 2, end: 4, version: "2" },
    ]);
  });
});

describe("weight versions and model signatures", () => {
  it("versions order by their numbers, not their characters", () => {
    fc.assert(
      fc.property(fc.nat(100_000), fc.nat(100_000), fc.constantFrom("", "v", "step-"), (a, b, p) => {
        expect(Math.sign(compareVersions(`${p}${a}`, `${p}${b}`))).toBe(Math.sign(a - b));
      }),
      { numRuns: RUNS },
    );
  });

  it("signatures differ exactly in the fields both servers report differently", () => {
    const a = modelSignature({ architectures: ["LlamaForCausalLM"], model_type: "llama" }, { context_length: 512 });
    expect(signatureDiff(a, a)).toEqual([]);
    const b = modelSignature({ architectures: ["LlamaForCausalLM"], model_type: "llama", config: { vocab_size: 259 } }, { context_length: 256 });
    expect(signatureDiff(b, a)).toEqual(["context_length: 256 (this engine) vs 512 (expected)"]);
    const c = modelSignature({ architectures: ["Qwen2ForCausalLM"] }, { max_position_embeddings: 512 });
    expect(signatureDiff(c, a)).toEqual(['architectures: ["Qwen2ForCausalLM"] (this engine) vs ["LlamaForCausalLM"] (expected)']);
  });
});
