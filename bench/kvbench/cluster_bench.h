// kvbench cluster: the cluster client against one node, in the same run. For every node
// count in `nodes` (1: one kvcached without --cluster and the plain client — the peer;
// N ≥ 2: etcd and N nodes, the cluster client with R = 2): prefix fetches (chunks_per_call
// chunks a call, `clients` at once) — throughput, p50, p99; the resume of a
// `resume_tokens` prefix (Lookup + Fetch of every chunk), and for one node the same resume
// from SSD (the daemon restarted before each, so its RAM tier is empty); Lookup p50/p99 on a cached
// `lookup_tokens` prefix; and durable stores with R = 1
// and R = 2; and the repair after the loss of a node (time, bytes copied per GB held) on a
// fresh cluster, every prefix fetched afterwards. Every fetched byte is checked. All nodes share
// this machine's cores, so the numbers show the client's routing cost, not what separate hosts
// would add (docs/cluster.md says what that changes).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct ClusterBenchOptions {
  std::string dir;       // scratch folder (emptied)
  std::string kvcached;  // the daemon's binary
  std::string model_config_json;
  std::vector<int> nodes = {1, 3};
  std::vector<int> clients = {1, 4};
  double seconds = 2;
  int repetitions = 3;
  int chunks_per_call = 32;
  int prefixes = 16;  // distinct prefixes fetched at random
  int64_t resume_tokens = 100000;
  int64_t lookup_tokens = 1000000;  // Lookup p50/p99 on a cached prefix this long (0: skip)
  // The repair after a node loss, on a fresh cluster of the largest node count (≥ 3) holding
  // this many chunks (R = 2), so the data fits every node and nothing is evicted (0: skip).
  int64_t repair_chunks = 2048;
};

absl::StatusOr<nlohmann::json> RunClusterBench(const ClusterBenchOptions& options);
std::string ClusterBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
