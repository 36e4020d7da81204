#include "storage/eviction.h"

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
  if (orphan) {
    orphans_.insert({n.access_us, key});
  } else {
    orphans_.erase({n.access_us, key});
  }
}

void EvictionOrder::Add(const ChunkKey& key, const std::optional<ChunkKey>& parent,
                        int64_t access_us, int64_t pin_until_s, int64_t expires_s) {
  if (nodes_.contains(key)) Remove(key);
  Node n{parent, access_us, pin_until_s, expires_s, false};
  if (parent.has_value()) {
    auto& siblings = children_[*parent];
    siblings.insert(key);
    if (siblings.size() == 1) {
      auto p = nodes_.find(*parent);
      if (p != nodes_.end()) RemoveLeaf(*parent, p->second);  // no longer a leaf
    }
  }
  if (IsLeaf(key)) AddLeaf(key, n);
  if (expires_s > 0) expiring_.insert({expires_s, key});
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
  if (n.expires_s > 0) expiring_.erase({n.expires_s, key});
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

std::optional<ChunkKey> EvictionOrder::PickVictim(int64_t now_s) const {
  auto pinned = [&](const ChunkKey& k) { return nodes_.at(k).pin_until_s > now_s; };
  for (const auto& [expires, key] : expiring_) {
    if (expires > now_s) break;
    if (!pinned(key)) return key;
  }
  for (const auto& [access, key] : orphans_) {
    if (!pinned(key)) return key;
  }
  for (const auto& [access, key] : leaves_) {
    if (!pinned(key)) return key;
  }
  return std::nullopt;
}

}  // namespace kvc::storage
