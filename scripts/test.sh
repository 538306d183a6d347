#!/usr/bin/env bash
# The test command (`npm test`): set-up on a fresh machine, then the whole vitest suite, ending with
# one plain summary line "N passed, N failed, N skipped". Extra arguments go to vitest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# Two steps side by side (each keeps about one core busy the first time):
# - the PyTorch trainer worker's tests need its Python environment (python/.venv, pip from the
#   machine's configured index; about 40 s the first time, a stamp check afterwards);
# - dist/, the compiled JavaScript, when missing or built from other sources than the checkout's: the
#   processes the tests start (about 235 commands, engines and nodes, and the trainer workers) run it
#   with plain node, a second sooner each than the sources under tsx (bin/dist-fresh.cjs). About 30
#   s; skipped when up to date. (`npm run ooze` does not build: a job starts a few processes, not
#   hundreds.)
node bin/ooze.mjs setup torch &
torch=$!
node scripts/build.mjs --if-stale >&2
built=$?
wait "$torch"
[ $? -eq 0 ] && [ "$built" -eq 0 ] || exit 1
report=$(mktemp -t ooze-vitest-XXXXXX.json)
npx --no-install vitest run --reporter=default --reporter=json --outputFile="$report" "$@"
rc=$?
node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(`tests: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`);
' "$report" 2>/dev/null || echo "tests: no report (vitest exited with $rc)"
rm -f "$report"
exit $rc
