// ooze/testing's tokensAsSampled and what feeds it: engine outputs read off the /generate wire (JSON,
// batches, n > 1, SSE streams cumulative or incremental, a stream cut short), chains of outputs
// covering a trained sample's model tokens (partial rollout: an aborted generation resumed; a client
// that kept only what reached it), as a property over drawn multi-turn trajectories, and the
// invariant over a job directory with deliberate defects.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { EngineOutputIndex, engineOutputsOf, propertyRuns, tokensAsSampled, uncoveredAt, type EngineOutputRecord } from "../../src/testing/index.ts";

const dir = mkdtempSync(join(tmpdir(), "ooze-sampled-tokens-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const sse = (chunks: unknown[]) => `${chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("")}data: [DONE]\n\n`;

describe("engine outputs read off the wire", () => {
  it("a JSON reply, a batch, and n > 1", () => {
    expect(engineOutputsOf(JSON.stringify({ input_ids: [1, 2] }), JSON.stringify({ text: "x", output_ids: [7, 8], meta_info: {} }))).toEqual([{ input: [1, 2], output: [7, 8] }]);
    expect(engineOutputsOf(JSON.stringify({ input_ids: [[1], [2, 3]] }), JSON.stringify([{ output_ids: [4] }, { output_ids: [5, 6] }]))).toEqual([
      { input: [1], output: [4] },
      { input: [2, 3], output: [5, 6] },
    ]);
    expect(engineOutputsOf(JSON.stringify({ input_ids: [9], sampling_params: { n: 2 } }), JSON.stringify([{ output_ids: [1] }, { output_ids: [2] }]))).toEqual([
      { input: [9], output: [1] },
      { input: [9], output: [2] },
    ]);
  });

  it("requests by text, unreadable bodies and error replies give nothing", () => {
    expect(engineOutputsOf(JSON.stringify({ text: "hi" }), JSON.stringify({ output_ids: [1] }))).toEqual([]);
    expect(engineOutputsOf("{not json", JSON.stringify({ output_ids: [1] }))).toEqual([]);
    expect(engineOutputsOf(JSON.stringify({ input_ids: [1] }), '{"output_ids": [1, 2')).toEqual([]);
    expect(engineOutputsOf(JSON.stringify({ input_ids: [1] }), JSON.stringify({ error: { message: "bad" } }))).toEqual([]);
  });

  it("SSE: cumulative chunks, incremental chunks, and a stream cut mid-event", () => {
    const req = JSON.stringify({ input_ids: [1, 2], stream: true });
    const cumulative = sse([
      { output_ids: [5], meta_info: { completion_tokens: 1 } },
      { output_ids: [5, 6], meta_info: { completion_tokens: 2 } },
      { output_ids: [5, 6, 7], meta_info: { completion_tokens: 3, finish_reason: { type: "stop" } } },
    ]);
    expect(engineOutputsOf(req, cumulative, "text/event-stream")).toEqual([{ input: [1, 2], output: [5, 6, 7] }]);
    const incremental = sse([
      { output_ids: [5], meta_info: { completion_tokens: 1 } },
      { output_ids: [6, 7], meta_info: { completion_tokens: 3 } },
      { output_ids: [8], meta_info: { completion_tokens: 4 } },
    ]);
    expect(engineOutputsOf(req, incremental, "text/event-stream")).toEqual([{ input: [1, 2], output: [5, 6, 7, 8] }]);
    const cut = cumulative.slice(0, cumulative.indexOf("[5, 6, 7]".replaceAll(" ", "")) + 3);
    expect(engineOutputsOf(req, cut, "text/event-stream")).toEqual([{ input: [1, 2], output: [5, 6] }]);
  });
});

/** An index of records. */
const indexOf = (rs: EngineOutputRecord[]) => {
  const ix = new EngineOutputIndex();
  for (const r of rs) ix.add(r);
  return ix;
};

describe("chains of engine outputs", () => {
  const T = [1, 2, 3, 4, 5, 6, 9, 9, 7, 8];
  // prompt [1, 2]; model 3..6 (positions 2..6), generated as [3, 4] (aborted) then [5, 6] resumed; env [9, 9]; model [7, 8].
  const records = [
    { input: [1, 2], output: [3, 4] },
    { input: [1, 2, 3, 4], output: [5, 6, 0] }, // the client stopped before the trailing 0 (a stop string)
    { input: [1, 2, 3, 4, 5, 6, 9, 9], output: [7, 8] },
  ];

  it("a turn resumed after an abort, and a client that kept a prefix, are covered", () => {
    const ix = indexOf(records);
    expect(uncoveredAt(T, 2, 6, ix)).toBeNull();
    expect(uncoveredAt(T, 8, 10, ix)).toBeNull();
  });

  it("a token changed after sampling (decoded and encoded again) is found, with its position", () => {
    const ix = indexOf(records);
    const changed = [...T];
    changed[4] = 50;
    expect(uncoveredAt(changed, 2, 6, ix)).toBe(4);
  });

  it("the same tokens in another context are not as sampled: a changed environment token breaks the next turn", () => {
    const ix = indexOf(records);
    const env = [...T];
    env[6] = 0;
    expect(uncoveredAt(env, 8, 10, ix)).toBe(8);
    // environment tokens marked as the model's (loss mask 1) are not covered either
    expect(uncoveredAt(T, 6, 10, ix)).toBe(6);
  });

  it("property: drawn multi-turn trajectories with aborts, cut streams and decoys are covered; any model token replaced is found", () => {
    const tok = fc.integer({ min: 0, max: 3 }); // a small vocabulary: coincidences between outputs are common
    const turn = fc.record({ env: fc.array(tok, { maxLength: 3 }), model: fc.array(tok, { minLength: 1, maxLength: 6 }), cuts: fc.array(fc.nat(), { maxLength: 2 }), tail: fc.array(tok, { maxLength: 2 }), decoy: fc.array(tok, { minLength: 1, maxLength: 4 }) });
    fc.assert(
      fc.property(fc.array(tok, { minLength: 1, maxLength: 4 }), fc.array(turn, { minLength: 1, maxLength: 3 }), fc.nat(), (prompt, turns, pick) => {
        const tokens = [...prompt];
        const sampled: [number, number][] = [];
        const recs: EngineOutputRecord[] = [];
        turns.forEach((t, ti) => {
          if (ti > 0) tokens.push(...t.env);
          const s = tokens.length;
          // the model turn generated in pieces (aborted and resumed at the cuts)
          const cuts = [...new Set(t.cuts.map((c) => c % t.model.length))].filter((c) => c > 0).sort((a, b) => a - b);
          let from = 0;
          for (const c of [...cuts, t.model.length]) {
            const piece = t.model.slice(from, c);
            const last = c === t.model.length;
            recs.push({ input: [...tokens, ...t.model.slice(0, from)], output: last ? [...piece, ...t.tail] : piece });
            recs.push({ input: [...tokens, ...t.model.slice(0, from)], output: t.decoy }); // another sample of the same prompt
            from = c;
          }
          tokens.push(...t.model);
          sampled.push([s, tokens.length]);
        });
        const ix = indexOf(recs);
        for (const [s, e] of sampled) expect(uncoveredAt(tokens, s, e, ix)).toBeNull();
        const all = sampled.flatMap(([s, e]) => Array.from({ length: e - s }, (_, k) => s + k));
        const at = all[pick % all.length]!;
        const bad = [...tokens];
        bad[at] = 99; // never sampled
        const [s, e] = sampled.find(([a, b]) => a <= at && at < b)!;
        expect(uncoveredAt(bad, s, e, ix)).toBe(at);
      }),
      { numRuns: propertyRuns(200) },
    );
  });
});

describe("tokensAsSampled over a job directory", () => {
  const job = (name: string, files: { batches: unknown[]; samples: unknown[]; engine?: EngineOutputRecord[] }) => {
    const d = join(dir, name);
    mkdirSync(join(d, "engine-outputs"), { recursive: true });
    const jsonl = (xs: unknown[]) => xs.map((x) => `${JSON.stringify(x)}\n`).join("");
    writeFileSync(join(d, "batches.jsonl"), jsonl(files.batches));
    writeFileSync(join(d, "samples.jsonl"), jsonl(files.samples));
    if (files.engine) writeFileSync(join(d, "engine-outputs", "engine-0.jsonl"), jsonl(files.engine));
    return { dir: d, finished: true, durationMs: 1 };
  };
  const engine = [
    { input: [1, 2], output: [3, 4] },
    { input: [1, 2], output: [3, 5] },
  ];
  const samples = [
    { step: 1, index: 0, promptLength: 2, tokens: [1, 2, 3, 4], sampled: [[2, 4]] },
    { step: 1, index: 1, promptLength: 2, tokens: [1, 2, 3, 5], sampled: [[2, 4]] },
  ];

  it("holds on a sound run and says what it compared", async () => {
    const v = await tokensAsSampled().check(job("sound", { batches: [{ step: 1, trained: [0, 1], dropped: [] }], samples, engine }));
    expect(v).toEqual({ ok: true, detail: "2 trained samples, 4 model tokens against 2 engine outputs from 1 record(s)" });
  });

  it("breaks on a re-encoded token, a trained sample without a token record, and a run with no engine record", async () => {
    const reencoded = [samples[0], { ...samples[1], tokens: [1, 2, 3, 6] }];
    const a = await tokensAsSampled().check(job("reencoded", { batches: [{ step: 1, trained: [0, 1], dropped: [] }], samples: reencoded, engine }));
    expect(a.ok).toBe(false);
    expect(a.detail).toContain("step 1 sample 1: model tokens 2..4 not sampled by any engine from position 3 (token 6");
    const missing = await tokensAsSampled().check(job("missing", { batches: [{ step: 1, trained: [0, 1, 2], dropped: [] }], samples, engine }));
    expect(missing.ok).toBe(false);
    expect(missing.detail).toContain("step 1 sample 2: no token record in samples.jsonl (is train.recordTokens on?)");
    const none = await tokensAsSampled().check(job("no-engine", { batches: [{ step: 1, trained: [0, 1], dropped: [] }], samples }));
    expect(none).toMatchObject({ ok: false, detail: expect.stringContaining("no engine output recorded") });
  });
});
