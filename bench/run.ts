// Benchmark dispatcher: `npm run bench -- NAME [args]` runs bench/NAME.ts. Each benchmark prints its
// figures as one JSON line last, as ratios against a baseline measured in the same run.
import { existsSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const name = process.argv[2];
const available = readdirSync(here)
  .filter((f) => f.endsWith(".ts") && f !== "run.ts")
  .map((f) => f.slice(0, -3));
if (!name || !existsSync(join(here, `${name}.ts`))) {
  console.error(`usage: npm run bench -- NAME   (one of: ${available.join(", ") || "none yet"})`);
  process.exit(2);
}
process.argv.splice(2, 1);
await import(pathToFileURL(join(here, `${name}.ts`)).href);
