import { readdirSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { loadTopology, parseTopology, withSettings } from "../../src/topology/load.ts";
import { trainConfigOf } from "../../actors/protocol/config.ts";
import { TopologyError } from "../../src/errors.ts";

function errorOf(fn: () => unknown): TopologyError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(TopologyError);
    return e as TopologyError;
  }
  throw new Error("expected a TopologyError");
}

describe("topology loading", () => {
  it("loads the shipped echo topology with defaults filled in", () => {
    const t = loadTopology("topologies/echo.yaml");
    expect(t.name).toBe("echo");
    expect(t.hosts.map((h) => h.name)).toEqual(["a", "b"]);
    expect(t.actors[0]!.count).toBe(1);
    expect(t.nats.host).toBe("127.0.0.1");
    expect(t.supervision.strategy).toBe("one_for_one");
  });

  it("every shipped topology is valid", () => {
    const files = readdirSync("topologies").filter((f) => f.endsWith(".yaml"));
    expect(files.length).toBeGreaterThanOrEqual(4);
    for (const f of files) expect(loadTopology(`topologies/${f}`).name.length).toBeGreaterThan(0);
  });

  it("nats.url takes a cluster's servers comma-separated, nats.replicas 1 to 5; errors name the field", () => {
    const ok = parseTopology("name: t\nnats: { url: 'nats://a:4222,nats://b:4222,nats://c:4222', replicas: 3 }\nactors: [{ name: a, kind: x }]\n", "t.yaml");
    expect(ok.nats).toMatchObject({ url: "nats://a:4222,nats://b:4222,nats://c:4222", replicas: 3 });
    expect(errorOf(() => parseTopology("name: t\nnats: { url: 'nats://a:4222,not a url' }\nactors: [{ name: a, kind: x }]\n", "t.yaml")).message).toMatch(/t\.yaml:2:\d+ nats\.url: must be a URL, or several comma-separated/);
    expect(errorOf(() => parseTopology("name: t\nnats: { replicas: 7 }\nactors: [{ name: a, kind: x }]\n", "t.yaml")).message).toMatch(/nats\.replicas/);
  });

  it("names file, line, column and field for a wrong type", () => {
    const text = "name: t\nactors:\n  - name: a\n    kind: x\n    count: lots\n";
    const e = errorOf(() => parseTopology(text, "t.yaml"));
    expect(e.message).toMatch(/t\.yaml:5:12 actors\[0\]\.count: /);
  });

  it("reports unknown fields, bad placement and duplicates together", () => {
    const text = [
      "name: t",
      "hosts: [{name: h}]",
      "actors:",
      "  - {name: a, kind: x, placement: nowhere}",
      "  - {name: b, kind: x, colour: red}",
    ].join("\n");
    const e = errorOf(() => parseTopology(text, "t.yaml"));
    expect(e.message).toMatch(/t\.yaml:5:\d+ actors\[1\]: unknown field\(s\) 'colour'/);
    const e2 = errorOf(() => parseTopology(text.replace(", colour: red", ""), "t.yaml"));
    expect(e2.message).toMatch(/t\.yaml:4:\d+ actors\[0\]\.placement: no host named 'nowhere'/);
  });

  it("reports malformed YAML with its position", () => {
    const e = errorOf(() => parseTopology("name: t\nactors: [\n", "bad.yaml"));
    expect(e.message).toMatch(/bad\.yaml:\d+:\d+/);
  });

  it("reports a missing file clearly", () => {
    const e = errorOf(() => loadTopology("topologies/does-not-exist.yaml"));
    expect(e.message).toMatch(/does-not-exist\.yaml: cannot read topology file/);
  });

  it("applies --set settings to train: and engines: as YAML values, and refuses other sections and bad values by name", () => {
    const t = loadTopology("topologies/referential-game.yaml");
    const set = withSettings(t, ["train.lr=0.001", "train.policies.describer={full: true}", "engines.count=2", "train.taskConfig.messageTokens=2"]);
    const { train, engines } = trainConfigOf(set);
    expect(train.lr).toBe(0.001);
    expect(train.policies!.describer).toEqual({ full: true });
    expect(train.policies!.guesser).toEqual((trainConfigOf(t).train.policies!).guesser);
    expect(engines.count).toBe(2);
    expect(train.taskConfig).toEqual({ messageTokens: 2 });
    expect(trainConfigOf(t).train.lr).toBe(0.003); // the topology itself is unchanged
    expect(errorOf(() => withSettings(t, ["actors.x=1"])).message).toMatch(/--set actors\.x=1: give SECTION\.FIELD=VALUE with SECTION one of train, engines/);
    expect(errorOf(() => withSettings(t, ["train.lr"])).message).toMatch(/--set train\.lr: give SECTION\.FIELD=VALUE/);
    expect(errorOf(() => withSettings(t, ["train.lr.x=1"])).message).toMatch(/train\.lr is not a mapping/);
    expect(errorOf(() => withSettings(t, ["train.lr={a: "])).message).toMatch(/the value is not YAML/);
    expect(() => trainConfigOf(withSettings(t, ["train.lr=fast"]))).toThrow(/train: lr: .*expected number/);
  });
});
