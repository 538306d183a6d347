// The layers' import direction (test/harness/layers.ts): ooze's own tree has no wrong-way arrow and
// no import cycle, and the check finds each kind of violation planted in a small tree of its own.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { cycles, importEdges, layerViolations } from "../harness/layers.ts";

const ROOT = resolve(import.meta.dirname, "../..");

describe("layers: app → actors → native → src", () => {
  it("ooze's tree has no wrong-way import and no cycle", () => {
    expect(importEdges(ROOT).length).toBeGreaterThan(500); // the check reads the real tree
    expect(layerViolations(ROOT)).toEqual([]);
  });

  const tree = mkdtempSync(join(tmpdir(), "ooze-layers-"));
  afterAll(() => rmSync(tree, { recursive: true, force: true }));
  const plant = (files: Record<string, string>) => {
    for (const [p, text] of Object.entries(files)) {
      mkdirSync(dirname(join(tree, p)), { recursive: true });
      writeFileSync(join(tree, p), text);
    }
  };

  it("finds each planted violation: wrong-way arrows (static, dynamic, type-only), app imported by a non-root, protocol importing a role, self-import by name, cycles", () => {
    plant({
      "src/ok.ts": `import { x } from "./base.ts";\nexport const y = x;\n`,
      "src/base.ts": `export const x = 1;\n`,
      "src/up.ts": `import { a } from "../actors/rollout/r.ts";\nexport const u = a;\n`,
      "src/lazy.ts": `export const m = () => import("../app/cli/main.ts");\n`,
      "src/typed.ts": `import type { N } from "../native/n.ts";\nexport type T = N;\n`,
      "src/named.ts": `export { x } from "ooze/testing";\n`,
      "src/c1.ts": `import { c2 } from "./c2.ts";\nexport const c1 = () => c2;\n`,
      "src/c2.ts": `import { c1 } from "./c1.ts";\nexport const c2 = () => c1;\n`,
      "native/n.ts": `import { p } from "../actors/protocol/p.ts";\nexport type N = typeof p;\n`,
      "native/bench-use.ts": `import "../bench/b.ts";\n`,
      "actors/protocol/p.ts": `import { a } from "../rollout/r.ts";\nexport const p = a;\n`,
      "actors/rollout/r.ts": `import { b } from "../buffer/b.ts";\nexport const a = b;\n`,
      "actors/buffer/b.ts": `export { a as b } from "../rollout/r.ts";\n`,
      "actors/trainer/t.ts": `import { s } from "../../src/base.ts";\nimport "../../native/n.ts";\nimport "../protocol/p.ts";\nexport const t = s;\n`,
      "app/cli/main.ts": `import "../../actors/trainer/t.ts";\n`,
      "bench/b.ts": `import "../app/cli/main.ts";\n`,
      "examples/e.ts": `import "../app/cli/main.ts";\n`,
    });
    const v = layerViolations(tree);
    const has = (re: RegExp) => expect(v.filter((l) => re.test(l)), `${re} in:\n${v.join("\n")}`).toHaveLength(1);
    has(/^src\/up\.ts → actors\/rollout\/r\.ts: src\/ must not import actors\//);
    has(/^src\/lazy\.ts → app\/cli\/main\.ts: src\/ must not import app\//);
    has(/^src\/typed\.ts → native\/n\.ts: src\/ must not import native\//);
    has(/^src\/named\.ts imports 'ooze\/testing' by package name/);
    has(/^native\/n\.ts → actors\/protocol\/p\.ts: native\/ must not import actors\//);
    has(/^native\/bench-use\.ts → bench\/b\.ts: native\/ must not import bench\//);
    has(/^actors\/protocol\/p\.ts → actors\/rollout\/r\.ts: actors\/protocol\/ .* must not import a role/);
    has(/^examples\/e\.ts → app\/cli\/main\.ts: app\/ .* imported only by bin\/, bench\/ and test\//);
    has(/^import cycle between modules: src\/c1\.ts ↔ src\/c2\.ts$/);
    has(/^import cycle between modules: actors\/buffer\/b\.ts ↔ actors\/rollout\/r\.ts$/);
    has(/^import cycle between actor folders: actors\/buffer\/ ↔ actors\/rollout\/$/);
    expect(v).toHaveLength(11); // nothing else: the downward arrows (trainer, app/cli, bench) pass
  });

  it("cycles: a chain has none; a loop and a self-loop are one each", () => {
    expect(cycles([["a", "b"], ["b", "c"]])).toEqual([]);
    expect(cycles([["a", "b"], ["b", "c"], ["c", "a"], ["d", "d"], ["c", "e"]])).toEqual([["a", "b", "c"], ["d"]]);
  });
});
