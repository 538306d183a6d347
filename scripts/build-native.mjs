// Builds the native addon (native/ → native/build/Release/ooze_native.node) with node-gyp, only when
// it is missing or older than native/src or native/binding.gyp (--force: always). It is the package's
// install script, so `npm install` builds it, in the checkout and where ooze is installed as a
// dependency, and scripts/setup.sh runs it. Before building it checks for what node-gyp needs — a C++
// compiler, make and python3 — and when one is missing exits 1 with one message naming them and how
// to install them, instead of node-gyp's long log.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, isAbsolute, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const native = join(root, "native");
const addon = join(native, "build", "Release", "ooze_native.node");
const log = (line) => process.stderr.write(`[ooze native] ${line}\n`);

if (!process.argv.includes("--force") && upToDate()) process.exit(0);

const missing = missingTools();
if (missing.length > 0) {
  log(
    `cannot build the native addon: missing ${missing.join(", ")}.\n` +
      `  Install them (Debian/Ubuntu: sudo apt-get install g++ make python3; Fedora: sudo dnf install gcc-c++ make python3),\n` +
      `  then build again: npm rebuild ooze where ooze is installed, npm run build:native in a checkout.`,
  );
  process.exit(1);
}

const gyp = nodeGyp();
log("building the native addon (native/)");
const r = spawnSync(process.execPath, [gyp, "rebuild", "--directory", native, "-j", "max"], { cwd: root, stdio: "inherit" });
if (r.status !== 0) {
  log(`node-gyp failed (${r.error?.message ?? (r.signal ? `signal ${r.signal}` : `exit code ${r.status}`)}); its log is above`);
  process.exit(1);
}

/** True when the addon exists and nothing in native/src or native/binding.gyp is newer. */
function upToDate() {
  if (!existsSync(addon)) return false;
  const built = statSync(addon).mtimeMs;
  const newer = (path) => {
    const s = statSync(path);
    if (s.isDirectory()) return readdirSync(path).some((f) => newer(join(path, f)));
    return s.mtimeMs > built;
  };
  return !newer(join(native, "src")) && !newer(join(native, "binding.gyp"));
}

/** What node-gyp needs and this machine lacks, as names for the message. */
function missingTools() {
  const missing = [];
  // node-gyp's Makefile compiles and links with $(CXX), which is g++ unless CXX says otherwise
  const cxx = process.env.CXX?.trim().split(/\s+/)[0];
  if (!found(cxx || "g++")) missing.push(cxx ? `the C++ compiler CXX=${cxx}` : "a C++ compiler (g++, or set CXX)");
  const make = process.env.MAKE?.trim() || "make";
  if (!found(make)) missing.push(make === "make" ? "make" : `MAKE=${make}`);
  const python = process.env.npm_config_python || process.env.PYTHON;
  if (python ? !found(python) : !["python3", "python"].some(found)) missing.push(python ? `python (${python})` : "python3");
  return missing;
}

/** True when `command` is an executable path, or a name found on PATH. */
function found(command) {
  if (command.includes("/")) return executable(isAbsolute(command) ? command : join(process.cwd(), command));
  return (process.env.PATH ?? "").split(delimiter).some((dir) => dir !== "" && executable(join(dir, command)));
}

function executable(path) {
  try {
    const s = statSync(path);
    return s.isFile() && (s.mode & 0o111) !== 0;
  } catch {
    return false;
  }
}

/** node-gyp's script: npm's own in an npm script (npm_config_node_gyp), else the checkout's devDependency. */
function nodeGyp() {
  const fromNpm = process.env.npm_config_node_gyp;
  if (fromNpm && existsSync(fromNpm)) return fromNpm;
  try {
    return createRequire(import.meta.url).resolve("node-gyp/bin/node-gyp.js");
  } catch {
    log("node-gyp not found: run this through npm (npm rebuild ooze), or npm install node-gyp");
    process.exit(1);
  }
}
