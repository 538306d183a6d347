// The import-direction check of ooze's layers (shared/STYLE.md "Arrows point down"): reads every
// module of a tree with TypeScript's own pre-processor (static, dynamic and type-only imports,
// re-exports) and reports each arrow that points the wrong way, and each import cycle.
//   app/     → actors/, native/, src/     (composition roots: imported only by bin/, bench/, test/)
//   actors/  → native/, src/               (actors/protocol/ imports no role; role folders form no cycle)
//   native/  → src/
//   src/     → nothing above it            (the library "ooze")
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize } from "node:path";
import ts from "typescript";

/** The layers, lowest first: a module may import its own layer and the ones below it. */
export const LAYERS = ["src", "native", "actors", "app"] as const;
/** Folders whose modules use the layers and that no layer may import. */
export const CONSUMERS = ["bin", "bench", "test", "examples", "scripts"] as const;
/** Consumers allowed to import app/ (the composition roots). */
const APP_IMPORTERS = new Set(["app", "bin", "bench", "test"]);

/** One import between two modules of the tree, as paths relative to its root. */
export interface ImportEdge {
  from: string;
  to: string;
}

const SOURCE = /\.(ts|mts|mjs|js)$/;

function modules(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        if (!["node_modules", "build", "dist"].includes(e.name)) walk(p);
      } else if (SOURCE.test(e.name) && !e.name.endsWith(".d.ts")) out.push(p);
    }
  };
  for (const d of [...LAYERS, ...CONSUMERS]) if (existsSync(join(root, d))) walk(d);
  return out;
}

/** Every relative import (and self-import of the package by name, as `ooze:NAME`) of the tree's modules. */
export function importEdges(root: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const from of modules(root)) {
    const info = ts.preProcessFile(readFileSync(join(root, from), "utf8"), true, true);
    for (const f of info.importedFiles) {
      const spec = f.fileName;
      if (spec === "ooze" || spec.startsWith("ooze/")) edges.push({ from, to: `ooze:${spec}` });
      else if (spec.startsWith("./") || spec.startsWith("../")) edges.push({ from, to: normalize(join(dirname(from), spec)) });
    }
  }
  return edges;
}

const top = (p: string): string => p.split("/")[0]!;
const layerOf = (p: string): number => (LAYERS as readonly string[]).indexOf(top(p));
/** The role folder of a module under actors/ (`protocol`, `rollout`, …), else null. */
const actorFolder = (p: string): string | null => (top(p) === "actors" ? (p.split("/")[1] ?? null) : null);

/** Strongly connected components with more than one member (or a self-loop): the cycles of a graph. */
export function cycles(edges: readonly (readonly [string, string])[]): string[][] {
  const next = new Map<string, string[]>();
  for (const [a, b] of edges) {
    if (!next.has(a)) next.set(a, []);
    if (!next.has(b)) next.set(b, []);
    next.get(a)!.push(b);
  }
  let counter = 0;
  const index = new Map<string, number>(), low = new Map<string, number>(), stack: string[] = [], on = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, counter), low.set(v, counter), counter++;
    stack.push(v), on.add(v);
    for (const w of next.get(v)!) {
      if (!index.has(w)) visit(w), low.set(v, Math.min(low.get(v)!, low.get(w)!));
      else if (on.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const scc: string[] = [];
    let w: string;
    do (w = stack.pop()!), on.delete(w), scc.push(w);
    while (w !== v);
    if (scc.length > 1 || next.get(v)!.includes(v)) found.push(scc.sort());
  };
  for (const v of next.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** Every violation of the layering in the tree at `root`, one readable line each (empty: none). */
export function layerViolations(root: string): string[] {
  const edges = importEdges(root);
  const out: string[] = [];
  for (const { from, to } of edges) {
    const lf = layerOf(from);
    if (to.startsWith("ooze:")) {
      if (lf >= 0) out.push(`${from} imports '${to.slice(5)}' by package name: inside the package, import by relative path`);
      continue;
    }
    const lt = layerOf(to);
    if (lf >= 0 && lt > lf) out.push(`${from} → ${to}: ${LAYERS[lf]}/ must not import ${LAYERS[lt]}/ (arrows point down: app → actors → native → src)`);
    else if (lf >= 0 && lt < 0 && top(to) !== top(from)) out.push(`${from} → ${to}: ${LAYERS[lf]}/ must not import ${top(to)}/ (only the layers below it)`);
    else if (top(to) === "app" && !APP_IMPORTERS.has(top(from))) out.push(`${from} → ${to}: app/ (composition roots) is imported only by bin/, bench/ and test/`);
    const fa = actorFolder(from), ta = actorFolder(to);
    if (fa === "protocol" && ta !== null && ta !== "protocol") out.push(`${from} → ${to}: actors/protocol/ (the loop's contract) must not import a role (actors/${ta}/)`);
  }
  const inLayers = edges.filter((e) => layerOf(e.from) >= 0 && layerOf(e.to) >= 0).map((e) => [e.from, e.to] as const);
  for (const c of cycles(inLayers)) out.push(`import cycle between modules: ${c.join(" ↔ ")}`);
  const folders = edges
    .map((e) => [actorFolder(e.from), actorFolder(e.to)] as const)
    .filter((p): p is readonly [string, string] => p[0] !== null && p[1] !== null && p[0] !== p[1]);
  for (const c of cycles(folders)) out.push(`import cycle between actor folders: ${c.map((f) => `actors/${f}/`).join(" ↔ ")}`);
  return out;
}
