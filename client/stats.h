// The operators' view: a daemon's counters as kvcache.v1.StatsResponse (protobuf), for
// kvctl, the benches and tests. Workers never need it; client.h and cluster_client.h only
// declare the calls that answer with it.
#pragma once

#include "absl/status/statusor.h"
#include "cluster/membership.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvc::client {

// One member's answer to ClusterClient::Stats.
struct NodeStats {
  cluster::NodeInfo node;
  absl::StatusOr<kvcache::v1::StatsResponse> stats;
};

}  // namespace kvc::client
