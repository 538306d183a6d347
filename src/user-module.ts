// Imports a module a user names by path in a topology (an actor kind, a task), TypeScript included.
// In the checkout a TypeScript loader is already there (bin/ooze.mjs, vitest, `node --import tsx`);
// compiled, in an installed package, tsx is registered here when the first TypeScript module is
// imported, so the `ooze` command and plain-node programs start without it.
import { pathToFileURL } from "node:url";

const compiled = import.meta.url.endsWith(".js");
let tsx: Promise<void> | null = null;

/** The module at the absolute `path`, loaded through tsx when it is TypeScript and ooze runs compiled. */
export async function importUserModule(path: string): Promise<unknown> {
  if (compiled && /\.[cm]?tsx?$/.test(path)) await (tsx ??= import("tsx/esm/api").then(({ register }) => void register()));
  return import(pathToFileURL(path).href);
}
