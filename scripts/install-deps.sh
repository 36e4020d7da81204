#!/usr/bin/env bash
# Installs every build and test dependency of kvcache from Debian 12's archive.
# Idempotent: packages already present are skipped, so the README commands can run it
# every time. With --programs, only what building and running the programs needs
# (scripts/demo.sh). Needs root (or sudo) only when something is missing.
set -euo pipefail

# What configuring the build and building the programs need (the demo's first run).
programs=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # service and storage (gRPC, Protobuf, RocksDB, io_uring, hashing)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev liburing-dev libxxhash-dev libabsl-dev
  # kvbench quality reads the corpus's gzipped man pages
  zlib1g-dev
  # config parsing, metrics, CPU engine math; gtest/hiredis: the configure step looks for them
  nlohmann-json3-dev libcli11-dev prometheus-cpp-dev libopenblas-dev libgtest-dev libgmock-dev
  libhiredis-dev
  # cluster mode (cluster/): the .proto files of etcd's v3 API, compiled into kvcached
  golang-etcd-server-dev python3
)
# What the tests, benchmarks, training and tools need beside those.
rest=(
  clang-format
  # benchmark peers
  fio redis-server
  # benchmark plots (PNG)
  gnuplot-nox
  # the Python client (python/): its stubs, runtime and tests
  python3-grpcio python3-protobuf python3-numpy python3-xxhash python3-pytest python3-pip python3-venv
  # its etcd access (a cluster's membership): etcd's gRPC API
  python3-etcd3
  # its type check (mypy over python/kvcache, a test)
  python3-mypy
  # capacity plots (scripts/plot_capacity.py)
  python3-matplotlib
  # training and the quality model (train/): PyTorch, CPU
  python3-torch
  # its corpus's packages beyond the toolchain's (train/corpus-v2.json): shell, man pages
  bash-completion manpages manpages-dev
  # fuzzing (scripts/fuzz.sh): clang with libFuzzer and the sanitizer runtimes
  clang-14 libclang-rt-14-dev
  # cluster mode's tests: etcd itself
  etcd-server
  # a single-host Ceph cluster (scripts/ceph-up.sh) and librados, for the RADOS tier's tests
  ceph-mon ceph-osd ceph-common librados-dev libradospp-dev
  # tests: a throwaway TLS certificate
  openssl
)
# --programs: only what the programs need (scripts/demo.sh), and with --etcd etcd itself
# (the cluster demo); default: everything.
packages=("${programs[@]}")
if [ "${1:-}" != "--programs" ]; then
  packages+=("${rest[@]}")
elif [ "${2:-}" = "--etcd" ]; then
  packages+=(etcd-server)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
