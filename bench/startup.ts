// Startup benchmark (`npm run bench -- startup [--runs N]`): the CPU an `ooze` process spends before
// it does any work, for the commands a job starts most — an engine (`serve`, `sim-engine`), a node, a
// job (`train`, `fuzz`), `up` — and for the whole command list (`--help`, which loads every command's
// module, as every command did before Dec 2), against bare node in the same run. A job starts
// hundreds of such processes (the test suite some 300), and a node restarted after a crash pays it
// again. Each start is `ooze CMD --help` from the compiled dist/ (its command's code loaded and its
// options set up, nothing run); its CPU is the change in this process's reaped-children time
// (/proc/self/stat cutime + cstime) around a spawnSync. Commands alternate, and each figure is the
// median of --runs starts (default 9).
// Progress on stderr; one JSON line last: bare node's CPU and each command's as a multiple of it.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { waitedChildrenCpuSeconds } from "./lib/cpu.ts";

const flag = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1]! : fallback;
};
const runs = Number(flag("runs", "9"));
if (!Number.isInteger(runs) || runs < 1) throw new Error(`--runs: expected a whole number ≥ 1, got ${flag("runs", "")}`);

const ooze = fileURLToPath(new URL("../bin/ooze.mjs", import.meta.url));
const BARE = "bare node";
const starts: Record<string, string[]> = {
  [BARE]: ["-e", "0"],
  help: [ooze, "--help"],
  serve: [ooze, "serve", "--help"],
  "sim-engine": [ooze, "sim-engine", "--help"],
  node: [ooze, "node", "--help"],
  train: [ooze, "train", "--help"],
  fuzz: [ooze, "fuzz", "--help"],
  up: [ooze, "up", "--help"],
};

const cpu: Record<string, number[]> = Object.fromEntries(Object.keys(starts).map((k) => [k, []]));
for (let r = 0; r < runs; r++) {
  for (const [name, args] of Object.entries(starts)) {
    const before = waitedChildrenCpuSeconds();
    const p = spawnSync(process.execPath, args, { stdio: ["ignore", "ignore", "pipe"], encoding: "utf8" });
    if (p.status !== 0) throw new Error(`${name}: ${[process.execPath, ...args].join(" ")} exited with ${p.status ?? p.signal}: ${p.stderr}`);
    cpu[name]!.push(waitedChildrenCpuSeconds() - before);
  }
  process.stderr.write(`[bench startup] round ${r + 1}/${runs}\n`);
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const base = median(cpu[BARE]!);
const figures: Record<string, number> = { bare_node_ms: Math.round(base * 1000) };
for (const name of Object.keys(starts)) {
  if (name === BARE) continue;
  const ms = median(cpu[name]!) * 1000;
  process.stderr.write(`[bench startup] ooze ${name}: ${ms.toFixed(0)} ms of CPU (bare node ${(base * 1000).toFixed(0)} ms)\n`);
  figures[`${name.replace("-", "_")}_vs_bare`] = Number((ms / 1000 / base).toFixed(2));
}
console.log(JSON.stringify({ bench: "startup", runs, ...figures }));
