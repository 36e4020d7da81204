// Placement: which nodes of a cluster hold a chunk.
//
// Rendezvous (highest random weight) hashing, rule "kvcache-rendezvous-v1": every node
// gets the weight XXH3-64 (seed 0) of the chunk's 16 key bytes followed by the node id's
// UTF-8 bytes; nodes are ranked by weight, highest first (equal weights: the smaller id
// first), and a chunk's owners are the first R of the ranking. A node joining or leaving
// moves only the chunks it gains or loses a top-R place for. The rule is public, with test
// vectors in docs/cluster.md, so any client computes the same owners.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/chunk_key.h"

namespace kvc::cluster {

inline constexpr char kPlacementRuleName[] = "kvcache-rendezvous-v1";

// The weight of `node_id` for `key`.
uint64_t RendezvousWeight(const storage::ChunkKey& key, const std::string& node_id);

// Indices into `node_ids`, best owner first (the whole ranking).
std::vector<size_t> RankNodes(const storage::ChunkKey& key, std::span<const std::string> node_ids);
// The first `n` of that ranking (all of it when n ≥ the nodes), without sorting the rest.
std::vector<size_t> TopRanked(const storage::ChunkKey& key, std::span<const std::string> node_ids,
                              size_t n);

// Lookup by ranking (docs/cluster.md): each key is asked of its first `ask` ranked nodes —
// its R owners and the next few, where a copy may still sit after a membership change —
// not of every member. plan[i] lists, in order, the indices of the keys to ask node i
// (empty: node i is not asked). ask ≥ the number of nodes: every node, every key.
using LookupPlan = std::vector<std::vector<size_t>>;
LookupPlan PlanLookup(std::span<const storage::ChunkKey> keys,
                      std::span<const std::string> node_ids, size_t ask);
// How wide a plan is: nodes asked (calls), and keys asked in all (per-node work summed).
struct FanOut {
  size_t nodes = 0;
  size_t keys = 0;
};
FanOut FanOutOf(const LookupPlan& plan);

// Which of a chunk's `holders` copies a reader asks first (an index below holders; 0 when
// there are none): RendezvousWeight(key, reader_salt) mod holders. Each reader has its own
// salt, so the readers of a hot chunk share its R copies instead of all asking its
// best-ranked holder (kvplan simulate --nodes: one node served 6.8× the mean at 100 nodes
// when every read went to the first holder).
size_t FirstHolder(const storage::ChunkKey& key, const std::string& reader_salt, size_t holders);

// The nodes a fetch asks for `key`, in order (indices into node_ids): `holders` (those a
// Lookup saw, in its order; indices into node_ids), then every other member by rank; the
// first `copies` — the holders, or the first `replicas` ranked nodes when there are none —
// rotated to start at FirstHolder(key, reader_salt, copies). The client then moves nodes it
// is skipping to the end. Held with the Python client's fetch_order to
// tests/cluster/lookup_plan_vectors.json ("fetch_orders").
std::vector<size_t> FetchOrder(const storage::ChunkKey& key, std::span<const std::string> node_ids,
                               std::span<const size_t> holders, size_t replicas,
                               const std::string& reader_salt);

}  // namespace kvc::cluster
