/// <reference lib="dom" />
/// <reference lib="dom.iterable" />
// The trajectory explorer in a real browser: `ooze train` runs a small fully_async agent job
// (test/fixtures/topologies/explorer.yaml: tiny preset, one embedded engine, the explorer agent
// whose episodes split into two trajectory segments, get cut by weight updates, and one of which
// exits non-zero), then `ooze dash --run DIR` serves its run directory and headless Chromium
// (Debian's `chromium`, as dash-browser.test.ts finds or installs it) through puppeteer-core finds a
// partial rollout, a trajectory split and the failed episode with the table's filters, opens each,
// and checks the token view against the sample's own loss mask, logprobs and weight-version spans,
// read here from the trainer's explorer file. It saves a screenshot (OOZE_EXPLORER_SCREENSHOT, e.g.
// docs/explorer.png; default a temp file).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ExplorerRecord } from "../../actors/trainer/explorer-log.ts";
import { chromium, stopChild } from "../harness/debian.ts";
import { waitUntil } from "../harness/index.ts";

const OOZE = resolve("bin/ooze.mjs");
const browserBin = chromium();
if ("skip" in browserBin) console.warn(`dash-explorer test skipped: ${browserBin.skip}`);

/** A sample of the run as the trainer wrote it, with its arrays decoded. */
interface Rec extends ExplorerRecord {
  mask: number[];
  lp: number[];
}

function readRun(run: string): Rec[] {
  const dir = join(run, "explorer");
  const recs: Rec[] = [];
  for (const f of readdirSync(dir).filter((f) => f.startsWith("step-")).sort())
    for (const line of readFileSync(join(dir, f), "utf8").trim().split("\n")) {
      const r = JSON.parse(line) as ExplorerRecord;
      const bytes = (s: string) => new Uint8Array(Buffer.from(s, "base64")).buffer;
      recs.push({ ...r, mask: Array.from(new Uint8Array(bytes(r.lossMask))), lp: Array.from(new Float32Array(bytes(r.logprobs))) });
    }
  return recs;
}

const isPartial = (r: Rec) => new Set(r.versions.map((v) => v.version)).size > 1;
const isSplit = (r: Rec) => r.trained && Number(r.metadata.segments) >= 2;

