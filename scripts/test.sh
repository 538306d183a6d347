#!/usr/bin/env bash
# The test command (`npm test`): set-up on a fresh machine, then the whole vitest suite, ending with
# one plain summary line "N passed, N failed, N skipped". Extra arguments go to vitest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1

test_packages() {
  local missing=()
  [ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] || missing+=(chromium)
  [ -x /usr/bin/prometheus ] || missing+=(prometheus)
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[ooze test] not installing ${missing[*]} (not root, or no apt-get): the tests that drive them are skipped" >&2
    return 0
  fi
  echo "[ooze test] installing Debian packages for the tests: ${missing[*]}" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
    || echo "[ooze test] apt-get install ${missing[*]} failed: the tests that drive them will try again, or skip" >&2
}
# Three steps side by side (the first two keep about one core busy each the first time):
# - the PyTorch trainer worker's tests need its Python environment (python/.venv, pip from the
#   machine's configured index; about 40 s the first time, a stamp check afterwards);
# - dist/, the compiled JavaScript, when missing or built from other sources than the checkout's: the
#   processes the tests start (about 235 commands, engines and nodes, and the trainer workers) run it
#   with plain node, a second sooner each than the sources under tsx (bin/dist-fresh.cjs). About 30
#   s; skipped when up to date. (`npm run ooze` does not build: a job starts a few processes, not
#   hundreds.)
# - Debian's chromium and prometheus, which two test files drive, when missing (root and apt-get
#   only; otherwise those files say why they skip). Installed here rather than by the files that use
#   them (test/harness/debian.ts), where apt-get ran in the middle of the suite: a minute of
#   unpacking beside the timed tests, and two files' installs racing for dpkg's lock.
node bin/ooze.mjs setup torch &
torch=$!
test_packages &
packages=$!
node scripts/build.mjs --if-stale >&2
built=$?
wait "$torch"
torched=$?
wait "$packages"
[ "$torched" -eq 0 ] && [ "$built" -eq 0 ] || exit 1
report=$(mktemp -t ooze-vitest-XXXXXX.json)
npx --no-install vitest run --reporter=default --reporter=json --outputFile="$report" "$@"
rc=$?
node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(`tests: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`);
' "$report" 2>/dev/null || echo "tests: no report (vitest exited with $rc)"
rm -f "$report"
exit $rc
