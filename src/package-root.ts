// Where the ooze package lies on disk, for the files a running ooze needs beside its modules: the
// `ooze` command (bin/ooze.mjs) that engines, nodes and workers are started with, and the native
// addon's build directory. The same answer from the checkout's .ts sources (src/package-root.ts) and
// from an installed package's compiled dist/src/package-root.js, whose depths below the root differ.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { OozeError } from "./errors.ts";

let root: string | null = null;

/**
 * The directory holding ooze's own package.json (the checkout, or node_modules/ooze when installed):
 * the first directory named "ooze" by its package.json, walking up from this file. Found once.
 */
export function packageRoot(): string {
  if (root !== null) return root;
  const start = dirname(fileURLToPath(import.meta.url));
  for (let dir = start; ; dir = dirname(dir)) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest) && nameOf(manifest) === "ooze") return (root = dir);
    if (dirname(dir) === dir) break;
  }
  throw new OozeError("INTERNAL", `no package.json named "ooze" above ${start}: the ooze package is incomplete; reinstall it`);
}

/** The `ooze` command's script (bin/ooze.mjs), run as `node <oozeBin()> serve …` to start a child. */
export function oozeBin(): string {
  return join(packageRoot(), "bin", "ooze.mjs");
}

/**
 * The checkout's dist/ when `npm run build` compiled it from exactly the sources there now
 * (bin/dist-fresh.cjs), so that a child process can run it with plain node instead of the sources
 * under tsx (about a second less per start); null otherwise, and in an installed package, which runs
 * dist/ anyway.
 */
export function freshDist(): string | null {
  const { distIsFresh } = createRequire(import.meta.url)(join(packageRoot(), "bin", "dist-fresh.cjs")) as { distIsFresh: (root: string) => boolean };
  return distIsFresh(packageRoot()) ? join(packageRoot(), "dist") : null;
}

function nameOf(manifest: string): unknown {
  try {
    return (JSON.parse(readFileSync(manifest, "utf8")) as { name?: unknown }).name;
  } catch {
    return undefined;
  }
}
