/// <reference lib="dom" />
/// <reference lib="dom.iterable" />
// The dashboard in a real browser: `ooze train --dash` runs a small job (tiny preset, one embedded
// engine) as a child process; headless Chromium (Debian's `chromium`, installed here when missing and
// we are root; the test is skipped, saying why, only when it cannot be) driven by puppeteer-core opens
// the printed URL and sees the job's actors, its engine and a reward curve whose points grow as the
// trainer's steps arrive over the bus; attaches an `ooze serve` engine with the page's form and
// detaches it with its button; opening a run directory that does not exist shows a readable
// message; a wrong token gets 401 and nothing else; the trajectory explorer lists the live job's
// samples (its own test: dash-explorer.test.ts). It saves a screenshot (OOZE_DASH_SCREENSHOT, e.g.
// docs/dash.png; default a temp file; OOZE_DASH_SCREENSHOT_STEPS=N waits for N steps first,
// OOZE_DASH_TOPOLOGY=FILE runs another topology).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, stopChild } from "../harness/debian.ts";
import { waitUntil } from "../harness/index.ts";

const OOZE = resolve("bin/ooze.mjs");
const browserBin = chromium();
if ("skip" in browserBin) console.warn(`dash-browser test skipped: ${browserBin.skip}`);

const TOPOLOGY = `name: dash-browser
actors:
  - { name: trainer, kind: train.trainer }
engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }
train:
  task: addition
  taskConfig: { digits: 1, answer: last-digit }
  preset: tiny
  promptsPerStep: 4
  samplesPerPrompt: 4
  lr: 0.003
  weightSync: delta
  steps: 100000
  checkpointEvery: 100000
`;

/** OOZE_DASH_TOPOLOGY: another topology to run (e.g. topologies/quickstart.yaml for the docs' screenshot). */
const topologyFile = process.env.OOZE_DASH_TOPOLOGY ? resolve(process.env.OOZE_DASH_TOPOLOGY) : null;
/** OOZE_DASH_SCREENSHOT_STEPS: wait for that many steps before the screenshot (a fuller one for the docs). */
const screenshotSteps = Number(process.env.OOZE_DASH_SCREENSHOT_STEPS ?? 0);

