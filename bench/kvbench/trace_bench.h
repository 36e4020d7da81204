// kvbench trace: a request trace (bench/trace/trace.h) replayed against a real kvcached —
// per request a Lookup, a Fetch of the matched prefix, and a durable Store of the new
// whole chunks — at the trace's arrival times sped up `speedup` times (0: back to back),
// beside the simulator (bench/trace/tier_sim.h) at the same capacities, which must agree.
// Every chunk's payload is derived from its key, so every fetched byte is checked.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct TraceBenchOptions {
  std::string trace;
  std::string dir;       // scratch folder for the daemon (emptied)
  std::string kvcached;  // the daemon's binary
  std::string model_config_json;
  int64_t chunk_tokens = 256;
  int64_t limit = 0;    // first N requests; 0: all
  double speedup = 0;   // 0: as fast as the daemon answers
  int concurrency = 1;  // requests in flight at once (1: the simulator's order exactly)
  uint64_t ram_bytes = 256ull << 20;
  uint64_t ssd_bytes = 2ull << 30;
};

absl::StatusOr<nlohmann::json> RunTraceBench(const TraceBenchOptions& options);
std::string TraceBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
