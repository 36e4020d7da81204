#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer: builds
# build-asan/ (no CUDA backend: the kernels' own tests run under the emulation in build/
# and under ThreadSanitizer in scripts/race-check.sh) and runs every test there. Any
# sanitizer report fails its test, and so this script.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# -O1 -g1: the sanitizers' usual optimization; the build compiles ~2.3x faster than at
# RelWithDebInfo's -O2 -g (kvcached_test.cc: 27 s vs 61 s) and reports keep file:line.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_SANITIZE=ON \
  -DKVC_CUDA=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 900
