#!/usr/bin/env bash
# The GPU check: builds with the CUDA backend required, runs the kernel parity suite
# (every kernel against its CPU twin) and prints one short table. For a machine with an
# NVIDIA GPU (sm_90 code + PTX); elsewhere the suite skips and this says so.
# Usage: scripts/gpu-check.sh [build-dir]   (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-gpu}"
jobs=$(nproc 2>/dev/null || echo 2)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "gpu-check: nvidia-smi not found"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_CUDA=ON >/dev/null
cmake --build "$dir" -j "$jobs" --target kv_dequant_test kv_ops_test >/dev/null
log="$dir/gpu-check.log"
ctest --test-dir "$dir" -R 'Cuda' --output-on-failure >"$log" 2>&1 || true
printf '%-75s %s\n' "test" "result"
grep -E 'Test +#[0-9]+: ' "$log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) \.+\**(.*)/\1 \2/' |
  awk '{ name=$1; $1=""; sub(/^ +/, ""); printf "%-75s %s\n", name, $0 }'
grep -E 'tests passed|tests failed' "$log" || true
if grep -q 'Skipped' "$log"; then echo "gpu-check: some tests skipped (no usable CUDA device?); see $log"; fi
