#!/usr/bin/env bash
# Runs many fault schedules across the fault kinds to find real bugs (issue 13): the fleet-level
# property (engine faults and NATS-free cuts in front of real engines), the durable-mailbox and
# ask/cut properties, and `ooze fuzz` on small training jobs in sync and fully_async mode (trainer
# worker SIGKILL/SIGSTOP, nats-server restarts, cuts of the job's NATS link, engine faults, actor
# crashes). Every property appends what it ran to a schedule log; the total is printed at the end
# and no run stops the others. Niced: the machine is shared.
# The job process itself (SIGKILL/SIGTERM/SIGINT/SIGSTOP of `ooze train`, resumed with --resume)
# and a job on a 3-server NATS cluster (one server restarted, actor crashes) run as properties too.
# A property stops at its first failure (fast-check then shrinks it), so a failing one runs fewer.
#   scripts/fuzz-many.sh [OUT_DIR]
#   env: FLEET_RUNS=600 DURABLE_RUNS=100 ASK_RUNS=150 PROCESS_RUNS=20 CLUSTER_RUNS=6 JOB_RUNS=100 JOB_BATCH=20
#        (per mode) JOB_DEADLINE_MS=60000; a count of 0 skips that part
set -u
cd "$(dirname "$0")/.."
OUT=${1:-runs/fuzz-many}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OOZE_SCHEDULE_LOG="$OUT/schedules.jsonl"
FLEET_RUNS=${FLEET_RUNS:-600}
DURABLE_RUNS=${DURABLE_RUNS:-100}
ASK_RUNS=${ASK_RUNS:-150}
PROCESS_RUNS=${PROCESS_RUNS:-20}
CLUSTER_RUNS=${CLUSTER_RUNS:-6}
JOB_RUNS=${JOB_RUNS:-100}    # per mode
JOB_DEADLINE_MS=${JOB_DEADLINE_MS:-60000}
JOB_BATCH=${JOB_BATCH:-20}   # schedules per `ooze fuzz` call (each call draws from its own seed)
N="nice -n 10"

prop() { # FILE RUNS
  [ "$2" -gt 0 ] || return 0
  echo "== $1 × $2" | tee -a "$OUT/log.txt"
  OOZE_PROPERTY_RUNS=$2 $N npx vitest run "$1" >>"$OUT/log.txt" 2>&1 || echo "   FAILED: see $OUT/log.txt" | tee -a "$OUT/log.txt"
}

prop test/property/fleet-schedules.test.ts "$FLEET_RUNS"
prop test/property/durable-faults.test.ts "$DURABLE_RUNS"
prop test/property/ask-cuts.test.ts "$ASK_RUNS"
prop test/property/job-process-schedules.test.ts "$PROCESS_RUNS"
prop test/property/cluster-schedules.test.ts "$CLUSTER_RUNS"

for mode in sync fully_async; do
  topo="$OUT/$mode.yaml"
  cat >"$topo" <<YAML
name: fuzz-many-$mode
actors: [{ name: trainer, kind: train.trainer }]
engines: { count: 1, maxRunning: 32, cacheTokens: 4096 }
train: { mode: $mode, task: addition, taskConfig: { digits: 1 }, preset: tiny, promptsPerStep: 2, samplesPerPrompt: 4, lr: 0.003, checkpointEvery: 2 }
YAML
  done_runs=0
  while [ "$done_runs" -lt "$JOB_RUNS" ]; do
    seed=$RANDOM$RANDOM
    echo "== ooze fuzz $mode seed $seed × $JOB_BATCH" | tee -a "$OUT/log.txt"
    $N node bin/ooze.mjs fuzz "$topo" --runs "$JOB_BATCH" --seed "$seed" --steps 8 --horizon 1500 --deadline "$JOB_DEADLINE_MS" \
      --faults kill,pause,nats-restart,cut,engine,actor --shrink-runs 2 --verbose --out "$OUT/$mode-$seed" >>"$OUT/log.txt" 2>&1 \
      || echo "   VIOLATION: $OUT/$mode-$seed/report.json" | tee -a "$OUT/log.txt"
    done_runs=$((done_runs + JOB_BATCH))
  done
done

echo "== schedules run (from $OOZE_SCHEDULE_LOG):"
node -e '
const lines = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
const by = {};
for (const l of lines) { const k = l.label.replace(/ \/.*\/(sync|fully_async)\.yaml$/, " $1"); by[k] ??= { runs: 0, failed: 0 }; by[k].runs += l.runs; if (!l.ok) by[k].failed++; }
let total = 0;
for (const [k, v] of Object.entries(by)) { total += v.runs; console.log(`${String(v.runs).padStart(6)}  ${k}${v.failed ? `  (${v.failed} failing propert${v.failed > 1 ? "ies" : "y"})` : ""}`); }
console.log(`${String(total).padStart(6)}  total`);
' "$OOZE_SCHEDULE_LOG"
