// Opening a store in a gtest: the store with one namespace registered, or a test failure.
#pragma once

#include <functional>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/slot_format.h"

namespace kvc::testing {

// A store opened on `o` with namespace ns registered for chunk_bytes; null (and a test
// failure) if either fails.
inline std::unique_ptr<storage::ChunkStore> OpenStoreWith(const storage::StoreOptions& o,
                                                          storage::NamespaceId ns,
                                                          uint64_t chunk_bytes,
                                                          const storage::StoreSeams& seams = {}) {
  absl::StatusOr<std::unique_ptr<storage::ChunkStore>> s = storage::ChunkStore::Open(o, seams);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_EQ((*s)->CheckConsistency(), absl::OkStatus()) << "right after the open";
  EXPECT_TRUE((*s)->RegisterNamespace(ns, chunk_bytes).ok());
  return *std::move(s);
}

// A small store on `dir` for chunks of chunk_bytes: RAM pools of these many chunks (pool 0
// first; none: no RAM tier), ssd_chunks SSD slots in slabs of 16, and these namespaces
// registered. Null (and a test failure) if anything fails.
inline std::unique_ptr<storage::ChunkStore> OpenSmallStore(
    const std::string& dir, uint64_t chunk_bytes, const std::vector<uint64_t>& ram_pool_chunks,
    uint64_t ssd_chunks, const std::vector<storage::NamespaceId>& namespaces,
    const std::function<void(storage::StoreOptions&)>& adjust = {}) {
  storage::StoreOptions o;
  o.data_dir = dir;
  o.max_chunk_bytes = chunk_bytes;
  for (size_t i = 0; i < ram_pool_chunks.size(); ++i) {
    const uint64_t bytes = ram_pool_chunks[i] * storage::RamSlotBytes(chunk_bytes);
    (i == 0 ? o.ram_bytes : o.ram_pool_bytes.emplace_back()) = bytes;
  }
  o.ssd_bytes = ssd_chunks * storage::SlotBytesFor(chunk_bytes);
  o.slab_bytes = 16 * storage::SlotBytesFor(chunk_bytes);
  o.queue_depth = 8;
  o.io_lanes = 2;
  if (adjust) adjust(o);
  absl::StatusOr<std::unique_ptr<storage::ChunkStore>> s = storage::ChunkStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_EQ((*s)->CheckConsistency(), absl::OkStatus()) << "right after the open";
  for (storage::NamespaceId ns : namespaces) {
    EXPECT_TRUE((*s)->RegisterNamespace(ns, chunk_bytes).ok());
  }
  return *std::move(s);
}

}  // namespace kvc::testing
