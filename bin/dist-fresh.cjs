// Whether dist/ (the compiled JavaScript of `npm run build`) matches the checkout's TypeScript
// sources, so that a process ooze starts — the `ooze` command, an engine, a node, a trainer worker —
// can run it with plain node instead of registering tsx, whose module hooks make each start about a
// second slower (`ooze --help`: 1.9 s under tsx, 0.7 s compiled). The build records a fingerprint of
// the sources (every file's path, size and modification time under the compiled folders, and of the
// compiler's settings); dist/ is used only while the sources still have exactly that fingerprint, so
// an edited, added or deleted source file sends every process back to the sources until the next
// build. CommonJS, so that the bin script, the build script and the TypeScript sources can all load
// it synchronously.
"use strict";
const { createHash } = require("node:crypto");
const { existsSync, readdirSync, readFileSync, statSync } = require("node:fs");
const { join } = require("node:path");

/** What `npm run build` compiles or copies, relative to the package root (tsconfig.build.json). */
const COMPILED = ["src", "actors", "app", "native/worker"];
/** The TypeScript files directly in native/ (the addon's wrappers) are compiled too. */
const NATIVE_TOP = "native";
/** How they are compiled. */
const SETTINGS = ["tsconfig.json", "tsconfig.build.json", "package.json"];

/** The file that holds the fingerprint dist/ was built from. */
const STAMP = join("dist", ".sources");

/** A fingerprint of the compiled sources under `root`: changes when any file is edited, added or removed. */
function sourcesFingerprint(root) {
  const lines = [];
  const walk = (rel) => {
    for (const e of readdirSync(join(root, rel), { withFileTypes: true })) {
      const path = `${rel}/${e.name}`;
      if (e.isDirectory()) walk(path);
      else if (e.isFile()) lines.push(entry(root, path));
    }
  };
  for (const dir of COMPILED) if (existsSync(join(root, dir))) walk(dir);
  for (const e of readdirSync(join(root, NATIVE_TOP), { withFileTypes: true }))
    if (e.isFile() && e.name.endsWith(".ts")) lines.push(entry(root, `${NATIVE_TOP}/${e.name}`));
  for (const f of SETTINGS) if (existsSync(join(root, f))) lines.push(entry(root, f));
  return createHash("sha1").update(lines.sort().join("\n")).digest("hex");
}

function entry(root, path) {
  const s = statSync(join(root, path));
  return `${path} ${s.size} ${s.mtimeMs}`;
}

/**
 * True when `root` is a checkout (it has the TypeScript sources) whose dist/ was built from exactly
 * the sources there now. False without sources (an installed package runs dist/ anyway), without a
 * build, or when a source changed since the build.
 */
function distIsFresh(root) {
  const stamp = join(root, STAMP);
  if (!existsSync(join(root, "app", "cli", "main.ts")) || !existsSync(stamp)) return false;
  try {
    return readFileSync(stamp, "utf8").trim() === sourcesFingerprint(root);
  } catch {
    return false; // a file removed while we looked: not fresh
  }
}

module.exports = { STAMP, sourcesFingerprint, distIsFresh };
