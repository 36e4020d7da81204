// EvictionOrder: which chunk a tier gives up next, prefix-aware.
//
// A chunk is useless without its ancestors, so a chunk with a child in the same tier is
// never picked before that child: leaves go first, least recently used first. Chunks
// whose TTL has expired go before everything else, then orphans — chunks whose parent
// has left the store, so that no lookup can reach them (MarkOrphansOf). Pinned chunks
// (lease not yet over) are never picked; neither are their ancestors, which always have
// a child present.
//
// The same order is also kept per namespace (a prefix never crosses namespaces), so a
// victim can be picked among a few namespaces only — an owner over its quota gives up
// its own chunks (quota.h) — and the bytes each namespace holds are known.
// Not thread-safe: the store calls it under its own mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "base/chunk_key.h"

namespace kvc::storage {

class EvictionOrder {
 public:
  // Room for n chunks without rehashing (an open adds every chunk at once).
  void Reserve(size_t n) { nodes_.reserve(n); }
  // `bytes`: what the chunk is charged (what it takes), counted in BytesOf(ns).
  void Add(const ChunkKey& key, const std::optional<ChunkKey>& parent, int64_t access_us,
           int64_t pin_until_s, int64_t expires_s, NamespaceId ns = 0, uint64_t bytes = 0);
  void Remove(const ChunkKey& key);
  void Touch(const ChunkKey& key, int64_t access_us);
  void SetPin(const ChunkKey& key, int64_t pin_until_s);
  // `parent` left the store: its children here can no longer be reached. (Their own
  // children follow when they are evicted in turn.) Storing `parent` again undoes it.
  void MarkOrphansOf(const ChunkKey& parent);
  bool IsOrphan(const ChunkKey& key) const;
  bool Contains(const ChunkKey& key) const { return nodes_.contains(key); }
  size_t size() const { return nodes_.size(); }
  // Bytes charged to the namespace's chunks here.
  uint64_t BytesOf(NamespaceId ns) const;

  // The next chunk to give up at time now_s, or nullopt when every chunk left is pinned
  // or an ancestor of a pinned chunk.
  std::optional<ChunkKey> PickVictim(int64_t now_s) const;
  // The same among the chunks of these namespaces only.
  std::optional<ChunkKey> PickVictimAmong(int64_t now_s,
                                          std::span<const NamespaceId> namespaces) const;
  // The same among the chunks of the namespaces `may_give_up` accepts (asked once per
  // namespace present).
  std::optional<ChunkKey> PickVictimIf(int64_t now_s,
                                       const std::function<bool(NamespaceId)>& may_give_up) const;

 private:
  struct Node {
    std::optional<ChunkKey> parent;
    int64_t access_us = 0;
    int64_t pin_until_s = 0;
    int64_t expires_s = 0;
    bool orphan = false;
    NamespaceId ns = 0;
    uint64_t bytes = 0;
  };
  using Queue = std::set<std::pair<int64_t, ChunkKey>>;
  // The victim queues of all chunks, and of one namespace's.
  struct Queues {
    Queue leaves;    // by last access
    Queue orphans;   // by last access
    Queue expiring;  // by expiry time
    uint64_t bytes = 0;
  };
  // A queue's best candidate: (class: 0 expired, 1 orphan, 2 leaf; its sort value; key).
  using Candidate = std::tuple<int, int64_t, ChunkKey>;
  std::optional<Candidate> Best(const Queues& q, int64_t now_s) const;

  // Applies f to the queues of all chunks and to those of the node's namespace.
  template <typename F>
  void ForQueues(const Node& n, F f) {
    f(all_);
    f(by_ns_[n.ns]);
  }
  bool IsLeaf(const ChunkKey& key) const;
  void AddLeaf(const ChunkKey& key, const Node& n) {
    // Most chunks arrive as the newest (a put, an open in age order): at the end in O(1).
    ForQueues(n, [&](Queues& q) { q.leaves.insert(q.leaves.end(), {n.access_us, key}); });
  }
  void RemoveLeaf(const ChunkKey& key, const Node& n) {
    ForQueues(n, [&](Queues& q) { q.leaves.erase({n.access_us, key}); });
  }
  void SetOrphan(const ChunkKey& key, Node& n, bool orphan);

  std::unordered_map<ChunkKey, Node, ChunkKeyHash> nodes_;
  // Children present in this tier, per parent key (the parent itself may be absent).
  std::unordered_map<ChunkKey, std::unordered_set<ChunkKey, ChunkKeyHash>, ChunkKeyHash> children_;
  Queues all_;
  std::unordered_map<NamespaceId, Queues> by_ns_;
};

}  // namespace kvc::storage
