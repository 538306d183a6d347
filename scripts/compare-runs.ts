// Plots several runs' curves on one chart: a field of metrics.jsonl (default reward_mean), averaged
// over a moving window of steps, against the step (or with --x seconds, wall time).
//   node --import tsx scripts/compare-runs.ts --out chart.svg --title T [--field F] [--x step|seconds] [--window K] LABEL=RUN_DIR ...
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { readJsonl } from "../actors/protocol/metrics.ts";

const args = process.argv.slice(2);
const opt = (name: string, fallback: string) => {
  const i = args.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const v = args[i + 1]!;
  args.splice(i, 2);
  return v;
};
const out = opt("out", "compare.svg"), title = opt("title", "runs"), field = opt("field", "reward_mean");
const xField = opt("x", "step"), window = Number(opt("window", "10"));
const runs = args.map((a) => {
  const [label, dir] = a.includes("=") ? [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)] : [a, a];
  const rows = readJsonl<Record<string, number>>(join(dir, "metrics.jsonl"));
  const pts = rows.map((r, i) => {
    const w = rows.slice(Math.max(0, i - window + 1), i + 1);
    return [r[xField]!, w.reduce((s, x) => s + x[field]!, 0) / w.length] as const;
  });
  return { label, pts };
});
if (runs.length === 0 || runs.some((r) => r.pts.length === 0)) {
  console.error("usage: compare-runs.ts --out F.svg [--title T] [--field F] [--x step|seconds] [--window K] LABEL=RUN_DIR ...  (each with a non-empty metrics.jsonl)");
  process.exit(2);
}
const W = 640, H = 360, L = 56, R = 20, T = 28, B = 44;
const xMax = Math.max(...runs.flatMap((r) => r.pts.map((p) => p[0])));
const yMax = Math.max(1, ...runs.flatMap((r) => r.pts.map((p) => p[1])));
const X = (x: number) => L + ((W - L - R) * x) / xMax, Y = (y: number) => H - B - ((H - T - B) * y) / yMax;
const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
const parts = [
  `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">`,
  `<rect width="${W}" height="${H}" fill="white"/>`,
  `<text x="${W / 2}" y="16" text-anchor="middle" font-size="13">${title}</text>`,
];
for (let k = 0; k <= 5; k++) {
  const y = (yMax * k) / 5;
  parts.push(`<line x1="${L}" x2="${W - R}" y1="${Y(y)}" y2="${Y(y)}" stroke="#ddd"/>`, `<text x="${L - 6}" y="${Y(y) + 4}" text-anchor="end">${y.toFixed(1)}</text>`);
  const x = (xMax * k) / 5;
  parts.push(`<text x="${X(x)}" y="${H - B + 16}" text-anchor="middle">${Math.round(x)}</text>`);
}
parts.push(`<text x="${(L + W - R) / 2}" y="${H - 8}" text-anchor="middle">${xField}</text>`, `<text x="14" y="${(T + H - B) / 2}" transform="rotate(-90 14 ${(T + H - B) / 2})" text-anchor="middle">${field} (mean of ${window} steps)</text>`);
runs.forEach((r, i) => {
  const c = colors[i % colors.length]!;
  parts.push(`<polyline fill="none" stroke="${c}" stroke-width="1.5" points="${r.pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ")}"/>`);
  parts.push(`<line x1="${L + 12}" x2="${L + 32}" y1="${T + 10 + 16 * i}" y2="${T + 10 + 16 * i}" stroke="${c}" stroke-width="2"/>`, `<text x="${L + 38}" y="${T + 14 + 16 * i}">${r.label}</text>`);
});
parts.push("</svg>");
writeFileSync(out, parts.join("\n") + "\n");
console.log(`wrote ${out}`);
