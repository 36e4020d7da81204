// Store settings shared by the crash test and the child process it kills.
#pragma once

#include <string>

#include "storage/chunk_store.h"
#include "storage/slot_format.h"

namespace kvc::testing {

inline constexpr uint64_t kCrashChunkBytes = 8000;
inline constexpr storage::NamespaceId kCrashNamespace = 3;
inline constexpr uint64_t kCrashMaxPerRound = 2000;

inline storage::StoreOptions CrashStoreOptions(const std::string& dir) {
  storage::StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = kCrashChunkBytes;
  o.ram_bytes = 64 * 8192;
  // Room for every chunk the child can write in all rounds (it stops at kCrashMaxPerRound),
  // so nothing is ever evicted and every acknowledged chunk must be there.
  o.ssd_bytes = 65536 * storage::SlotBytesFor(kCrashChunkBytes);
  o.slab_bytes = 1024 * storage::SlotBytesFor(kCrashChunkBytes);
  o.queue_depth = 8;
  o.io_lanes = 2;
  return o;
}

}  // namespace kvc::testing
