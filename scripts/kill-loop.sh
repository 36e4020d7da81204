#!/usr/bin/env bash
# The SIGKILL loop at length: a child process storing durable chunks is killed at random
# moments ROUNDS times (default 200) on one store, reopened after each kill, and every
# acknowledged chunk is read back byte for byte (tests/storage/crash_test.cc; CI runs 24
# rounds of it). Prints the test's summary line: rounds, acknowledged chunks verified, and
# any loss. Usage: scripts/kill-loop.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
KVC_CRASH_ROUNDS="${1:-200}" build/tests/crash_test --gtest_brief=1 2>&1 | grep -E "crash:|seed|FAILED|PASSED"
