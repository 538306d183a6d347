// The dashboard's inputs checked without a server: a topology's `dash:` section (true, or where to
// listen; a bad value names file, line and field) and metrics.jsonl lines (a record, or why not).
import { describe, expect, it } from "vitest";
import { parseMetricsLine } from "../../app/dash/run-feed.ts";
import { TopologyError } from "../../src/errors.ts";
import { parseTopology } from "../../src/topology/load.ts";

const base = "name: t\nactors: [{name: a, kind: x}]\n";

describe("dash: in a topology", () => {
  it("takes true or {port, host}", () => {
    expect(parseTopology(`${base}dash: true\n`, "t.yaml").dash).toBe(true);
    expect(parseTopology(`${base}dash: {port: 9000, host: 127.0.0.1}\n`, "t.yaml").dash).toEqual({ port: 9000, host: "127.0.0.1" });
    expect(parseTopology(base, "t.yaml").dash).toBeUndefined();
  });

  it("names the file, line and field of a bad port or an unknown field", () => {
    expect(() => parseTopology(`${base}dash: {port: 70000}\n`, "t.yaml")).toThrow(TopologyError);
    expect(() => parseTopology(`${base}dash: {port: 70000}\n`, "t.yaml")).toThrow(/t\.yaml:3:\d+ dash/);
    expect(() => parseTopology(`${base}dash: {colour: red}\n`, "t.yaml")).toThrow(/t\.yaml:3:\d+ dash/);
  });
});

describe("metrics.jsonl lines", () => {
  it("keeps numbers and number arrays of a record with a numeric step", () => {
    expect(parseMetricsLine('{"step": 3, "reward_mean": 0.5, "staleness_hist": [1, 2], "note": "x"}')).toEqual({ step: 3, reward_mean: 0.5, staleness_hist: [1, 2] });
  });

  it("says why a line is not a record", () => {
    expect(parseMetricsLine("{oops")).toMatch(/^not JSON \(/);
    expect(parseMetricsLine("[1, 2]")).toBe("not a JSON object");
    expect(parseMetricsLine('{"reward_mean": 1}')).toBe("field 'step' is missing or not a number");
    expect(parseMetricsLine('{"step": "3"}')).toBe("field 'step' is missing or not a number");
  });
});
