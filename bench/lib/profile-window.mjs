// Compares two runs' V8 CPU profiles over a window of each, a unit of work at a time:
//
//   node bench/lib/profile-window.mjs A.cpuprofile[,A2…] T0 T1 UNITS_A  B.cpuprofile[,B2…] T0 T1 UNITS_B [ROWS]
//
// Each side's profiles (e.g. every rollout process of a `bench scale` run made with
// OOZE_BENCH_CPU_PROF=DIR: the main threads' files end in .0.001.cpuprofile) are cut to [T0, T1],
// seconds on CLOCK_MONOTONIC — the profiles' own clock, which `bench scale` prints on each step line
// ("monotonic … s") — and summed; UNITS divides them (generated samples, requests). Prints the main
// threads' busy time a unit, then the functions' self time and the source files' inclusive time (a
// file counted once a sample however deep it recurs) a unit on each side, largest increase first.
// A profile counts wall time while a function is on the stack: on a loaded machine that includes
// time the thread waited for a core, so compare shares (a row's growth against the busy time's),
// not the figures themselves. Plain JavaScript: run with node, no build.
import { readFileSync } from "node:fs";

/** Self time by function and inclusive time by file over [t0, t1] (s), summed over `files`, µs. */
function load(files, t0s, t1s) {
  const t0 = Number(t0s) * 1e6;
  const t1 = Number(t1s) * 1e6;
  const self = new Map();
  const inclusive = new Map();
  let busy = 0;
  for (const file of files.split(",")) {
    const p = JSON.parse(readFileSync(file, "utf8"));
    const byId = new Map(p.nodes.map((n) => [n.id, n]));
    const parent = new Map();
    for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
    const where = (cf) => (cf.url ? cf.url.replace(/^.*\/(dist|node_modules|bench)\//, "$1/") : `(${cf.functionName || "native"})`);
    let t = p.startTime;
    for (let i = 0; i < p.samples.length; i++) {
      t += p.timeDeltas[i] ?? 0;
      if (t < t0 || t > t1) continue;
      const d = p.timeDeltas[i + 1] ?? 0; // the interval this sample stands for
      const leaf = byId.get(p.samples[i]);
      if (leaf.callFrame.functionName === "(idle)") continue;
      busy += d;
      const key = `${leaf.callFrame.functionName || "(anon)"} ${where(leaf.callFrame)}:${leaf.callFrame.lineNumber + 1}`;
      self.set(key, (self.get(key) ?? 0) + d);
      const seen = new Set();
      for (let id = leaf.id; id !== undefined; id = parent.get(id)) {
        const f = where(byId.get(id).callFrame);
        if (seen.has(f)) continue;
        seen.add(f);
        inclusive.set(f, (inclusive.get(f) ?? 0) + d);
      }
    }
  }
  return { self, inclusive, busy };
}

const args = process.argv.slice(2);
if (args.length < 8) {
  process.stderr.write("usage: node bench/lib/profile-window.mjs A[,A2…] T0 T1 UNITS_A B[,B2…] T0 T1 UNITS_B [ROWS]\n");
  process.exit(2);
}
const [fa, a0, a1, na, fb, b0, b1, nb, rowsArg] = args;
const rows = Number(rowsArg ?? 40);
const A = load(fa, a0, a1);
const B = load(fb, b0, b1);
const perA = (v) => v / Number(na);
const perB = (v) => v / Number(nb);
console.log(`main thread busy, µs a unit: ${perA(A.busy).toFixed(0)} -> ${perB(B.busy).toFixed(0)} (${(perB(B.busy) / perA(A.busy)).toFixed(2)}x)`);
for (const [title, ma, mb] of [["self time by function", A.self, B.self], ["inclusive time by file", A.inclusive, B.inclusive]]) {
  console.log(`-- ${title}, µs a unit: A, B, B - A`);
  const keys = new Set([...ma.keys(), ...mb.keys()]);
  const table = [...keys].map((k) => [k, perA(ma.get(k) ?? 0), perB(mb.get(k) ?? 0)]).sort((x, y) => y[2] - y[1] - (x[2] - x[1]));
  for (const [k, x, y] of table.slice(0, rows)) console.log(`${x.toFixed(1).padStart(9)} ${y.toFixed(1).padStart(9)} ${(y - x).toFixed(1).padStart(9)}  ${k}`);
}
