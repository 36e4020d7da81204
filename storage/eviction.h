// EvictionOrder: which chunk a tier gives up next, prefix-aware.
//
// A chunk is useless without its ancestors, so a chunk with a child in the same tier is
// never picked before that child: leaves go first, least recently used first. Chunks
// whose TTL has expired go before everything else, then orphans — chunks whose parent
// has left the store, so that no lookup can reach them (MarkOrphansOf). Pinned chunks
// (lease not yet over) are never picked; neither are their ancestors, which always have
// a child present.
// Not thread-safe: the store calls it under its own mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "storage/chunk_key.h"

namespace kvc::storage {

class EvictionOrder {
 public:
  void Add(const ChunkKey& key, const std::optional<ChunkKey>& parent, int64_t access_us,
           int64_t pin_until_s, int64_t expires_s);
  void Remove(const ChunkKey& key);
  void Touch(const ChunkKey& key, int64_t access_us);
  void SetPin(const ChunkKey& key, int64_t pin_until_s);
  // `parent` left the store: its children here can no longer be reached. (Their own
  // children follow when they are evicted in turn.) Storing `parent` again undoes it.
  void MarkOrphansOf(const ChunkKey& parent);
  bool IsOrphan(const ChunkKey& key) const;
  bool Contains(const ChunkKey& key) const { return nodes_.contains(key); }
  size_t size() const { return nodes_.size(); }

  // The next chunk to give up at time now_s, or nullopt when every chunk left is pinned
  // or an ancestor of a pinned chunk.
  std::optional<ChunkKey> PickVictim(int64_t now_s) const;

 private:
  struct Node {
    std::optional<ChunkKey> parent;
    int64_t access_us = 0;
    int64_t pin_until_s = 0;
    int64_t expires_s = 0;
    bool orphan = false;
  };
  bool IsLeaf(const ChunkKey& key) const;
  void AddLeaf(const ChunkKey& key, const Node& n) { leaves_.insert({n.access_us, key}); }
  void RemoveLeaf(const ChunkKey& key, const Node& n) { leaves_.erase({n.access_us, key}); }

  std::unordered_map<ChunkKey, Node, ChunkKeyHash> nodes_;
  void SetOrphan(const ChunkKey& key, Node& n, bool orphan);

  // Children present in this tier, per parent key (the parent itself may be absent).
  std::unordered_map<ChunkKey, std::unordered_set<ChunkKey, ChunkKeyHash>, ChunkKeyHash> children_;
  std::set<std::pair<int64_t, ChunkKey>> leaves_;    // by last access
  std::set<std::pair<int64_t, ChunkKey>> orphans_;   // by last access
  std::set<std::pair<int64_t, ChunkKey>> expiring_;  // by expiry time
};

}  // namespace kvc::storage
