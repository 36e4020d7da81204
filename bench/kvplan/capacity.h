// Capacity planning for the global-KV cache: how many sessions of a given context fit in
// each tier, how much the SSD absorbs per day, and what the alternatives would cost.
// Every number is derived from the model config through the schedule and chunk layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/weights.h"
#include "engine/spec/chunk_layout.h"
#include "engine/spec/layer_schedule.h"
#include "engine/spec/model_config.h"
#include "nlohmann/json.hpp"

namespace kvc {

struct Workload {
  int64_t context_tokens = 0;   // tokens per session
  double sessions_per_day = 0;  // new sessions written to SSD per day
  int64_t chunk_tokens = kDefaultChunkTokens;
  double hbm_bytes = 0;  // cache capacity per tier
  double ram_bytes = 0;
  double ssd_bytes = 0;
};

struct LayerStorage {
  int64_t index = 0;
  std::string role, mode;
  int64_t ratio = 0;
  double stored_bytes_per_token = 0;
  std::string stores;  // what the layer contributes to the cache, in words
};

// One way of keeping a session's KV, with its size.
struct Alternative {
  std::string name;
  std::string description;
  double bytes_per_token = 0;
  double session_bytes = 0;
};

struct TierFit {
  std::string tier;
  double capacity_bytes = 0;
  int64_t sessions = 0;
};

struct CapacityPlan {
  ModelConfig config;
  LayerSchedule schedule;
  ChunkLayout layout;
  Workload workload;
  std::vector<LayerStorage> layers;
  int64_t cached_chunks_per_session = 0;  // whole chunks only
  int64_t uncached_tail_tokens = 0;       // the partial last chunk is recomputed
  double session_bytes = 0;
  std::vector<TierFit> tiers;  // hbm, ram, ssd
  double ssd_write_bytes_per_day = 0;
  double ssd_drive_writes_per_day = 0;    // write per day / SSD capacity
  int64_t bounded_replay_tokens = 0;      // SWA rebuild on resume: one window
  int64_t exact_replay_tokens = 0;        // encoder layers × window: bit-exact resume
  std::vector<Alternative> alternatives;  // first entry: this cache
  model::ActiveParameters active;         // parameters per token, by phase
};

// InvalidArgument (naming the value) for a config the schedule rejects, a chunk size that
// does not fit the layout, or a context shorter than one chunk.
[[nodiscard]] absl::StatusOr<CapacityPlan> PlanCapacity(const ModelConfig& config,
                                                        const Workload& workload);

nlohmann::json PlanToJson(const CapacityPlan& plan);
std::string PlanToText(const CapacityPlan& plan);

}  // namespace kvc
