#!/usr/bin/env node
// The `ooze` command. In the checkout (app/cli/main.ts is here) it registers tsx and runs the
// TypeScript CLI, as `npm run ooze -- …` always has. In an installed package, which ships no app/*.ts,
// it runs the compiled CLI (dist/app/cli/main.js) with plain node; a topology's own TypeScript modules
// (actor kinds, tasks) still load: src/user-module.ts registers tsx when the first one is imported.
// The checkout runs that compiled CLI too while dist/ matches its sources (bin/dist-fresh.cjs; `npm
// run build`, which `npm test` runs when needed): each command, engine and node starts about a second
// sooner.
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import fresh from "./dist-fresh.cjs";

const source = new URL("../app/cli/main.ts", import.meta.url);
if (existsSync(source) && !fresh.distIsFresh(fileURLToPath(new URL("..", import.meta.url)))) {
  const { register } = await import("tsx/esm/api");
  register();
  await import(source.href);
} else {
  await import(new URL("../dist/app/cli/main.js", import.meta.url).href);
}
