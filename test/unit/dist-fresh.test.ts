// bin/dist-fresh.cjs: the checkout's dist/ counts as fresh only while the compiled sources and the
// compiler's settings are exactly those it was built from — an edited, added or removed file, or a
// checkout without a build, sends processes back to the TypeScript sources.
import { mkdirSync, mkdtempSync, rmSync, unlinkSync, utimesSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const { STAMP, distIsFresh, sourcesFingerprint } = createRequire(import.meta.url)("../../bin/dist-fresh.cjs") as {
  STAMP: string;
  distIsFresh: (root: string) => boolean;
  sourcesFingerprint: (root: string) => string;
};

const root = mkdtempSync(join(tmpdir(), "ooze-dist-fresh-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function write(path: string, text: string): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), text);
}

/** What `npm run build` does last: records the sources' fingerprint beside dist/. */
const build = () => write(STAMP, `${sourcesFingerprint(root)}\n`);

describe("bin/dist-fresh.cjs", () => {
  for (const f of ["app/cli/main.ts", "src/a.ts", "actors/b.ts", "native/worker/main.ts", "native/engine.ts", "tsconfig.json", "package.json"]) write(f, `// ${f}\n`);

  it("a checkout without a build is not fresh; after one it is", () => {
    expect(distIsFresh(root)).toBe(false);
    build();
    expect(distIsFresh(root)).toBe(true);
  });

  it("an edited source (its size or its mtime), an added one or a removed one makes it stale", () => {
    build();
    write("src/a.ts", "// src/a.ts, edited\n");
    expect(distIsFresh(root)).toBe(false);

    build();
    const later = new Date(Date.now() + 5_000);
    utimesSync(join(root, "actors/b.ts"), later, later); // same size, touched
    expect(distIsFresh(root)).toBe(false);

    build();
    write("native/worker/new.ts", "// new\n");
    expect(distIsFresh(root)).toBe(false);

    build();
    unlinkSync(join(root, "native/worker/new.ts"));
    expect(distIsFresh(root)).toBe(false);

    build();
    write("tsconfig.json", "{ }\n"); // the compiler's settings count too
    expect(distIsFresh(root)).toBe(false);
  });

  it("files outside the compiled folders do not count", () => {
    build();
    write("native/src/addon.cc", "// C++: the addon's own build\n");
    write("test/x.test.ts", "// tests are not compiled\n");
    write("native/notes.md", "not TypeScript\n");
    expect(distIsFresh(root)).toBe(true);
  });

  it("an installed package (no TypeScript sources) is never 'fresh': it runs dist/ anyway", () => {
    build();
    unlinkSync(join(root, "app/cli/main.ts"));
    build();
    expect(distIsFresh(root)).toBe(false);
  });
});
