// kvbench restart: how long a kvcached holding N chunks on SSD takes to come back after a
// crash — to listening, and to its first Lookup hit — beside the floor of the same run:
// reading the index's records alone (RocksDB, in this process, on the same folder).
//
// For each count: a fresh daemon is filled with N caller-keyed chunks of `chunk_bytes`
// (durable Store streams), SIGKILLed, and started again on its folder; then it is stopped
// and the index's records are read by ChunkIndex::ForEach, the work no open can skip.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct RestartOptions {
  std::string dir = "/tmp/kvbench-restart";  // scratch folder (emptied)
  std::string kvcached;                      // the daemon's binary
  std::vector<uint64_t> chunks = {20000, 100000};
  uint64_t chunk_bytes = 4096;
  int reps = 3;  // restarts per count (the fill is done once)
};

absl::StatusOr<nlohmann::json> RunRestartBench(const RestartOptions& options);
std::string RestartToText(const nlohmann::json& result);

}  // namespace kvc::bench
