#!/usr/bin/env bash
# The race check, under ThreadSanitizer (build-tsan/):
# - the CUDA kernels without a GPU: the kernel tests against the CPU emulation of CUDA,
#   where every CUDA thread is a TSan fiber ordered only by barriers; any data race between
#   threads of a block fails the run, naming the kernel line; with them the matmul
#   backend's groups, MoE block and the MoE sublayer handed over between streams (5 s under
#   TSan; it also reports reads of freed memory). The emulated CUDA engine test
#   is left out here (minutes under TSan); run it by name when kernels change:
#     build-tsan/tests/cuda_engine_test_emu
# - the concurrent storage tests: writers, readers, evictions, erases, write-behind, group
#   commits, reservations and power cuts on one store (tests/sanitizers/tsan.supp lists the
#   uninstrumented libraries whose internals TSan cannot follow);
# - the service and client tests against a kvcached built with TSan too (the test starts it
#   from build-tsan/bin): 32 concurrent clients mixing calls, streams cut off, restarts.
#   A report in either process fails the check; the daemon's go to build-tsan/tsan-reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
tests=(cudaemu_test kv_dequant_test_emu kv_ops_test_emu row_ops_test_emu page_mirror_test_emu
  device_matmul_test_emu chunk_store_test ram_pools_test fault_injection_test power_cut_test recovery_test quota_test
  hbm_store_test size_classes_test client_test kvcached_test)
# -O1 -g1 as in scripts/asan-check.sh: compiles in less than half the time of -O2 -g.
# The shared tier's link (storage/shared_link.cc: a writer thread, a backlog, erases that
# overtake it) on a real Ceph cluster, where librados is installed (the test is built then).
if [ -f /usr/include/rados/librados.hpp ]; then tests+=(rados_tier_test); fi
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_CUDA=OFF \
  -DKVC_SANITIZE_THREAD=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build build-tsan -j "$jobs" --target "${tests[@]}" kvcached
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
reports=build-tsan/tsan-reports
rm -rf "$reports" && mkdir -p "$reports"
for t in "${tests[@]}"; do
  echo "race check: $t"
  options="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/sanitizers/tsan.supp"
  # Tests that start kvcached: reports land in files (the daemons' stderr is the tests' to
  # read). The others report on stderr (cudaemu_test reads a child's report there).
  case "$t" in client_test | kvcached_test) options+=" log_path=$PWD/$reports/report" ;; esac
  # librados is not instrumented: its threads' accesses (to its own buffers, and to stack
  # memory of ours they were handed during a call, reused after it) are left out, and its
  # exit handlers unlock a mutex TSan never saw locked. Our frames are still checked.
  if [ "$t" = rados_tier_test ]; then
    options+=" report_mutex_bugs=0 ignore_noninstrumented_modules=1"
  fi
  # Left out under TSan: two single-call tests whose deadlines a TSan client misses on a
  # loaded 2-core machine (a 26 MB message; a client that stops reading), with nothing
  # concurrent in them to check.
  filter="-KvcachedTest.BadInputGetsAPreciseStatusAndStoresNothing:KvcachedTest.AClientThatStopsReadingIsCutOffAtItsDeadline"
  if ! TSAN_OPTIONS="$options" "${run[@]}" "build-tsan/tests/$t" --gtest_brief=1 --gtest_filter="$filter" ||
    compgen -G "$reports/*" >/dev/null; then
    cat "$reports"/* 2>/dev/null || true
    echo "race check: $t failed" >&2
    exit 1
  fi
done
echo "race check: no data race in the kernels, the store, the service or the client"
