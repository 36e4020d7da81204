// kvbench engine: the CPU engine on a small config, each number beside its peer from the
// same run — CED prefill beside full-depth prefill (and the cost model 1/2 + W/(2N)),
// DSpark decoding beside plain decoding, a resumed request beside a cold one, and the
// batch-invariant GEMM beside OpenBLAS's sgemm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvc::bench {

struct EngineBenchOptions {
  std::string config;           // model config (default configs/mini.json)
  std::string weights;          // safetensors; empty: random weights (seed 1) in a temp file
  std::string backend = "cpu";  // where the model's products, indexer and attention run
  std::vector<int64_t> prefill_tokens = {512, 2048, 8192, 32768};
  int64_t full_depth_max = 8192;  // longest prompt also run at full depth
  int64_t decode_tokens = 64;
  int64_t resume_prefix = 16384, resume_new = 1024;
  int repetitions = 3;
  // When set, only the context sweep runs: per length, a prompt prefilled (CED) and then
  // decode_tokens greedy tokens generated after it — prefill and decode speed at that
  // context, one run each (the GPU check's reference-shaped layers at 16K and 128K).
  std::vector<int64_t> contexts;
};

absl::StatusOr<nlohmann::json> RunEngineBench(const EngineBenchOptions& options);
std::string EngineBenchToText(const nlohmann::json& result);

}  // namespace kvc::bench
