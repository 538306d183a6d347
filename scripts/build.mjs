// `npm run build` (and `npm pack`'s prepack): compiles the package into dist/ — JavaScript and .d.ts
// from src/, actors/, app/ and native/ by tsc (tsconfig.build.json, which rewrites the sources'
// `./x.ts` imports to `./x.js`) — and copies the files tsc does not emit: the dashboard's page and
// the addon's hand-written typings. dist/ is emptied first, so a deleted source leaves nothing behind.
// Last it records the sources' fingerprint (bin/dist-fresh.cjs): in the checkout, processes ooze
// starts run dist/ with plain node while the sources still match it. `--if-stale` (scripts/test.sh)
// builds only when they do not.
import { execFileSync } from "node:child_process";
import { cpSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const dist = join(root, "dist");
const require = createRequire(import.meta.url);
const { STAMP, distIsFresh, sourcesFingerprint } = require("../bin/dist-fresh.cjs");

/** Files copied as they are: [from, to], relative to the package root and dist/. */
const ASSETS = [
  ["app/dash/page", "app/dash/page"],
  ["native/index.d.ts", "native/index.d.ts"],
];

if (process.argv.includes("--if-stale") && distIsFresh(root)) process.exit(0);
process.stderr.write("[ooze build] compiling the sources into dist/ (tsc)\n");
const fingerprint = sourcesFingerprint(root); // before compiling: a file edited meanwhile leaves dist/ stale
rmSync(dist, { recursive: true, force: true });
const tsc = require.resolve("typescript/bin/tsc");
execFileSync(process.execPath, [tsc, "-p", join(root, "tsconfig.build.json")], { cwd: root, stdio: "inherit" });
for (const [from, to] of ASSETS) cpSync(join(root, from), join(dist, to), { recursive: true });
writeFileSync(join(root, STAMP), `${fingerprint}\n`);
