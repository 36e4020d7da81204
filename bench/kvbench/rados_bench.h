// kvbench rados: the shared tier's store and fetch on a real Ceph cluster, beside `rados
// bench` (Ceph's own tool) in the same run: same object size (the model's chunk), same
// queue depth, same pool. Ours goes through RadosTier's batches (what a node's durable
// puts and misses use) and, for fetches, through a ChunkStore on an empty folder (a node
// that lost its disk: reads verified and promoted).
//
// Without --ceph-conf a single-host cluster (scripts/ceph-up.sh) is started in DIR/ceph
// and ended afterwards.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct RadosBenchOptions {
  std::string dir = "/tmp/kvbench-rados";  // scratch folder (emptied)
  std::string source_dir;                  // the repository (scripts/ceph-up.sh)
  std::string ceph_conf;                   // an existing cluster; empty: start one
  std::string pool = "kvbench";
  uint64_t chunk_bytes = 0;
  int depth = 16;       // operations in flight
  double seconds = 60;  // a write run's limit (it writes max_bytes; reads read them back)
  int reps = 2;         // alternated runs (median reported)
  uint64_t max_bytes = 768ull << 20;  // what each write run writes (the memstore OSD is RAM)
};

absl::StatusOr<nlohmann::json> RunRadosBench(const RadosBenchOptions& options);
std::string RadosBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
