// kvbench soak: kvcached under many clients while faults fire, then a check that nothing
// acknowledged was lost and nothing was ever served wrong.
//
// For `seconds`: `clients` threads of one tenant store prefixes (durable and memory),
// fetch them back and check every byte (each chunk's payload is derived from its key),
// pin, unpin and delete, and now and then drop a fetch mid-stream (a 1 ms deadline); a
// hostile tenant asks for the first tenant's chunks by key and by tokens; the daemon
// runs with injected SSD faults (--inject-io-faults: EIO and ENOSPC on reads, writes and
// syncs, short reads) and is SIGKILLed and restarted every `kill_every_s`; its RSS and
// open file descriptors are sampled. Then it is killed once more, restarted without
// faults, and every durably acknowledged chunk that was not deleted is fetched and
// compared. The result passes only with 0 wrong bytes, 0 lost chunks, 0 cross-tenant
// hits and bounded descriptors.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct SoakOptions {
  std::string dir;       // scratch folder (emptied)
  std::string kvcached;  // the daemon's binary
  std::string model_config_json;
  double seconds = 20;
  int clients = 4;
  double kill_every_s = 4;
  uint32_t io_fault_rate = 300;  // 1 in N SSD operations fails
  uint64_t ssd_bytes = 1ull << 30;
  uint64_t ram_bytes = 64ull << 20;
};

absl::StatusOr<nlohmann::json> RunSoak(const SoakOptions& options);
std::string SoakToText(const nlohmann::json& result);
// Whether the result shows nothing lost, nothing wrong, no leak and bounded resources.
bool SoakPassed(const nlohmann::json& result);

}  // namespace kvc::bench