describe.skipIf("skip" in browserBin)("trajectory explorer in headless Chromium", () => {
  let dir: string;
  let run: string;
  let recs: Rec[] = [];
  let dash: ChildProcess;
  let output = "";
  let url: string;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "ooze-dash-explorer-"));
    // Whether a weight update lands inside a generation depends on timing: a run without a partial
    // rollout is run again (at most 3 runs; each takes ~15 s).
    for (let attempt = 1; attempt <= 3; attempt++) {
      run = join(dir, `run-${attempt}`);
      const r = spawnSync(process.execPath, [OOZE, "train", "test/fixtures/topologies/explorer.yaml", "--out", run, "--quiet"], { encoding: "utf8", timeout: 240_000 });
      expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
      recs = readRun(run);
      if (recs.some(isPartial) && recs.some(isSplit) && recs.some((x) => x.status === "failed")) break;
    }
    dash = spawn(process.execPath, [OOZE, "dash", "--run", run, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, OOZE_HOME: join(dir, "home") } });
    dash.stdout!.on("data", (c: Buffer) => (output += c.toString()));
    dash.stderr!.on("data", (c: Buffer) => (output += c.toString()));
    url = await waitUntil(() => /dashboard: (http:\/\/127\.0\.0\.1:\d+\/\?token=[0-9a-f]+)/.exec(output)?.[1], {
      what: "ooze dash to print the dashboard URL",
      timeoutMs: 45_000,
      diagnostics: () => output.slice(-3000),
    });
    browser = await puppeteer.launch({ executablePath: (browserBin as { path: string }).path, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
    page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1100 });
  }, 800_000);

  afterAll(async () => {
    await browser?.close().catch(() => undefined);
    await stopChild(dash, "SIGINT", 10_000);
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  const until = <T, A = null>(what: string, f: (arg: A) => T, arg: A = null as A, timeoutMs = 30_000) =>
    waitUntil(() => page.evaluate(f as (a: unknown) => T, arg), { what, timeoutMs, intervalMs: 200, diagnostics: () => `ooze dash output:\n${output.slice(-2000)}` });

  /** The table's rows as "step:index", after the filters. */
  const shownRows = () => page.evaluate(() => [...document.querySelectorAll("[data-episode-row]")].map((r) => r.getAttribute("data-episode-row")!));
  const key = (r: Rec) => `${r.step}:${r.index}`;

  /** Opens a sample's episode by clicking its row; waits for its token view. */
  async function openRow(r: Rec): Promise<void> {
    await page.click(`[data-episode-row="${key(r)}"]`);
    await until(`the episode of sample ${r.index}`, (i: number) => document.querySelector(`[data-tokens="${i}"]`) !== null, r.index);
  }

  /** Checks the token view of sample `r` against its own mask, logprobs and version spans. */
  async function checkTokens(r: Rec): Promise<number[]> {
    const view = await page.evaluate((i: number) => {
      const probe = document.createElement("span");
      document.body.append(probe);
      const colour = (css: string) => {
        probe.style.background = css;
        return getComputedStyle(probe).backgroundColor;
      };
      const toks = [...document.querySelectorAll(`[data-tokens="${i}"] .tok`)].map((t) => {
        const lp = t.getAttribute("data-logprob");
        return {
          i: Number(t.getAttribute("data-i")),
          kind: t.getAttribute("data-kind"),
          version: t.getAttribute("data-version"),
          logprob: lp === null ? null : Number(lp),
          bg: getComputedStyle(t).backgroundColor,
          // what the legend promises: hue from red (p 0) to green (p 1)
          expected: lp === null ? null : colour(`hsl(${Math.round(120 * Math.exp(Math.min(0, Number(lp))))}, 70%, 82%)`),
        };
      });
      const boundaries = [...document.querySelectorAll(`[data-tokens="${i}"] [data-boundary="version"]`)].map((b) => Number(b.getAttribute("data-at")));
      probe.remove();
      return { toks, boundaries };
    }, r.index);
    expect(view.toks).toHaveLength(r.promptLength + r.responseLength);
    const versionAt = (p: number) => r.versions.find((s) => p >= s.start && p < s.end)?.version ?? null;
    const changes: number[] = [];
    let last: string | null = null;
    for (const t of view.toks) {
      const p = t.i - r.promptLength;
      if (p < 0) {
        expect(t.kind, `token ${t.i}`).toBe("prompt");
        continue;
      }
      expect(t.kind, `token ${t.i}`).toBe(r.mask[p] === 1 ? "model" : "env");
      if (r.mask[p] === 1) {
        expect(t.version, `token ${t.i}`).toBe(versionAt(p));
        expect(t.logprob!, `token ${t.i}`).toBeCloseTo(r.lp[p]!, 3);
        expect(t.bg, `token ${t.i}`).toBe(t.expected);
        const v = versionAt(p);
        if (v !== null && last !== null && v !== last) changes.push(p);
        if (v !== null) last = v;
      } else expect(t.bg, `token ${t.i}`).toBe("rgb(191, 219, 254)"); // environment / template
    }
    expect(view.boundaries).toEqual(changes);
    return changes;
  }

  it("lists every sample of the run, and filters and sorts them", async () => {
    expect(recs.some(isPartial), "a partial rollout in the run").toBe(true);
    expect(recs.some(isSplit), "a trajectory split in the run").toBe(true);
    expect(recs.some((x) => x.status === "failed"), "a failed episode in the run").toBe(true);
    const res = await page.goto(url, { waitUntil: "domcontentloaded" });
    expect(res?.status()).toBe(200);
    await until("the explorer table", (n: number) => document.querySelectorAll("[data-episode-row]").length === n, recs.length);
    expect((await shownRows()).sort()).toEqual(recs.map(key).sort());

    await page.click('#ex-filter input[name="failed"]');
    expect((await shownRows()).sort()).toEqual(recs.filter((x) => x.status === "failed").map(key).sort());
    await page.click('#ex-filter input[name="failed"]');

    await page.click('#ex-filter input[name="partial"]');
    expect((await shownRows()).sort()).toEqual(recs.filter(isPartial).map(key).sort());
    await page.click('#ex-filter input[name="partial"]');

    await page.click('#ex-filter input[name="split"]');
    expect((await shownRows()).sort()).toEqual(recs.filter((x) => Number(x.metadata.segments) >= 2).map(key).sort());
    await page.click('#ex-filter input[name="split"]');

    await page.type('#ex-filter input[name="rmin"]', "0.5");
    expect((await shownRows()).sort()).toEqual(recs.filter((x) => x.reward !== null && x.reward >= 0.5).map(key).sort());
    await page.$eval('#ex-filter input[name="rmin"]', (e) => {
      (e as HTMLInputElement).value = "";
      e.dispatchEvent(new Event("input", { bubbles: true }));
    });

    await page.type('#ex-filter input[name="q"]', "giving up on purpose");
    expect((await shownRows()).sort()).toEqual(recs.filter((x) => String(x.metadata.error).includes("giving up on purpose")).map(key).sort());
    await page.$eval('#ex-filter input[name="q"]', (e) => {
      (e as HTMLInputElement).value = "";
      e.dispatchEvent(new Event("input", { bubbles: true }));
    });

    // sort by reward, ascending: failed (no reward) last
    await page.click('#ex-table th[data-sort="reward"]');
    await page.click('#ex-table th[data-sort="reward"]');
    const rewards = await page.evaluate(() => [...document.querySelectorAll("[data-episode-row]")].map((r) => r.children[5]!.textContent));
    const nums = rewards.filter((x) => x !== "—").map(Number);
    expect(nums).toEqual([...nums].sort((a, b) => a - b));
    expect(rewards.slice(nums.length).every((x) => x === "—")).toBe(true);
  }, 60_000);

  it("shows a partial rollout's tokens with their weight-version boundary, and its group beside it", async () => {
    const p = recs.find(isPartial)!;
    await openRow(p);
    expect((await checkTokens(p)).length).toBeGreaterThan(0); // the weight update inside its generation, marked
    const group = recs.filter((x) => x.step === p.step && x.group === p.group).map(key).sort();
    expect((await page.evaluate(() => [...document.querySelectorAll("[data-group-member]")].map((e) => e.getAttribute("data-group-member")!))).sort()).toEqual(group);
    const facts = await page.evaluate(() => document.querySelector(".ep-facts")!.textContent);
    expect(facts).toContain(`advantage ${p.advantage!.toFixed(3)}`);
  });

  it("shows a trajectory split: every segment, the boundary between them, the chat with its tool call", async () => {
    // prefer an episode with a tool round (the explorer agent's episode 1 of a group)
    const splits = recs.filter((x) => isSplit(x) && x.metadata.segment === 0);
    const s = splits.find((x) => JSON.stringify(x.metadata.transcript ?? []).includes("lookup")) ?? splits.find((x) => recs.some((y) => y.rolloutId === x.rolloutId && y.metadata.segment === 1 && JSON.stringify(y.metadata.transcript).includes("lookup"))) ?? splits[0]!;
    const segs = recs.filter((x) => x.step === s.step && x.rolloutId === s.rolloutId).sort((a, b) => Number(a.metadata.segment) - Number(b.metadata.segment));
    await openRow(s);
    expect(await page.evaluate(() => document.querySelectorAll("[data-segment-view]").length)).toBe(segs.length);
    expect(await page.evaluate(() => document.querySelectorAll('[data-boundary="segment"]').length)).toBe(segs.length - 1);
    for (const seg of segs) await checkTokens(seg);
    const transcript = JSON.stringify(segs.map((x) => x.metadata.transcript));
    if (transcript.includes("lookup")) {
      expect(await page.evaluate(() => document.querySelectorAll('[data-tool-call="lookup"]').length)).toBeGreaterThan(0);
      expect(await page.evaluate(() => document.querySelectorAll('.chat [data-role="tool"]').length)).toBeGreaterThan(0);
    }
    const shot = process.env.OOZE_EXPLORER_SCREENSHOT ?? join(dir, "explorer.png");
    const section = await page.$("#explorer");
    await section!.screenshot({ path: shot as `${string}.png` });
    console.log(`dash-explorer: screenshot ${shot}`);
  });

  it("shows the failed episode with its reason and agent exit status", async () => {
    const f = recs.find((x) => x.status === "failed" && String(x.metadata.error).includes("giving up on purpose")) ?? recs.find((x) => x.status === "failed")!;
    await openRow(f);
    await checkTokens(f);
    const text = await page.evaluate(() => document.querySelector("#ex-episode")!.textContent!);
    expect(text).toContain(String(f.metadata.error));
    expect(text).toContain("status failed (not trained)");
    expect(text).toContain("agent exit 3");
  });
});
