// ChunkKey: the 16-byte identity of one cached chunk (an XXH3-128 chained prefix hash,
// computed by the service), and the namespace id chunks are stored under.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

namespace kvc {

using NamespaceId = uint32_t;

struct ChunkKey {
  std::array<uint8_t, 16> bytes{};

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
  friend auto operator<=>(const ChunkKey&, const ChunkKey&) = default;

  // 32 lowercase hex digits.
  std::string Hex() const;
  // The first 8 bytes as an integer (keys are uniform hashes, so this is a good hash).
  uint64_t Prefix64() const {
    uint64_t v;
    std::memcpy(&v, bytes.data(), sizeof v);
    return v;
  }
};

// The key (and parent key) a chunk was stored under by its client, before the service bound
// them to their namespace (cachesvc: StorageKey). Storage only keeps it and hands it back:
// a cluster node places its chunks by these keys when it repairs (docs/cluster.md).
struct ChunkOrigin {
  ChunkKey key;
  std::optional<ChunkKey> parent;
  friend bool operator==(const ChunkOrigin&, const ChunkOrigin&) = default;
};

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const { return static_cast<size_t>(k.Prefix64()); }
};

inline std::string ChunkKey::Hex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return s;
}

}  // namespace kvc

// storage/ names them too: the tiers are where keys are used most.
namespace kvc::storage {
using ::kvc::ChunkKey;
using ::kvc::ChunkKeyHash;
using ::kvc::ChunkOrigin;
using ::kvc::NamespaceId;
}  // namespace kvc::storage
