#!/usr/bin/env bash
# Install dependencies, build everything, and run every test (CUDA tests skip without a GPU;
# their _emu builds run the kernels on the CPU emulation of CUDA), then the kernels' race
# check (scripts/race-check.sh: the emulated kernel tests under ThreadSanitizer), the whole
# suite again under ASan + UBSan (scripts/asan-check.sh), and a bounded run of every fuzz
# target (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j "$jobs"
scripts/race-check.sh
scripts/asan-check.sh
scripts/fuzz.sh --runs 20000
