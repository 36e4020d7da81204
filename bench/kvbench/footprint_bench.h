// kvbench footprint: what chunks of each size cost a store made as kvcached makes it by
// default (its first size class the reference model's chunk, its largest chunk 8 MiB),
// tier by tier: the bytes each is
// charged (quotas, Stats) per payload byte — the peer is the payload itself, 1.0 — and
// how many fit in a GiB. A size past the store's largest chunk is refused, and says so.
// Then all sizes at once on one SSD budget: how much of it holds chunks before the first
// eviction (the size classes share the budget; storage v3's target is >= 90 %).
// Capacity, not speed: nothing is timed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct FootprintOptions {
  std::string dir = "/tmp/kvbench-footprint";  // scratch folder (emptied)
  uint64_t max_chunk_bytes = 8ull << 20;       // the store's largest chunk (kvcached's default)
  uint64_t first_class_chunk_bytes = 0;        // its first class (kvcached: the reference's)
  std::vector<uint64_t> chunk_bytes = {4096, 16384, 20352, 57344, 227840, 1048576, 4497408};
  uint64_t chunks = 32;  // stored per size (durable: on SSD and, written through, in RAM)
  // The mixed workload: every size at once into one store of this SSD budget (0: not run),
  // sizes drawn at random so each brings about the same bytes, until twice the budget is
  // written. It reports how full the budget was when the first chunk was evicted, and after.
  uint64_t mixed_budget_bytes = 256ull << 20;
};

absl::StatusOr<nlohmann::json> RunFootprintBench(const FootprintOptions& options);
std::string FootprintToText(const nlohmann::json& result);

}  // namespace kvc::bench
