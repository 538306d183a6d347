// Loads a topology YAML file and validates it. Every error names the file, the line and column, and
// the field path, e.g. "topologies/echo.yaml:12:11 actors[1].count: expected a number ≥ 1".
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { isNode, LineCounter, parseDocument } from "yaml";
import type { z } from "zod";
import { TopologyError } from "../errors.ts";
import { topologySchema, type Topology } from "./schema.ts";

/** Loads and validates a topology file. Throws TopologyError listing every problem found. */
export function loadTopology(file: string): Topology {
  const path = resolve(file);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new TopologyError(`${file}: cannot read topology file (${(e as Error).message})`, { cause: e });
  }
  return parseTopology(text, file, path);
}

/** Validates topology YAML text; `file` is used in messages. */
export function parseTopology(text: string, file = "<topology>", absPath: string | null = null): Topology {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false });
  const where = (offset: number | undefined) => {
    if (offset === undefined) return file;
    const { line, col } = lineCounter.linePos(offset);
    return `${file}:${line}:${col}`;
  };
  if (doc.errors.length > 0) {
    const msgs = doc.errors.map((e) => `${where(e.pos[0])} ${e.message.split("\n")[0]}`);
    throw new TopologyError(`invalid YAML:\n  ${msgs.join("\n  ")}`);
  }
  const raw: unknown = doc.toJS();
  const parsed = topologySchema.safeParse(raw ?? {});
  if (!parsed.success) {
    const msgs = parsed.error.issues.map((issue) => formatIssue(issue, doc, where));
    throw new TopologyError(`invalid topology:\n  ${msgs.join("\n  ")}\nSee topologies/echo.yaml for an example.`);
  }
  const topo: Topology = { ...parsed.data, file: absPath };
  checkReferences(topo, doc, where);
  return topo;
}

function formatIssue(issue: z.core.$ZodIssue, doc: ReturnType<typeof parseDocument>, where: (o?: number) => string) {
  const path = issue.path.filter((p): p is string | number => typeof p !== "symbol");
  // Point at the deepest node that exists in the document.
  let offset: number | undefined;
  for (let n = path.length; n >= 0 && offset === undefined; n--) {
    const node = n === 0 ? doc.contents : doc.getIn(path.slice(0, n), true);
    if (isNode(node) && node.range) offset = node.range[0];
  }
  let msg = issue.message;
  if (issue.code === "unrecognized_keys") msg = `unknown field(s) ${issue.keys.map((k) => `'${k}'`).join(", ")}`;
  return `${where(offset)} ${fieldPath(path) || "(top level)"}: ${msg}`;
}

/** `actors[1].config.x` from ["actors", 1, "config", "x"]. */
export function fieldPath(path: readonly (string | number)[]): string {
  return path.map((p, i) => (typeof p === "number" ? `[${p}]` : i === 0 ? p : `.${p}`)).join("");
}

function checkReferences(topo: Topology, doc: ReturnType<typeof parseDocument>, where: (o?: number) => string) {
  const problems: string[] = [];
  const at = (path: (string | number)[]) => {
    const node = doc.getIn(path, true);
    return where(isNode(node) && node.range ? node.range[0] : undefined);
  };
  const hosts = new Set<string>();
  topo.hosts.forEach((h, i) => {
    if (hosts.has(h.name)) problems.push(`${at(["hosts", i, "name"])} hosts[${i}].name: duplicate host '${h.name}'`);
    hosts.add(h.name);
  });
  const names = new Set<string>();
  topo.actors.forEach((a, i) => {
    if (names.has(a.name)) problems.push(`${at(["actors", i, "name"])} actors[${i}].name: duplicate actor '${a.name}'`);
    names.add(a.name);
    if (a.placement !== undefined && !hosts.has(a.placement))
      problems.push(
        `${at(["actors", i, "placement"])} actors[${i}].placement: no host named '${a.placement}' (hosts: ${[...hosts].join(", ")})`,
      );
  });
  if (problems.length) throw new TopologyError(`invalid topology:\n  ${problems.join("\n  ")}`);
}

/** The host an actor runs on: its placement, or the first host. */
export function hostOf(topo: Topology, actor: { placement?: string | undefined }): string {
  return actor.placement ?? topo.hosts[0]!.name;
}

/** The sections `withSettings` may change: they are validated when the job reads them. */
const SETTABLE = ["train", "engines"] as const;

/**
 * The topology with `SECTION.PATH=VALUE` settings applied (`ooze train --set`), VALUE read as YAML
 * (`train.lr=0.001`, `train.policies.describer={full: true}`); objects on the path are created.
 * The sections are checked later, as the file's are, so a bad value is reported by its field.
 */
export function withSettings(topo: Topology, settings: readonly string[]): Topology {
  const out = structuredClone({ train: topo.train, engines: topo.engines }) as Record<string, unknown>;
  for (const s of settings) {
    const eq = s.indexOf("=");
    const path = (eq < 0 ? s : s.slice(0, eq)).split(".");
    if (eq < 0 || path.length < 2 || path.some((p) => p === "") || !(SETTABLE as readonly string[]).includes(path[0]!))
      throw new TopologyError(`--set ${s}: give SECTION.FIELD=VALUE with SECTION one of ${SETTABLE.join(", ")} (e.g. train.lr=0.001)`);
    const doc = parseDocument(s.slice(eq + 1));
    if (doc.errors.length > 0) throw new TopologyError(`--set ${s}: the value is not YAML (${doc.errors[0]!.message.split("\n")[0]})`);
    const value: unknown = doc.toJS();
    let node = out;
    for (const [i, key] of path.entries()) {
      if (i === path.length - 1) {
        node[key] = value;
        break;
      }
      const next = node[key];
      if (next === undefined || next === null) node[key] = {};
      else if (typeof next !== "object" || Array.isArray(next)) throw new TopologyError(`--set ${s}: ${path.slice(0, i + 1).join(".")} is not a mapping`);
      node = node[key] as Record<string, unknown>;
    }
  }
  return { ...topo, train: out.train as Topology["train"], engines: out.engines as Topology["engines"] };
}
