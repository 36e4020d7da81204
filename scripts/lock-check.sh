#!/usr/bin/env bash
# Checks the lock annotations (base/mutex.h: ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED)
# with clang's thread-safety analysis: every storage source is compiled (syntax only, no
# objects) with -Wthread-safety as an error, so a field read or written without the mutex
# that guards it, or a function that needs the lock called without it, fails this script.
# GCC, which builds everything else, ignores the annotations.
#   scripts/lock-check.sh [FILE.cc ...]    (default: every source of storage/, cachesvc/,
#   client/, cluster/ and serve/ — every mutex there is annotated, base/task_pool.h's too
#   (the mains in programs/ hold none) — the header-only executor.h and delayed_start.h through their
#   tests, the engine's thread pool, and the CUDA backends (kernels/, backends/select.cc,
#   compiled as with the CUDA toolkit: their host code holds the locks). They include
#   generated protobuf headers, so this runs after a build)
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=clang++-14
cuda=/usr/local/cuda
cuda_flags=()  # with the toolkit: the CUDA code paths too (#if KVC_WITH_CUDA)
[ -f "$cuda/include/cuda_runtime_api.h" ] && cuda_flags=(-I"$cuda/include" -DKVC_WITH_CUDA=1)
command -v "$cxx" >/dev/null || { echo "lock-check: $cxx missing (scripts/install-deps.sh installs clang-14)" >&2; exit 1; }
if [ $# -gt 0 ]; then
  files=("$@")
else
  files=(tests/cachesvc/executor_test.cc tests/cachesvc/cost_pacer_test.cc)
  for f in storage/*.cc; do
    # rados_tier.cc holds no lock, and Ceph 16's buffer.h is not C++20 under clang
    # (an operator== its reversed candidate makes ambiguous).
    [ "$f" = storage/rados_tier.cc ] || files+=("$f")
  done
  files+=(cachesvc/*.cc client/*.cc cluster/*.cc serve/*.cc)
  files+=(engine/cpu/thread_pool.cc)
  if [ ${#cuda_flags[@]} -gt 0 ]; then
    files+=(backends/select.cc kernels/*.cc)
  else
    echo "lock-check: no CUDA toolkit at $cuda: the CUDA backends' locks are not checked" >&2
  fi
fi
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc 2>/dev/null || echo 2)" -I{} \
    "$cxx" -std=c++20 -fsyntax-only -I. -Ibuild/proto/gen -Ibuild/cluster/gen "${cuda_flags[@]}" -Wthread-safety -Wthread-safety-beta \
    -Werror=thread-safety -Werror=thread-safety-beta {}
echo "lock-check: ${#files[@]} files, thread-safety analysis clean"
