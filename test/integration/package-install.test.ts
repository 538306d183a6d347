// ooze as a package, installed the way a user installs it: `npm pack` (whose prepack compiles dist/;
// the checkout's own dist/ is packed instead when it was compiled from the same sources) in a copy of
// the checkout, then an empty project installs the tarball — the package's install
// script builds the native addon — and plain `node` (no tsx, no --conditions) imports ooze,
// ooze/testing, ooze/testing/job and ooze/algorithms, runs `npx ooze --help` and `npx ooze check`,
// and trains two steps on a topology whose task is the user's TypeScript module (an engine child
// process, the compiled trainer worker, the addon the install built, tsx registered on demand). The
// install is offline: the project's lockfile holds the checkout's own production entries, so every
// tarball comes from the npm cache the checkout's install filled and no host but loopback is reached.
// Also: the native build script's message when no compiler is found.
import { spawnSync, type SpawnSyncReturns } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDist } from "../../src/package-root.ts";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dir = mkdtempSync(join(tmpdir(), "ooze-package-"));
const project = join(dir, "project");
const installed = join(project, "node_modules", "ooze");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/**
 * The environment of a user's shell: without what a parent npm (`npm test`) exports about the
 * checkout — its local prefix would point npx and npm back at the checkout — and without NODE_OPTIONS.
 */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(npm_(package|lifecycle)_|npm_config_local_prefix$|npm_command$|INIT_CWD$|NODE_OPTIONS$)/.test(k)) continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

/** Runs a command to its end (10 minutes at most); returns its output. */
function run(cmd: string, args: string[], cwd: string, extra: Record<string, string> = {}): SpawnSyncReturns<string> {
  return spawnSync(cmd, args, { cwd, env: userEnv(extra), encoding: "utf8", timeout: 600_000, maxBuffer: 64 << 20 });
}

/** `run`, failing with the command's output unless it exits 0. */
function ok(cmd: string, args: string[], cwd: string, extra: Record<string, string> = {}): SpawnSyncReturns<string> {
  const r = run(cmd, args, cwd, extra);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} (in ${cwd}) ended with ${r.error?.message ?? r.signal ?? `exit code ${r.status}`}:\n${r.stdout}\n${r.stderr}`);
  return r;
}

/**
 * An empty project depending on the tarball, with a lockfile so that `npm ci --offline` needs no
 * registry metadata: the tarball's entry, and the checkout's production entries (devOptional ones
 * become optional). allowScripts approves the install scripts (the file: URL is how npm names a
 * tarball's), so the strict policy a later npm enforces by default is met.
 */
function writeProject(tarball: string): void {
  const spec = `file:${tarball}`;
  const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const lock = JSON.parse(readFileSync(join(root, "package-lock.json"), "utf8"));
  const integrity = `sha512-${createHash("sha512").update(readFileSync(tarball)).digest("base64")}`;
  const packages: Record<string, unknown> = {
    "": { name: "ooze-user", dependencies: { ooze: spec } },
    "node_modules/ooze": { version: pkg.version, resolved: spec, integrity, hasInstallScript: true, license: pkg.license, dependencies: pkg.dependencies, bin: pkg.bin, engines: pkg.engines },
  };
  for (const [path, entry] of Object.entries(lock.packages as Record<string, { dev?: boolean; devOptional?: boolean }>)) {
    if (path === "" || entry.dev) continue;
    const { devOptional, ...rest } = entry;
    packages[path] = devOptional ? { ...rest, optional: true } : rest;
  }
  const allowScripts = { [`file:${tarball}`]: true, esbuild: true, "msgpackr-extract": true };
  mkdirSync(project);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "ooze-user", private: true, type: "module", dependencies: { ooze: spec }, allowScripts }, null, 2));
  writeFileSync(join(project, "package-lock.json"), JSON.stringify({ name: "ooze-user", lockfileVersion: 3, requires: true, packages }, null, 2));
}

/**
 * What `npm pack` reads and its prepack build compiles, copied from the checkout (its native/build
 * left out), with the checkout's node_modules linked: the build writes dist/ there, not into the
 * checkout that other runs share.
 */
function copyOfCheckout(): string {
  const source = join(dir, "source");
  for (const f of ["package.json", "package-lock.json", "README.md", "tsconfig.json", "tsconfig.build.json", "src", "actors", "app", "native", "bin", "scripts", "topologies"])
    cpSync(join(root, f), join(source, f), { recursive: true, filter: (from) => from !== join(root, "native", "build") });
  symlinkSync(join(root, "node_modules"), join(source, "node_modules"));
  return source;
}

/** Seconds each step took, printed once at the end. */
const took: Record<string, number> = {};
function timed<T>(step: string, f: () => T): T {
  const t0 = performance.now();
  try {
    return f();
  } finally {
    took[step] = Math.round((performance.now() - t0) / 100) / 10;
  }
}
afterAll(() => console.log(`package install test, seconds: ${JSON.stringify(took)}`));

/** The plain-node program that uses the package's entry points. */
const USER_PROGRAM = `
import assert from "node:assert/strict";
import { connectBus, decode, defineActor, encode, loadTopology, OozeError } from "ooze";
import { nextMessage, startTestNats } from "ooze/testing";
import { runJobSchedule, startJobUnderTest } from "ooze/testing/job";
import { computeGae } from "ooze/algorithms";

