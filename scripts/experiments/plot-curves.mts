// Plots success against wall-clock seconds for several runs in one SVG: `ooze train` runs
// (metrics.jsonl: seconds, success_rate) and runs of referential-game.mts (--out JSONL: seconds,
// success). Used for the referential game's figure in docs/experiments/referential-game.md.
//
//   node --import tsx scripts/experiments/plot-curves.mts [--mean N] [--x step] OUT.svg "label=path.jsonl" …
//
// --mean N plots each step's trailing mean over N steps (default 1: the steps themselves); --x step
// plots against the step instead of the seconds (runs on a machine whose load varied).
import { readFileSync, writeFileSync } from "node:fs";

const args = process.argv.slice(2);
const at = args.indexOf("--mean");
const meanOver = at >= 0 ? Number(args.splice(at, 2)[1]) : 1;
const xAt = args.indexOf("--x");
const xKey = xAt >= 0 ? args.splice(xAt, 2)[1] : "seconds";
const [out, ...series] = args;
if (!out || series.length === 0 || !Number.isInteger(meanOver) || meanOver < 1 || (xKey !== "seconds" && xKey !== "step")) {
  console.error('usage: plot-curves.mts [--mean N] [--x seconds|step] OUT.svg "label=path.jsonl" …');
  process.exit(2);
}
const COLORS = ["#2d6fe3", "#5aa0f0", "#9cc4f5", "#e39b2d", "#f0b860", "#f5d49c", "#1b9e5a", "#5fcf8f", "#a33fb5", "#d089dc"];
const runs = series.map((s) => {
  const [label, path] = s.split("=") as [string, string];
  const rows = readFileSync(path, "utf8").split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l) as Record<string, number>);
  const steps = rows.filter((r) => typeof r[xKey] === "number" && typeof (r.success_rate ?? r.success) === "number").map((r) => [r[xKey]!, (r.success_rate ?? r.success)!] as const);
  const pts = steps.map(([t], i) => {
    const window = steps.slice(Math.max(0, i + 1 - meanOver), i + 1);
    return [t, window.reduce((a, p) => a + p[1], 0) / window.length] as const;
  });
  return { label, pts };
});
const W = 640, H = 320, L = 48, R = 170, T = 22, B = 36;
const xMax = Math.max(...runs.flatMap((r) => r.pts.map((p) => p[0])));
const x = (s: number) => L + ((W - L - R) * s) / xMax, y = (v: number) => T + (H - T - B) * (1 - v);
const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="11">`, `<rect width="${W}" height="${H}" fill="white"/>`];
for (const v of [0, 0.125, 0.5, 0.9, 1]) parts.push(`<line x1="${L}" x2="${W - R}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/><text x="${L - 6}" y="${y(v) + 4}" text-anchor="end">${v}</text>`);
const tick = (xKey === "step" ? [10, 25, 50, 100, 250] : [30, 60, 120, 300, 600]).find((t) => xMax / t <= 12) ?? 1200;
for (let s = 0; s <= xMax; s += tick) parts.push(`<text x="${x(s)}" y="${H - B + 14}" text-anchor="middle">${s}</text>`);
parts.push(`<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">${xKey}</text>`, `<text x="4" y="${T - 4}">success${meanOver > 1 ? ` (mean of ${meanOver} steps)` : ""}</text>`);
runs.forEach((r, i) => {
  const c = COLORS[i % COLORS.length]!;
  parts.push(`<path d="${r.pts.map((p, k) => `${k ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("")}" fill="none" stroke="${c}" stroke-width="1.3"/>`);
  parts.push(`<line x1="${W - R + 10}" x2="${W - R + 28}" y1="${T + 8 + 16 * i}" y2="${T + 8 + 16 * i}" stroke="${c}" stroke-width="2"/><text x="${W - R + 32}" y="${T + 12 + 16 * i}">${r.label}</text>`);
});
parts.push("</svg>");
writeFileSync(out, parts.join("\n"));
