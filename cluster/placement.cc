#include "cluster/placement.h"

#include <xxhash.h>

#include <algorithm>

namespace kvc::cluster {

uint64_t RendezvousWeight(const storage::ChunkKey& key, const std::string& node_id) {
  // One contiguous buffer: key bytes, then the id (ids are short; no allocation for most).
  uint8_t buf[16 + 256];
  if (node_id.size() <= 256) {
    std::copy(key.bytes.begin(), key.bytes.end(), buf);
    std::copy(node_id.begin(), node_id.end(), buf + 16);
    return XXH3_64bits(buf, 16 + node_id.size());
  }
  std::string long_buf(reinterpret_cast<const char*>(key.bytes.data()), 16);
  long_buf += node_id;
  return XXH3_64bits(long_buf.data(), long_buf.size());
}

std::vector<size_t> RankNodes(const storage::ChunkKey& key, std::span<const std::string> node_ids) {
  std::vector<std::pair<uint64_t, size_t>> w;
  w.reserve(node_ids.size());
  for (size_t i = 0; i < node_ids.size(); ++i)
    w.emplace_back(RendezvousWeight(key, node_ids[i]), i);
  std::sort(w.begin(), w.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return node_ids[a.second] < node_ids[b.second];
  });
  std::vector<size_t> order;
  order.reserve(w.size());
  for (const auto& [weight, i] : w) order.push_back(i);
  return order;
}

std::vector<size_t> TopRanked(const storage::ChunkKey& key, std::span<const std::string> node_ids,
                              size_t n) {
  std::vector<std::pair<uint64_t, size_t>> w;
  w.reserve(node_ids.size());
  for (size_t i = 0; i < node_ids.size(); ++i)
    w.emplace_back(RendezvousWeight(key, node_ids[i]), i);
  const auto better = [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first > b.first;
    return node_ids[a.second] < node_ids[b.second];
  };
  n = std::min(n, w.size());
  std::partial_sort(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(n), w.end(), better);
  std::vector<size_t> top;
  top.reserve(n);
  for (size_t i = 0; i < n; ++i) top.push_back(w[i].second);
  return top;
}

LookupPlan PlanLookup(std::span<const storage::ChunkKey> keys,
                      std::span<const std::string> node_ids, size_t ask) {
  LookupPlan plan(node_ids.size());
  if (ask >= node_ids.size()) {
    for (auto& p : plan) {
      p.resize(keys.size());
      for (size_t c = 0; c < keys.size(); ++c) p[c] = c;
    }
    return plan;
  }
  for (size_t c = 0; c < keys.size(); ++c) {
    for (size_t i : TopRanked(keys[c], node_ids, ask)) plan[i].push_back(c);
  }
  return plan;
}

FanOut FanOutOf(const LookupPlan& plan) {
  FanOut f;
  for (const auto& p : plan) {
    if (p.empty()) continue;
    ++f.nodes;
    f.keys += p.size();
  }
  return f;
}

size_t FirstHolder(const storage::ChunkKey& key, const std::string& reader_salt, size_t holders) {
  return holders == 0 ? 0 : static_cast<size_t>(RendezvousWeight(key, reader_salt) % holders);
}

std::vector<size_t> FetchOrder(const storage::ChunkKey& key, std::span<const std::string> node_ids,
                               std::span<const size_t> holders, size_t replicas,
                               const std::string& reader_salt) {
  std::vector<size_t> order(holders.begin(), holders.end());
  const size_t known = order.size();
  for (size_t i : RankNodes(key, node_ids)) {
    if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  }
  const size_t copies = known > 0 ? known : std::min(replicas, order.size());
  std::rotate(order.begin(),
              order.begin() + static_cast<std::ptrdiff_t>(FirstHolder(key, reader_salt, copies)),
              order.begin() + static_cast<std::ptrdiff_t>(copies));
  return order;
}

}  // namespace kvc::cluster
