#!/usr/bin/env bash
# One-time set-up on a fresh machine, safe to run again: npm dependencies, the native addon,
# and nats-server and bubblewrap (Debian packages) when missing. Every README command runs this first.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[ooze setup] %s\n' "$*" >&2; }

if [ ! -d node_modules ] || [ package.json -nt node_modules/.package-lock.json ]; then
  log "installing npm dependencies"
  npm install --no-audit --no-fund >&2
fi

# The native addon, when missing or older than its sources (npm install builds it too: it is the
# package's install script).
node scripts/build-native.mjs >&2

if ! command -v nats-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing nats-server (Debian package nats-server)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server) >&2
  else
    log "nats-server is not on PATH: install the Debian package 'nats-server' (sudo apt-get install nats-server),"
    log "or point ooze at a running NATS server with --nats URL / OOZE_NATS_URL."
    exit 1
  fi
fi

# bubblewrap: the sandbox agent and reward commands run in (actors/environment/agent/sandbox.ts,
# docs/sandbox.md); prlimit (util-linux) and perl (perl-base) are part of every Debian system.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing bubblewrap (Debian package bubblewrap: the agent sandbox)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >&2
  else
    log "bwrap is not on PATH: install the Debian package 'bubblewrap' (sudo apt-get install bubblewrap);"
    log "agent topologies refuse to start without it (or with train.agent.sandbox: none, unconfined)."
  fi
fi
