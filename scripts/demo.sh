#!/usr/bin/env bash
# The main job on its embedded default: install what it needs, build it, and run kvdemo — a
# coding-agent session on the mini model resumed from kvcached every turn, with kvcached
# restarted mid-session so a turn resumes from SSD; prints TTFT warm vs cold per turn.
# Arguments go to kvdemo (e.g. --json, --replay exact, --turns 8).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo needs: the programs' packages, and the two programs it runs (the
# tests, benchmarks and training come with scripts/test.sh).
deps=(--programs)
for a in "$@"; do
  case "$a" in --nodes*) deps+=(--etcd) ;; esac  # a cluster's membership lives in etcd
done
scripts/install-deps.sh "${deps[@]}"
scripts/build.sh --target=kvdemo --target=kvcached >/dev/null
exec build/bin/kvdemo "$@"