assert.equal(typeof defineActor, "function");
assert.equal(typeof runJobSchedule, "function");
assert.equal(typeof startJobUnderTest, "function");
assert.equal(new OozeError("INTERNAL", "x").code, "INTERNAL");
const value = { n: 3, tokens: Int32Array.of(1, 2, 3), logprobs: Float32Array.of(-0.5) };
assert.deepEqual(decode(encode(value)), value);
assert.equal(loadTopology("node_modules/ooze/topologies/echo.yaml").name, "echo");
const gae = computeGae([{ lossMask: Uint8Array.of(1, 1), values: Float32Array.of(0, 0), reward: 1, turnRewards: null }], { gamma: 1, lambda: 1 });
assert.deepEqual(Array.from(gae.returns[0]), [1, 1]);

const nats = await startTestNats();
const bus = await connectBus({ url: nats.authUrl });
try {
  const next = nextMessage(bus, "package.test");
  await bus.flush();
  await bus.publish("package.test", encode({ hello: "ooze" }));
  assert.deepEqual(decode((await next).data), { hello: "ooze" });
} finally {
  await bus.close();
  await nats.stop();
}
console.log(JSON.stringify({ ooze: import.meta.resolve("ooze"), testing: import.meta.resolve("ooze/testing") }));
`;

/** A user's task in TypeScript (types and all): one token per answer, reward 1 for token 55 ("7"). */
const SEVEN_TASK = `
interface Answer { token: number }
export default (_config: Record<string, unknown>) => ({
  name: "seven",
  maxTurns: 1,
  maxTurnTokens: 1,
  reset: (_index: number, _seed: number) => ({ prompt: "7?", promptIds: Int32Array.of(55, 63), state: { token: -1 } as Answer }),
  step: (_state: Answer, action: Int32Array) => ({ state: { token: action[0] ?? -1 }, observation: new Int32Array(0), done: true }),
  reward: (state: Answer): number => (state.token === 55 ? 1 : 0),
});
`;

describe("ooze as an installed package", () => {
  beforeAll(() => {
    const source = copyOfCheckout();
    const packed = join(dir, "packed");
    mkdirSync(packed);
    // the checkout's dist/ when it is what prepack would compile (scripts/test.sh built it from these
    // very sources: bin/dist-fresh.cjs) goes into the tarball as it is, without compiling it again
    const built = freshDist();
    if (built !== null) cpSync(built, join(source, "dist"), { recursive: true });
    timed("npm pack", () => ok("npm", ["pack", "--pack-destination", packed, ...(built !== null ? ["--ignore-scripts"] : [])], source));
    const tarballs = readdirSync(packed).filter((f) => f.endsWith(".tgz"));
    expect(tarballs).toHaveLength(1);
    writeProject(join(packed, tarballs[0]!));
    timed("npm ci (addon build included)", () => ok("npm", ["ci", "--offline", "--no-audit", "--no-fund"], project, { npm_config_strict_allow_scripts: "true" }));
  }, 900_000);

  it("ships compiled JavaScript with .d.ts, the addon's sources and the topologies, no TypeScript sources", () => {
    for (const f of ["dist/src/index.js", "dist/src/index.d.ts", "dist/src/testing/index.js", "dist/app/job/testing.js", "dist/app/cli/main.js", "dist/native/worker/main.js", "dist/native/index.d.ts", "dist/app/dash/page/index.html", "native/binding.gyp", "native/src/addon.cc", "topologies/echo.yaml"])
      expect(existsSync(join(installed, f)), f).toBe(true);
    expect(existsSync(join(installed, "src")), "src/ (TypeScript sources)").toBe(false);
    expect(existsSync(join(installed, "app")), "app/ (TypeScript sources)").toBe(false);
  });

  it("built the native addon on install, in node_modules/ooze/native/build/Release", () => {
    expect(existsSync(join(installed, "native", "build", "Release", "ooze_native.node"))).toBe(true);
  });

  it("imports ooze, ooze/testing, ooze/testing/job and ooze/algorithms with plain node, from dist/", () => {
    writeFileSync(join(project, "use-ooze.mjs"), USER_PROGRAM);
    const r = timed("plain node program", () => ok(process.execPath, ["use-ooze.mjs"], project));
    const resolved = JSON.parse(r.stdout.trim().split("\n").at(-1)!) as Record<string, string>;
    expect(fileURLToPath(resolved.ooze!)).toBe(join(installed, "dist", "src", "index.js"));
    expect(fileURLToPath(resolved.testing!)).toBe(join(installed, "dist", "src", "testing", "index.js"));
  });

  it("runs npx ooze --help and npx ooze check", () => {
    const help = timed("npx ooze --help", () => ok("npx", ["--no-install", "ooze", "--help"], project));
    expect(help.stdout).toMatch(/Usage: ooze/);
    for (const command of ["serve", "check", "up", "train", "sft"]) expect(help.stdout).toMatch(new RegExp(`^\\s+${command}\\b`, "m"));
    const check = ok("npx", ["--no-install", "ooze", "check", "node_modules/ooze/topologies/echo.yaml"], project);
    expect(check.stdout).toContain("topology 'echo' is valid");
  });

  it("trains on a topology whose task is the user's TypeScript module (embedded engine and trainer worker from the package)", () => {
    writeFileSync(join(project, "seven-task.ts"), SEVEN_TASK);
    const quickstart = readFileSync(join(installed, "topologies", "quickstart.yaml"), "utf8");
    expect(quickstart).toMatch(/^  task: addition$/m);
    writeFileSync(join(project, "seven.yaml"), quickstart.replace(/^  task: addition$/m, "  task: ./seven-task.ts"));
    const r = timed("npx ooze train (2 steps)", () => ok("npx", ["--no-install", "ooze", "train", "seven.yaml", "--out", "run", "--steps", "2", "--quiet"], project));
    expect(r.stdout).toMatch(/ooze train: 2 steps/);
    expect(readFileSync(join(project, "run", "metrics.jsonl"), "utf8").trim().split("\n")).toHaveLength(2);
  });
});

describe("scripts/build-native.mjs", () => {
  // A copy in a directory with no addon, so it would build; it must stop before node-gyp.
  const copy = join(dir, "no-compiler");
  mkdirSync(join(copy, "scripts"), { recursive: true });
  copyFileSync(join(root, "scripts", "build-native.mjs"), join(copy, "scripts", "build-native.mjs"));
  const script = join(copy, "scripts", "build-native.mjs");

  it("fails with one message naming the compiler and how to install it when CXX is not there", () => {
    const r = run(process.execPath, [script], copy, { CXX: "/nonexistent/g++" });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("cannot build the native addon: missing the C++ compiler CXX=/nonexistent/g++");
    expect(r.stderr).toContain("sudo apt-get install g++ make python3");
    expect(r.stderr).not.toMatch(/gyp/i);
  });

  it("names every tool missing from PATH (a compiler, make, python3)", () => {
    const empty = join(dir, "empty-path");
    mkdirSync(empty);
    const env = userEnv({ PATH: empty });
    for (const chosen of ["CXX", "MAKE", "PYTHON", "npm_config_python"]) delete env[chosen];
    const r = spawnSync(process.execPath, [script], { cwd: copy, env, encoding: "utf8" });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("missing a C++ compiler (g++, or set CXX), make, python3.");
  });
});
