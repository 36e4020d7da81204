#include "storage/eviction.h"

namespace kvc::storage {

bool EvictionOrder::IsLeaf(const ChunkKey& key) const {
  auto it = child_count_.find(key);
  return it == child_count_.end() || it->second == 0;
}

void EvictionOrder::Add(const ChunkKey& key, const std::optional<ChunkKey>& parent,
                        int64_t access_us, int64_t pin_until_s, int64_t expires_s) {
  if (nodes_.contains(key)) Remove(key);
  Node n{parent, access_us, pin_until_s, expires_s};
  if (parent.has_value()) {
    if (++child_count_[*parent] == 1) {
      auto p = nodes_.find(*parent);
      if (p != nodes_.end()) RemoveLeaf(*parent, p->second);  // no longer a leaf
    }
  }
  if (IsLeaf(key)) AddLeaf(key, n);
  if (expires_s > 0) expiring_.insert({expires_s, key});
  nodes_.emplace(key, n);
}

void EvictionOrder::Remove(const ChunkKey& key) {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return;
  const Node n = it->second;
  nodes_.erase(it);
  RemoveLeaf(key, n);
  if (n.expires_s > 0) expiring_.erase({n.expires_s, key});
  if (n.parent.has_value()) {
    auto c = child_count_.find(*n.parent);
    if (c != child_count_.end() && --c->second == 0) {
      child_count_.erase(c);
      auto p = nodes_.find(*n.parent);
      if (p != nodes_.end()) AddLeaf(*n.parent, p->second);  // its last child left
    }
  }
}

void EvictionOrder::Touch(const ChunkKey& key, int64_t access_us) {
  auto it = nodes_.find(key);
  if (it == nodes_.end() || it->second.access_us == access_us) return;
  const bool leaf = IsLeaf(key);
  if (leaf) RemoveLeaf(key, it->second);
  it->second.access_us = access_us;
  if (leaf) AddLeaf(key, it->second);
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
  for (const auto& [access, key] : leaves_) {
    if (!pinned(key)) return key;
  }
  return std::nullopt;
}

}  // namespace kvc::storage
