// kvbench fairness: what one tenant's large calls cost another tenant's small ones.
//
// kvcached runs with two tenants. "quiet" looks up one key at a time, serially, for
// `seconds` alone (its quiet latency), then for `seconds` again while "flood" runs
// `flooders` threads of the largest Lookup there is (max_keys_per_call random keys of a
// caller-keyed namespace that names no page size). The figure is quiet's p99 under the
// flood over its p99 alone, measured in the same run: the goal is at most 2. Measured twice
// in one run: on a daemon that paces each tenant's Lookups by cost (cachesvc/cost_pacer.h)
// and on one that does not.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct FairnessOptions {
  std::string dir = "/tmp/kvbench-fairness";  // scratch folder (emptied)
  std::string kvcached;                       // the daemon's binary
  double seconds = 5;
  int flooders = 8;
  uint32_t flood_keys = 65536;  // keys per flood Lookup
  // The daemon's --lookup-keys-per-second for the paced run (negative: its default); an
  // unpaced daemon (0) is measured beside it in the same run.
  double lookup_keys_per_second = -1;
};

absl::StatusOr<nlohmann::json> RunFairnessBench(const FairnessOptions& options);
std::string FairnessToText(const nlohmann::json& result);

}  // namespace kvc::bench
