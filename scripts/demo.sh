#!/usr/bin/env bash
# The main job on its embedded default: install dependencies, build, and run kvdemo — a
# coding-agent session on the mini model resumed from kvcached every turn, with kvcached
# restarted mid-session so a turn resumes from SSD; prints TTFT warm vs cold per turn.
# Arguments go to kvdemo (e.g. --json, --replay exact, --turns 8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh >/dev/null
exec build/bin/kvdemo "$@"
