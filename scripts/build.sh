#!/usr/bin/env bash
# Configures and builds kvcache into build/ (programs in build/bin, tests in build/tests).
# Extra arguments go to CMake's configure step, e.g. -DKVC_SANITIZE=ON or -DKVC_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j "$jobs"
