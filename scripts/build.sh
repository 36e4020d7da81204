#!/usr/bin/env bash
# Configures and builds kvcache into build/ (programs in build/bin, tests in build/tests).
# Arguments go to CMake's configure step (e.g. -DKVC_SANITIZE=ON or -DKVC_CUDA=OFF), except
# --target=NAME, which builds only that target (and what it needs) instead of everything.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
configure=()
targets=()
for a in "$@"; do
  case "$a" in
    --target=*) targets+=(--target "${a#--target=}") ;;
    *) configure+=("$a") ;;
  esac
done
# Line tables only (-g1): the tests' backtraces keep file:line, and the build compiles
# ~30 % faster than at RelWithDebInfo's -g (the full debug info is for a developer's gdb).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  "${configure[@]}"
cmake --build build -j "$jobs" "${targets[@]}"
