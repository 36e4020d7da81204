// Opening a store in a gtest: the store with one namespace registered, or a test failure.
#pragma once

#include <memory>

#include "gtest/gtest.h"
#include "storage/chunk_store.h"

namespace kvc::testing {

// A store opened on `o` with namespace ns registered for chunk_bytes; null (and a test
// failure) if either fails.
inline std::unique_ptr<storage::ChunkStore> OpenStoreWith(const storage::StoreOptions& o,
                                                          storage::NamespaceId ns,
                                                          uint64_t chunk_bytes) {
  absl::StatusOr<std::unique_ptr<storage::ChunkStore>> s = storage::ChunkStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*s)->RegisterNamespace(ns, chunk_bytes).ok());
  return *std::move(s);
}

}  // namespace kvc::testing
