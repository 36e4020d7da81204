#include "storage/eviction.h"

#include <tuple>

namespace kvc::storage {

bool EvictionOrder::IsLeaf(const ChunkKey& key) const {
  auto it = children_.find(key);
  return it == children_.end() || it->second.empty();
}

bool EvictionOrder::IsOrphan(const ChunkKey& key) const {
  auto it = nodes_.find(key);
  return it != nodes_.end() && it->second.orphan;
}

void EvictionOrder::SetOrphan(const ChunkKey& key, Node& n, bool orphan) {
  if (n.orphan == orphan) return;
  n.orphan = orphan;
  ForQueues(n, [&](Queues& q) {
    if (orphan) {
      q.orphans.insert({n.access_us, key});
    } else {
      q.orphans.erase({n.access_us, key});
    }
  });
}

void EvictionOrder::Add(const ChunkKey& key, const std::optional<ChunkKey>& parent,
                        int64_t access_us, int64_t pin_until_s, int64_t expires_s, NamespaceId ns,
                        uint64_t bytes) {
  if (nodes_.contains(key)) Remove(key);
  Node n{parent, access_us, pin_until_s, expires_s, false, ns, bytes};
  if (parent.has_value()) {
    auto& siblings = children_[*parent];
    siblings.insert(key);
    if (siblings.size() == 1) {
      auto p = nodes_.find(*parent);
      if (p != nodes_.end()) RemoveLeaf(*parent, p->second);  // no longer a leaf
    }
  }
  if (IsLeaf(key)) AddLeaf(key, n);
  ForQueues(n, [&](Queues& q) {
    if (expires_s > 0) q.expiring.insert({expires_s, key});
    q.bytes += bytes;
  });
  nodes_.emplace(key, n);
  // This chunk is back: its children are reachable again.
  if (auto c = children_.find(key); c != children_.end()) {
    for (const ChunkKey& child : c->second) SetOrphan(child, nodes_.at(child), false);
  }
}

void EvictionOrder::Remove(const ChunkKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  SetOrphan(key, it->second, false);
  const Node n = it->second;
  nodes_.erase(it);
  RemoveLeaf(key, n);
  ForQueues(n, [&](Queues& q) {
    if (n.expires_s > 0) q.expiring.erase({n.expires_s, key});
    q.bytes -= n.bytes;
  });
  if (auto q = by_ns_.find(n.ns); q != by_ns_.end() && q->second.leaves.empty() &&
                                  q->second.orphans.empty() && q->second.expiring.empty() &&
                                  q->second.bytes == 0) {
    by_ns_.erase(q);  // the namespace's last chunk here left
  }
  if (n.parent.has_value()) {
    auto c = children_.find(*n.parent);
    if (c != children_.end()) {
      c->second.erase(key);
      if (c->second.empty()) {
        children_.erase(c);
        auto p = nodes_.find(*n.parent);
        if (p != nodes_.end()) AddLeaf(*n.parent, p->second);  // its last child left
      }
    }
  }
}

void EvictionOrder::MarkOrphansOf(const ChunkKey& parent) {
  auto c = children_.find(parent);
  if (c == children_.end()) return;
  for (const ChunkKey& child : c->second) SetOrphan(child, nodes_.at(child), true);
}

void EvictionOrder::Touch(const ChunkKey& key, int64_t access_us) {
  auto it = nodes_.find(key);
  if (it == nodes_.end() || it->second.access_us == access_us) return;
  const bool leaf = IsLeaf(key);
  const bool orphan = it->second.orphan;
  if (leaf) RemoveLeaf(key, it->second);
  SetOrphan(key, it->second, false);
  it->second.access_us = access_us;
  if (leaf) AddLeaf(key, it->second);
  SetOrphan(key, it->second, orphan);
}

void EvictionOrder::SetPin(const ChunkKey& key, int64_t pin_until_s) {
  auto it = nodes_.find(key);
  if (it != nodes_.end()) it->second.pin_until_s = pin_until_s;
}

uint64_t EvictionOrder::BytesOf(NamespaceId ns) const {
  auto it = by_ns_.find(ns);
  return it == by_ns_.end() ? 0 : it->second.bytes;
}

std::optional<EvictionOrder::Candidate> EvictionOrder::Best(const Queues& q, int64_t now_s) const {
  auto pinned = [&](const ChunkKey& k) { return nodes_.at(k).pin_until_s > now_s; };
  for (const auto& [expires, key] : q.expiring) {
    if (expires > now_s) break;
    if (!pinned(key)) return Candidate{0, expires, key};
  }
  for (const auto& [access, key] : q.orphans) {
    if (!pinned(key)) return Candidate{1, access, key};
  }
  for (const auto& [access, key] : q.leaves) {
    if (!pinned(key)) return Candidate{2, access, key};
  }
  return std::nullopt;
}

std::optional<ChunkKey> EvictionOrder::PickVictim(int64_t now_s) const {
  std::optional<Candidate> best = Best(all_, now_s);
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

std::optional<ChunkKey> EvictionOrder::PickVictimIf(
    int64_t now_s, const std::function<bool(NamespaceId)>& may_give_up) const {
  std::optional<Candidate> best;
  for (const auto& [ns, queues] : by_ns_) {
    if (!may_give_up(ns)) continue;
    std::optional<Candidate> c = Best(queues, now_s);
    if (c && (!best || *c < *best)) best = c;
  }
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

std::optional<ChunkKey> EvictionOrder::PickVictimAmong(
    int64_t now_s, std::span<const NamespaceId> namespaces) const {
  std::optional<Candidate> best;
  for (NamespaceId ns : namespaces) {
    auto it = by_ns_.find(ns);
    if (it == by_ns_.end()) continue;
    std::optional<Candidate> c = Best(it->second, now_s);
    if (c && (!best || *c < *best)) best = c;
  }
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

}  // namespace kvc::storage
