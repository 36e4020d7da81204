#!/usr/bin/env bash
# The GPU check on a machine with the project's build dependencies and an NVIDIA GPU:
# builds with the CUDA backend required, then scripts/gpu-run.sh runs the parity suite
# (every kernel and the CUDA engine against the CPU), kvgen on both backends, and
# `kvbench kernels`, and prints one short table. Where the GPU machine lacks the build
# dependencies, make an archive with scripts/gpu-bundle.sh and run its run.sh there.
# Usage: scripts/gpu-check.sh [build-dir] [out-dir]   (default build-gpu, build-gpu/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-gpu}"
out="${2:-$dir/gpu-check}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_CUDA=ON >/dev/null
cmake --build "$dir" -j "$(nproc 2>/dev/null || echo 2)" --target kv_dequant_test kv_ops_test \
  row_ops_test page_mirror_test device_matmul_test cuda_engine_test cuda_programs_test hbm_ipc_test kvgen kvmodel kvbench kvcached kvdemo >/dev/null
exec scripts/gpu-run.sh "$dir/bin" "$dir/tests" configs "$out"
