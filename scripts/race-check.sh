#!/usr/bin/env bash
# The race check, under ThreadSanitizer (build-tsan/):
# - the CUDA kernels without a GPU: the kernel tests against the CPU emulation of CUDA,
#   where every CUDA thread is a TSan fiber ordered only by barriers; any data race between
#   threads of a block fails the run, naming the kernel line. The emulated CUDA engine test
#   is left out here (minutes under TSan); run it by name when kernels change:
#     build-tsan/tests/cuda_engine_test_emu
# - the concurrent storage tests: writers, readers, evictions, erases, write-behind, group
#   commits, reservations and power cuts on one store (tests/sanitizers/tsan.supp lists the
#   uninstrumented libraries whose internals TSan cannot follow).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
tests=(cudaemu_test kv_dequant_test_emu kv_ops_test_emu row_ops_test_emu page_mirror_test_emu
  chunk_store_test ram_pools_test fault_injection_test power_cut_test recovery_test quota_test
  hbm_store_test)
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_CUDA=OFF \
  -DKVC_SANITIZE_THREAD=ON >/dev/null
cmake --build build-tsan -j "$jobs" --target "${tests[@]}"
# ThreadSanitizer (GCC 12) cannot start on kernels with more address-space randomization
# than it knows ("unexpected memory mapping"); without ASLR it can. If neither works, the
# check says so and is skipped, like a GPU test without a GPU.
run=()
tsan_cannot_start() {  # true only for TSan's own start-up failure, never for a test's
  "${run[@]}" build-tsan/tests/cudaemu_test --gtest_filter=CudaEmuTest.BarriersOrderSharedMemoryAcrossThreads 2>&1 |
    grep -q "FATAL: ThreadSanitizer"
}
if tsan_cannot_start; then
  run=(setarch "$(uname -m)" -R)
  if tsan_cannot_start; then
    echo "race check skipped: ThreadSanitizer does not start on this machine, even without ASLR"
    exit 0
  fi
fi
for t in "${tests[@]}"; do
  echo "race check: $t"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/sanitizers/tsan.supp" \
    "${run[@]}" "build-tsan/tests/$t" --gtest_brief=1
done
echo "race check: no data race in the kernels or the store"
