// kvplan simulate --nodes N --replicas R [--fail-node-at HOURS …]: a request trace over a
// cluster (docs/cluster.md), for the people sizing one:
//   - placement is the real rule (cluster::RankNodes, "kvcache-rendezvous-v1"): each stored
//     chunk goes to its R ranked live nodes; each node keeps --ram + --ssd worth of slots
//     (per node) and evicts least recently used chunks (one LRU per node: the tiers' own
//     order inside a node is kvplan simulate's single-node subject, not this one's);
//   - a request's prefix is the leading run of chunks some live node holds (a Lookup that
//     asks widely), each read from its best-ranked holder; then its new chunks are stored;
//   - at each --fail-node-at time the live node holding the most chunks dies for good (its
//     disk with it) — the worst single loss;
//   - two repair policies run on the same trace: read repair only (what the cluster client
//     does today: a chunk a read finds short of R copies is copied to its missing owners)
//     and anti-entropy (docs/cluster.md: at the failure, every chunk the dead node held is
//     copied from a surviving copy to its new owners, read or not), reporting hit rates
//     around each failure, chunks left with no copy, and the bytes each repair moved.
// Per-node balance (chunks held, chunks served) shows what the placement does to load.
// With --rados a third policy runs: a shared tier below the nodes (docs/rados.md) holds
// every chunk stored (each of its R owners writes it, as kvcached does), a prefix chunk no
// live node holds is read from it and promoted into its first owner, and a node's loss
// leaves no chunk without a copy — reporting what it read and wrote, and the share of
// reused tokens that came from it (each such hit a RADOS read, not a node's RAM or SSD).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "bench/kvplan/simulate.h"
#include "engine/spec/model_config.h"
#include "nlohmann/json.hpp"

namespace kvc {

struct ClusterSimOptions {
  int nodes = 0;  // 0: no cluster simulation
  int replicas = 2;
  std::vector<double> fail_at_hours;  // hours after the trace's first request
  bool rados = false;                 // also the policy with a shared tier below the nodes
};

// InvalidArgument naming the option for nodes < 1, replicas outside 1..nodes, a failure
// time below zero or more failures than nodes - 1.
absl::StatusOr<nlohmann::json> RunClusterSimulate(const ModelConfig& config,
                                                  const SimulateOptions& o,
                                                  const ClusterSimOptions& c);
std::string ClusterSimulateToText(const nlohmann::json& result);

}  // namespace kvc
