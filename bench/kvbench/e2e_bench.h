// kvbench e2e: time to first token of a request whose prefix kvcached holds (warm: lookup,
// fetch into pages, bounded replay, the new tokens) beside the same request prefilled cold,
// in the same run — against the cached prefix length (from RAM, and from SSD after a
// kvcached restart; from RADOS after the node and its disk are lost, with --rados) and
// against the new tokens per turn; bytes fetched and the share of
// TTFT spent fetching.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct E2eBenchOptions {
  std::string config = "configs/mini.json";
  std::string backend = "cpu";  // the engine's: cpu, cuda or cublas
  std::string kvcached;         // the daemon binary
  std::string dir = "/tmp/kvbench-e2e";
  std::vector<int64_t> prefix_tokens = {4096, 16384, 65536};
  int64_t new_tokens = 1024;
  std::vector<int64_t> new_token_sweep = {256, 4096};  // at sweep_prefix
  int64_t sweep_prefix = 16384;
  int repetitions = 2;
  // > 0: kvcached gets an HBM tier of this many bytes and the engine (a GPU backend) also
  // resumes from it, reading the chunks out over CUDA IPC (tier "hbm").
  uint64_t hbm_bytes = 0;
  // A single-host Ceph cluster (scripts/ceph-up.sh under source_dir) as kvcached's shared
  // tier; each prefix is also resumed from it after kvcached is SIGKILLed and its folder
  // deleted (tier "rados").
  bool rados = false;
  std::string source_dir;
  std::string plot;  // PNG path (gnuplot), empty: none
};

absl::StatusOr<nlohmann::json> RunE2eBench(const E2eBenchOptions& options);
std::string E2eBenchToText(const nlohmann::json& result);
// Writes the TTFT-vs-prefix plot; returns what was written.
std::string PlotE2e(const nlohmann::json& result, const std::string& png);

}  // namespace kvc::bench
