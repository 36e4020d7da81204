// Store settings shared by the crash test and the child process it kills.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>

#include "storage/chunk_store.h"
#include "storage/slot_format.h"

namespace kvc::testing {

inline constexpr uint64_t kCrashChunkBytes = 8000;
inline constexpr storage::NamespaceId kCrashNamespace = 3;
inline constexpr uint64_t kCrashMaxPerRound = 2000;

// Rounds of the crash test: 24, or KVC_CRASH_ROUNDS (scripts/kill-loop.sh). The child
// process inherits the variable, so both size the store alike.
inline int CrashRounds() {
  const char* env = std::getenv("KVC_CRASH_ROUNDS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 24;
}

inline storage::StoreOptions CrashStoreOptions(const std::string& dir) {
  storage::StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kCrashChunkBytes;
  o.ram_bytes = 64 * 8192;
  // Room for every chunk the child can write in all rounds (it stops at kCrashMaxPerRound
  // a round), so nothing is ever evicted and every acknowledged chunk must be there. Slabs
  // are laid out as they fill, so a long loop only uses the disk it writes.
  const uint64_t slots = std::max<uint64_t>(65536, CrashRounds() * (kCrashMaxPerRound + 64));
  o.ssd_bytes = (slots + 1023) / 1024 * 1024 * storage::SlotBytesFor(kCrashChunkBytes);
  o.slab_bytes = 1024 * storage::SlotBytesFor(kCrashChunkBytes);
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;
}

}  // namespace kvc::testing
