// TierSimulator: a trace replayed through the cache's placement and eviction rules in
// process, with no I/O — what a capacity planner runs before buying RAM and SSD.
//
// Eviction is the store's own code (storage::EvictionOrder: prefix-aware LRU, orphans
// first). Placement follows ChunkStore and kvcached call for call, in the same order, so
// the simulated hit rate is what the daemon achieves for the same capacities
// (tests/bench/trace_test.cc replays a trace against a real kvcached and compares):
//   - a request asks how many leading chunks are cached in any tier (Lookup), then fetches
//     them in order (Fetch: a RAM hit is leased and touched in RAM; an SSD hit is touched
//     on SSD and promoted into RAM, evicting clean RAM chunks), stopping at the first chunk
//     gone meanwhile;
//   - then it stores its new whole chunks, each with its parent (a chunk whose parent is no
//     longer cached ends the store, as kvcached refuses it): written to SSD (evicting SSD
//     chunks; with no SSD tier, to RAM only) and written through to RAM.
//   - HBM (a co-located engine's T0) holds what the engine fetched or computed last:
//     written through on store, promoted on every fetch, evicted by the same rule.
// Capacities are in bytes and become slots as the tiers size them: RAM slots are the chunk
// rounded up to 4 KiB, SSD slots add the 64-byte slot header first (slot_format.h), HBM
// slots round to 512 B. A capacity below zero is unlimited.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_set>
#include <vector>

#include "base/chunk_key.h"
#include "bench/trace/trace.h"
#include "nlohmann/json.hpp"
#include "storage/eviction.h"

namespace kvc::trace {

struct SimConfig {
  int64_t chunk_tokens = 256;
  uint64_t chunk_bytes = 0;
  double hbm_bytes = 0, ram_bytes = 0, ssd_bytes = 0;  // < 0: unlimited
};

struct TierCounters {
  int64_t capacity_chunks = 0;  // -1: unlimited
  uint64_t hit_tokens = 0;      // prompt tokens served from this tier
  uint64_t read_bytes = 0, written_bytes = 0;
  uint64_t evictions = 0;
  double hit_rate = 0;  // hit_tokens / all prompt tokens
};

struct SimReport {
  int64_t requests = 0;
  uint64_t prompt_tokens = 0, hit_tokens = 0;
  double hit_rate = 0;  // reused prompt tokens / all prompt tokens
  TierCounters hbm, ram, ssd;
  uint64_t stored_chunks = 0;
  double trace_seconds = 0;
  double ssd_write_bytes_per_day = 0;
};

enum class SimTier { kNone, kHbm, kRam, kSsd };

class TierSimulator {
 public:
  explicit TierSimulator(const SimConfig& config);

  struct Outcome {
    size_t reused = 0;           // leading chunks served from the cache
    std::vector<SimTier> tiers;  // where each of them came from
    size_t stored = 0;           // new chunks stored
  };
  // One request whose prompt has these whole-chunk keys (and prompt_tokens in all).
  Outcome Serve(const std::vector<storage::ChunkKey>& keys, int64_t prompt_tokens);
  SimReport Report(double trace_seconds) const;

 private:
  struct Tier {
    int64_t capacity = 0;  // slots; -1 unlimited
    std::unordered_set<storage::ChunkKey, storage::ChunkKeyHash> chunks;
    storage::EvictionOrder order;
    TierCounters counters;
    bool enabled() const { return capacity != 0; }
    bool Has(const storage::ChunkKey& k) const { return chunks.contains(k); }
  };
  bool Cached(const storage::ChunkKey& k) const;
  // Removes `key` from `tier`; if no tier holds it any more, its children go first.
  void Drop(Tier& tier, const storage::ChunkKey& key);
  // Makes room and adds the chunk; false if every chunk there is pinned (never here).
  bool Insert(Tier& tier, const storage::ChunkKey& key,
              const std::optional<storage::ChunkKey>& parent);
  int64_t Tick() { return ++clock_; }

  SimConfig config_;
  Tier hbm_, ram_, ssd_;
  int64_t clock_ = 0;
  int64_t requests_ = 0;
  uint64_t prompt_tokens_ = 0, hit_tokens_ = 0, stored_ = 0;
};

// Replays `requests` (prompts from PromptTokens, keys under `root`) and reports.
SimReport Simulate(const std::vector<Request>& requests, const SimConfig& config,
                   uint32_t vocab_size, const storage::ChunkKey& root);

// Each request's whole-chunk keys, computed once (they do not depend on capacities).
std::vector<std::vector<storage::ChunkKey>> RequestKeys(const std::vector<Request>& requests,
                                                        int64_t chunk_tokens, uint32_t vocab_size,
                                                        const storage::ChunkKey& root);
SimReport SimulateKeys(const std::vector<Request>& requests,
                       const std::vector<std::vector<storage::ChunkKey>>& keys,
                       const SimConfig& config);

nlohmann::json ReportToJson(const SimReport& report);

}  // namespace kvc::trace
