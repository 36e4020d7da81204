// kvplan simulate: a request trace (bench/trace/trace.h) through the cache's placement and
// eviction rules (bench/trace/tier_sim.h) at given tier sizes, for this model's cache and,
// at the same sizes, for a per-layer MHA cache and an MLA-style cache (bytes per token of
// each computed from the config); optionally the smallest RAM and SSD reaching a target
// hit rate, and hit-rate curves for plots.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/spec/model_config.h"
#include "nlohmann/json.hpp"

namespace kvc {

struct SimulateOptions {
  std::string trace;
  int64_t limit = 0;  // first N requests; 0: all
  int64_t chunk_tokens = 256;
  double hbm_gib = 0, ram_gib = 16, ssd_gib = 256;  // < 0: unlimited
  std::optional<double> target_hit_rate;
  int curve_points = 0;  // > 0: hit rate at that many RAM sizes and SSD sizes
};

// InvalidArgument / NotFound for a bad trace or config (naming it).
absl::StatusOr<nlohmann::json> RunSimulate(const ModelConfig& config, const SimulateOptions& o);
std::string SimulateToText(const nlohmann::json& result);

}  // namespace kvc
