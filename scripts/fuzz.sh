#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc, with ASan and UBSan, clang 14 from
# Debian) into build-fuzz/ and runs each over a copy of its seed corpus for a bounded
# number of executions. Any crash, sanitizer report or failed check fails the script and
# leaves the input that caused it in build-fuzz/findings/<target>/.
#   scripts/fuzz.sh [--runs N] [--seconds S]    (default 20000 runs per target)
# The service target (every gRPC method, in process) compiles the service's sources with
# the fuzzer's instrumentation and links the rest from build/ (scripts/build.sh first); it
# runs a tenth of the runs: each is a whole gRPC call on a real store.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=20000
seconds=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --seconds) seconds="$2"; runs=-1; shift 2 ;;
    *) echo "usage: scripts/fuzz.sh [--runs N] [--seconds S]" >&2; exit 2 ;;
  esac
done
cxx=clang++-14
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx missing (scripts/install-deps.sh installs clang-14)" >&2; exit 1; }
absl=$(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
spec=(engine/spec/model_config.cc engine/spec/layer_schedule.cc engine/spec/kv_codec.cc
      engine/spec/chunk_layout.cc)
declare -A sources=(
  [model_config]="${spec[*]}"
  [slot]="storage/slot_format.cc storage/payload.cc storage/xxh3.cc"
  [reservation]="storage/slot_reservation.cc"
  [trace]="bench/trace/trace.cc"
  [shm_handshake]="cachesvc/arena_socket.cc cachesvc/auth.cc wire/arena_handshake.cc"
  [service]="cachesvc/service.cc cachesvc/service_impl.cc cachesvc/lookup.cc
             cachesvc/fetch_reactor.cc cachesvc/store_reactor.cc cachesvc/namespace_registry.cc
             cachesvc/lease_table.cc cachesvc/quota_groups.cc cachesvc/tenant_counters.cc
             cachesvc/log.cc cachesvc/tenant_limits.cc cachesvc/tenant_quotas.cc
             cachesvc/shm_access.cc cachesvc/metrics.cc cachesvc/tombstones.cc cachesvc/cost_pacer.cc wire/wire.cc
             wire/arena_handshake.cc"
)
built=(build/client/libkvc_prefix_hash.a build/cachesvc/libkvc_arena_socket.a
       build/storage/libkvc_storage.a build/engine/libkvc_spec.a build/proto/libkvc_proto.a)
declare -A libs=([model_config]="" [slot]="build-fuzz/xxh3_avx2.o build-fuzz/xxh3_avx512.o -lxxhash" [reservation]="-lxxhash" [trace]=""
                 [shm_handshake]=""
                 [service]="-Ibuild/proto/gen -Ibuild/cachesvc/gen ${built[*]} $(pkg-config --libs grpc++ protobuf liburing libxxhash) -lrocksdb -lprometheus-cpp-pull -lprometheus-cpp-core")
targets=(model_config slot reservation trace shm_handshake service)
for b in "${built[@]}"; do
  [ -f "$b" ] || { echo "fuzz: $b missing (run scripts/build.sh first)" >&2; exit 1; }
done
mkdir -p build-fuzz
# The payload checksum's vector builds: each file compiled for its own unit (storage/xxh3.h).
for isa in avx2 avx512; do
  obj="build-fuzz/xxh3_$isa.o"
  if [ ! -f "$obj" ] || [ -n "$(find storage/xxh3_$isa.cc storage/xxh3_build.inc storage/xxh3.h -newer "$obj" -print -quit)" ]; then
    "$cxx" "${flags[@]}" -m"${isa/avx512/avx512f}" -c -o "$obj" "storage/xxh3_$isa.cc"
  fi
done
for t in "${targets[@]}"; do
  bin="build-fuzz/${t}_fuzz"
  # Rebuild when any source is newer than the binary.
  if [ ! -x "$bin" ] || [ -n "$(find tests/fuzz/${t}_fuzz.cc ${sources[$t]} engine/spec storage/slot_format.h storage/slot_reservation.h bench/trace cachesvc/*.h "${built[@]}" -newer "$bin" -print -quit)" ]; then
    echo "fuzz: building $t"
    # shellcheck disable=SC2086
    "$cxx" "${flags[@]}" -o "$bin" "tests/fuzz/${t}_fuzz.cc" ${sources[$t]} ${libs[$t]} $absl
  fi
done
for t in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  rm -rf "$corpus" "$findings" && mkdir -p "$corpus" "$findings"
  cp tests/fuzz/corpus/$t/* "$corpus/"
  args=(-max_len=65536 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1)
  # The service keeps a server, a store and gRPC's caches alive across inputs, so nearly
  # every input looks like a leak to libFuzzer's per-input check, which then runs a whole
  # LeakSanitizer scan: two thirds of the target's time (perf). Off for this target only.
  if [ "$t" = service ]; then
    args+=(-detect_leaks=0)
  fi
  if [ "$runs" -ge 0 ]; then
    args+=(-runs="$([ "$t" = service ] && echo $((runs / 10)) || echo "$runs")")
  else
    args+=(-max_total_time="$seconds")
  fi
  echo "fuzz: $t"
  "build-fuzz/${t}_fuzz" "${args[@]}" "$corpus" 2>&1 | grep -E "^stat::number_of_executed_units|^stat::peak_rss|ERROR|SUMMARY|KVC_CHECK|^Done" || true
  # libFuzzer exits non-zero on a finding; grep above hides that, so look for artifacts.
  if compgen -G "$findings/*" >/dev/null; then
    echo "fuzz: $t found a failing input: $(ls "$findings")" >&2
    exit 1
  fi
done
echo "fuzz: no crash in any target"
