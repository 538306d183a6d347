// Loads the native addon. Tries each build path, collects every failure, and throws one
// NativeAddonMissingError naming the paths, the loader's messages and the fix.
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { NativeAddonMissingError } from "../src/errors.ts";
import { packageRoot } from "../src/package-root.ts";
import type { NativeAddon } from "./index.d.ts";

const require = createRequire(import.meta.url);

/**
 * Candidate paths, most specific first. OOZE_NATIVE_PATH overrides. The build lies in the package's
 * native/build (node-gyp's output, in the checkout and in an installed package alike), not beside
 * this file, which an installed package runs from dist/native/.
 */
export function addonCandidates(): string[] {
  const env = process.env.OOZE_NATIVE_PATH;
  const build = join(packageRoot(), "native", "build");
  return [
    ...(env ? [env] : []),
    join(build, "Release", "ooze_native.node"),
    join(build, "Debug", "ooze_native.node"),
  ];
}

let cached: NativeAddon | null = null;

/** Returns the loaded addon, loading it on first use. */
export function loadNative(): NativeAddon {
  if (cached) return cached;
  // libgomp reads its settings when the addon (which links it) is loaded. Spinning OpenMP threads
  // steal the cores from the other processes of a job (engines, trainer, actors) on a small machine,
  // so idle threads sleep unless the user chose otherwise.
  process.env.OMP_WAIT_POLICY ??= "PASSIVE";
  const failures: string[] = [];
  for (const path of addonCandidates()) {
    if (!existsSync(path)) {
      failures.push(`${path}: not found`);
      continue;
    }
    try {
      cached = require(path) as NativeAddon;
      return cached;
    } catch (e) {
      failures.push(`${path}: ${(e as Error).message}`);
    }
  }
  throw new NativeAddonMissingError(
    `the ooze native addon could not be loaded:\n  ${failures.join("\n  ")}\n` +
      `Build it with: npm run build:native in a checkout, or npm rebuild ooze where ooze is installed (needs g++, make and python3)`,
  );
}
