#!/usr/bin/env bash
# Install dependencies, build everything, check the storage's lock annotations with clang
# (scripts/lock-check.sh), and run every test (CUDA tests skip without a GPU; their _emu
# builds run the kernels on the CPU emulation of CUDA), then the kernels' race
# check (scripts/race-check.sh: the emulated kernel tests under ThreadSanitizer), the whole
# suite again under ASan + UBSan (scripts/asan-check.sh), and a bounded run of every fuzz
# target (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long it took: CI must finish well inside 90 minutes on 2 cores.
step() {
  local start=$SECONDS
  "$@"
  echo "test.sh: '$*' took $((SECONDS - start)) s (total $SECONDS s)"
}
jobs=$(nproc 2>/dev/null || echo 2)
step scripts/install-deps.sh
step scripts/build.sh  # every target, tests included (line tables only: build.sh)
step scripts/lock-check.sh
step ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900
step scripts/race-check.sh
step scripts/asan-check.sh
step scripts/fuzz.sh --runs 20000