describe.skipIf("skip" in browserBin)("dashboard in headless Chromium", () => {
  let dir: string;
  let child: ChildProcess;
  let output = "";
  let url: string;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "ooze-dash-browser-"));
    writeFileSync(join(dir, "topology.yaml"), TOPOLOGY);
    child = spawn(process.execPath, [OOZE, "train", topologyFile ?? join(dir, "topology.yaml"), "--out", join(dir, "run"), "--dash-port", "0", "--quiet"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, OOZE_HOME: join(dir, "home") },
    });
    child.stdout!.on("data", (c: Buffer) => (output += c.toString()));
    child.stderr!.on("data", (c: Buffer) => (output += c.toString()));
    url = await waitUntil(() => /dashboard: (http:\/\/127\.0\.0\.1:\d+\/\?token=[0-9a-f]+)/.exec(output)?.[1], {
      what: "ooze train --dash to print the dashboard URL",
      timeoutMs: 45_000,
      diagnostics: () => output.slice(-3000),
    });
    browser = await puppeteer.launch({ executablePath: (browserBin as { path: string }).path, headless: true, args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
    page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1300 });
  }, 120_000);

  afterAll(async () => {
    await browser?.close().catch(() => undefined);
    await stopChild(child, "SIGINT", 20_000);
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  /** Evaluates `f(arg)` in the page until it returns a truthy value. */
  const until = <T, A = null>(what: string, f: (arg: A) => T, arg: A = null as A, timeoutMs = 45_000) =>
    waitUntil(() => page.evaluate(f as (a: unknown) => T, arg), {
      what,
      timeoutMs,
      intervalMs: 250,
      diagnostics: () => `ooze train output:\n${output.slice(-2000)}`,
    });

  it("shows the actors, the engine and a reward curve that grows, live", async () => {
    const res = await page.goto(url, { waitUntil: "domcontentloaded" });
    expect(res?.status()).toBe(200);
    const actors = await until("the job's actors in the topology table", () => {
      const paths = [...document.querySelectorAll("[data-actor]")].map((e) => e.getAttribute("data-actor"));
      return paths.includes("trainer") && paths.includes("rollout") && paths.includes("fleet") ? paths : null;
    });
    expect(actors).toEqual(expect.arrayContaining(["fleet", "rollout", "buffer", "trainer", "weight-sync"]));
    const engine = await until("a healthy engine in the engines table", () => {
      const row = document.querySelector("[data-engine]");
      return row && row.textContent!.includes("healthy") && !row.textContent!.includes("unhealthy") ? row.getAttribute("data-engine") : null;
    });
    expect(engine).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const first = await until("the reward curve to have points", () => Number(document.querySelector('[data-chart="reward"]')?.getAttribute("data-points") ?? 0) || null);
    const rewardPoints = (n: number) => {
      const have = Number(document.querySelector('[data-chart="reward"]')?.getAttribute("data-points") ?? 0);
      return have >= n ? have : null;
    };
    const later = await until(`the reward curve to grow from ${first} points (live updates)`, rewardPoints, Math.max(first + 2, 4));
    // For the docs: more steps in the screenshot, as many as come within the time allowed.
    if (screenshotSteps > later) await until(`${screenshotSteps} steps for the screenshot`, rewardPoints, screenshotSteps, screenshotSteps * 2_000).catch(() => undefined);
    expect(later).toBeGreaterThan(first);
    // The curve is drawn (uPlot's canvas), and weight versions are listed.
    expect(await page.evaluate(() => document.querySelectorAll('[data-chart="reward"] canvas').length)).toBeGreaterThan(0);
    await until("weight versions in the weight-sync table", () => document.querySelectorAll("[data-version]").length >= 2);
    // The fields added for the dashboard arrive: the learning rate and the staleness histogram of
    // each step, and what each weight sync sent (the tiny topology syncs deltas).
    const points = await page.evaluate(() => Object.fromEntries([...document.querySelectorAll("[data-chart]")].map((e) => [e.getAttribute("data-chart"), Number(e.getAttribute("data-points"))])));
    expect(points).toMatchObject({ lr: expect.any(Number), staleness: expect.any(Number), sync_bytes: expect.any(Number) });
    expect(Math.min(points.lr!, points.staleness!, points.sync_bytes!)).toBeGreaterThan(0);
    // The trajectory explorer reads the live job's run directory: the trained samples of its steps.
    const episodes = await until("the live job's samples in the trajectory table", () => document.querySelectorAll("[data-episode-row]").length || null);
    expect(episodes).toBeGreaterThan(0);
    if (topologyFile === null) await until("a delta sync in the weight-sync table", () => [...document.querySelectorAll("[data-version]")].some((r) => r.textContent!.includes("delta")));
    const shot = process.env.OOZE_DASH_SCREENSHOT ?? join(dir, "dash.png");
    await page.screenshot({ path: shot as `${string}.png`, fullPage: true });
    console.log(`dash-browser: screenshot ${shot}`);
  }, 60_000 + screenshotSteps * 2_000);

  // (with OOZE_DASH_TOPOLOGY the job's model may not be the tiny preset this engine serves)
  it.skipIf(topologyFile !== null)("attaches an engine with the form and detaches it with its button", async () => {
    // A second engine serving the same (tiny) model, started by hand as a user would.
    const serve = spawn(process.execPath, [OOZE, "serve", "--preset", "tiny", "--port", "0", "--max-running", "32", "--cache-tokens", "4096"], { stdio: ["ignore", "pipe", "pipe"] });
    let serveOut = "";
    serve.stdout!.on("data", (c: Buffer) => (serveOut += c.toString()));
    serve.stderr!.on("data", (c: Buffer) => (serveOut += c.toString()));
    try {
      const engineUrl = await waitUntil(() => / at (http:\/\/127\.0\.0\.1:\d+)/.exec(serveOut)?.[1], { what: "ooze serve to print its URL", timeoutMs: 45_000, diagnostics: () => serveOut });
      await page.type("#attach input[name=url]", engineUrl);
      await page.click("#attach button[type=submit]");
      const attached = await until(
        "the attach to be reported under the form",
        () => {
          const el = document.querySelector("#engine-msg") as HTMLElement;
          return !el.hidden && !el.textContent!.includes("attaching") ? el.textContent : null;
        },
        null,
        90_000,
      );
      expect(attached).toContain(`attached ${engineUrl}`);
      await until("the new engine's row", (u: string) => document.querySelector(`[data-engine="${u}"]`) !== null, engineUrl);
      await until("the attach event", (u: string) => [...document.querySelectorAll("#engine-events li")].some((li) => li.textContent!.includes(`attached ${u} (runtime)`)), engineUrl);
      page.once("dialog", (d) => void d.accept());
      // Found and clicked in one step inside the page: the engines table is re-rendered by the live
      // feed, and a button found first and clicked after (page.click) can be a replaced, detached one.
      await page.evaluate((u: string) => void setTimeout(() => (document.querySelector(`[data-detach="${u}"]`) as HTMLButtonElement).click(), 0), engineUrl);
      await until("the new engine's row to go", (u: string) => document.querySelector(`[data-engine="${u}"]`) === null, engineUrl, 90_000);
      await until("the detach event", (u: string) => [...document.querySelectorAll("#engine-events li")].some((li) => li.textContent!.includes(`detached ${u}`)), engineUrl);
      // The job's own engine is still there.
      expect(await page.evaluate(() => document.querySelectorAll("[data-engine]").length)).toBe(1);
    } finally {
      const exited = new Promise((r) => serve.once("exit", r));
      if (serve.exitCode === null) serve.kill("SIGTERM");
      await exited;
    }
  }, 240_000);

  it("shows a readable message for a run directory that does not exist", async () => {
    await page.type("#open-run input[name=dir]", join(dir, "no-such-run"));
    await page.click("#open-run button[type=submit]");
    const msg = await until("the run message", () => {
      const el = document.querySelector("#run-msg") as HTMLElement | null;
      return el && !el.hidden && el.textContent!.includes("does not exist") ? el.textContent : null;
    });
    expect(msg).toContain(join(dir, "no-such-run"));
    await page.click("#live");
  });

  it("refuses a wrong token with 401 and nothing else", async () => {
    const wrong = url.replace(/token=([0-9a-f]+)/, (_m, t: string) => `token=${t.slice(0, -1)}${t.endsWith("0") ? "1" : "0"}`);
    const p = await browser.newPage();
    const res = await p.goto(wrong, { waitUntil: "domcontentloaded" });
    expect(res?.status()).toBe(401);
    expect((await p.evaluate(() => document.body.innerText)).trim()).toBe("401 Unauthorized");
    const noToken = await p.goto(url.replace(/\?token=.*$/, "assets/uplot.js"));
    expect(noToken?.status()).toBe(401);
    await p.close();
  });
});
