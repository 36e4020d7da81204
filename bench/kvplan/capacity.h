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
  double hbm_bytes = 0;  // cache capacity per tier (per node)
  double ram_bytes = 0;
  double ssd_bytes = 0;
  // The fleet (FleetPlan): nodes with these tiers, R copies of a chunk on their SSDs, a
  // shared RADOS pool under them (0: none; usable bytes, after Ceph's own replication).
  int64_t nodes = 1;
  int64_t replicas = 1;
  double rados_bytes = 0;
  double rados_node_bytes_per_s = 0;  // one node's bandwidth to RADOS (its network share)
  double repair_bytes_per_s = 0;      // node-to-node repair copies (kvcached --repair-mbps)
};

// What a fleet of Workload::nodes holds, and what losing one node costs, with and without
// the shared RADOS tier under it (docs/rados.md, "Sizing").
struct FleetPlan {
  bool rados = false;
  double new_bytes_per_day = 0;       // the fleet's new sessions, stored once each
  int64_t rados_sessions = 0;         // whole sessions the pool holds
  double rados_retention_days = 0;    // how long the pool keeps a day's new sessions
  double node_write_bytes_per_s = 0;  // a node's average write to RADOS
  double resume_from_rados_s = 0;     // one whole session read by one node
  // A node lost: sessions (whole) left with no copy, bytes repair copies node to node,
  // and how long that takes; with RADOS: the hot set (its RAM) read back when asked.
  int64_t lost_sessions_without = 0, lost_sessions_with = 0;
  double repair_bytes_without = 0, repair_s_without = 0;
  double refill_bytes_with = 0, refill_s_with = 0;
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
  FleetPlan fleet;                        // with Workload::nodes > 1 or a RADOS pool
};

// InvalidArgument (naming the value) for a config the schedule rejects, a chunk size that
// does not fit the layout, or a context shorter than one chunk.
[[nodiscard]] absl::StatusOr<CapacityPlan> PlanCapacity(const ModelConfig& config,
                                                        const Workload& workload);

nlohmann::json PlanToJson(const CapacityPlan& plan);
std::string PlanToText(const CapacityPlan& plan);

}  // namespace kvc
