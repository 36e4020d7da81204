// Helpers for storage tests: keys, payloads any reader can verify from the key alone, and
// store options on a temporary folder.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/chunk_key.h"
#include "base/splitmix.h"
#include "storage/chunk_store.h"

namespace kvc::testing {

// The n-th key of a stream identified by seed.
inline storage::ChunkKey KeyOf(uint64_t seed, uint64_t n) {
  uint64_t x = seed * 0x100000001B3ull + n;
  storage::ChunkKey k;
  const uint64_t a = SplitMix64(x), b = SplitMix64(x);
  std::memcpy(k.bytes.data(), &a, 8);
  std::memcpy(k.bytes.data() + 8, &b, 8);
  return k;
}

// Payload bytes derived from the key: a reader can check any chunk it gets back.
inline std::vector<uint8_t> PayloadOf(const storage::ChunkKey& key, size_t bytes) {
  std::vector<uint8_t> p(bytes);
  uint64_t x = key.Prefix64();
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = SplitMix64(x);
    std::memcpy(p.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  return p;
}

// ChunkStore::CheckConsistency at the next quiet moment: a write-behind or demotion the
// store started on its own may still be running, so "not quiet" is asked again for up to
// 5 s before it is the answer.
inline absl::Status ConsistentOnceQuiet(const storage::ChunkStore& store) {
  absl::Status st;
  for (int i = 0; i < 500; ++i) {
    st = store.CheckConsistency();
    if (!absl::IsFailedPrecondition(st)) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return st;
}

}  // namespace kvc::testing
