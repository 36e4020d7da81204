#include "bench/trace/tier_sim.h"

#include <limits>

#include "client/prefix_hash.h"
#include "storage/hbm_tier.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"

namespace kvc::trace {
namespace {

int64_t Slots(double bytes, uint64_t slot_bytes) {
  if (bytes < 0) return -1;
  return static_cast<int64_t>(bytes / static_cast<double>(slot_bytes));
}

}  // namespace

TierSimulator::TierSimulator(const SimConfig& config) : config_(config) {
  hbm_.capacity = Slots(config.hbm_bytes, storage::HbmSlotBytes(config.chunk_bytes));
  ram_.capacity = Slots(config.ram_bytes, storage::RamSlotBytes(config.chunk_bytes));
  ssd_.capacity = Slots(config.ssd_bytes, storage::SlotBytesFor(config.chunk_bytes));
  for (Tier* t : {&hbm_, &ram_, &ssd_}) t->counters.capacity_chunks = t->capacity;
}

bool TierSimulator::Cached(const storage::ChunkKey& k) const {
  return hbm_.Has(k) || ram_.Has(k) || ssd_.Has(k);
}

void TierSimulator::Drop(Tier& tier, const storage::ChunkKey& key) {
  tier.chunks.erase(key);
  tier.order.Remove(key);
  if (!Cached(key)) {
    for (Tier* t : {&hbm_, &ram_, &ssd_}) t->order.MarkOrphansOf(key);
  }
}

bool TierSimulator::Insert(Tier& tier, const storage::ChunkKey& key,
                           const std::optional<storage::ChunkKey>& parent) {
  if (!tier.enabled() || tier.Has(key)) return tier.Has(key);
  while (tier.capacity >= 0 && static_cast<int64_t>(tier.chunks.size()) >= tier.capacity) {
    std::optional<storage::ChunkKey> victim = tier.order.PickVictim(0);
    if (!victim) return false;
    Drop(tier, *victim);
    ++tier.counters.evictions;
  }
  tier.chunks.insert(key);
  tier.order.Add(key, parent, Tick(), 0, 0);
  tier.counters.written_bytes += config_.chunk_bytes;
  return true;
}

TierSimulator::Outcome TierSimulator::Serve(const std::vector<storage::ChunkKey>& keys,
                                            int64_t prompt_tokens) {
  Outcome out;
  ++requests_;
  prompt_tokens_ += static_cast<uint64_t>(prompt_tokens);
  const auto parent_of = [&](size_t i) -> std::optional<storage::ChunkKey> {
    if (i == 0) return std::nullopt;
    return keys[i - 1];
  };
  // Lookup: the leading run cached anywhere.
  size_t matched = 0;
  while (matched < keys.size() && Cached(keys[matched])) ++matched;
  // Fetch, chunk by chunk, as the Fetch reactor serves them.
  const uint64_t c_tokens = static_cast<uint64_t>(config_.chunk_tokens);
  for (size_t i = 0; i < matched; ++i) {
    const storage::ChunkKey& k = keys[i];
    Tier* from = nullptr;
    if (hbm_.Has(k)) {
      from = &hbm_;
      hbm_.order.Touch(k, Tick());
    } else if (ram_.Has(k)) {
      from = &ram_;
      ram_.order.Touch(k, Tick());  // LeaseRam
    } else if (ssd_.Has(k)) {
      from = &ssd_;
      ssd_.order.Touch(k, Tick());  // Get, then a clean copy into RAM
      Insert(ram_, k, parent_of(i));
    } else {
      break;  // gone since the lookup
    }
    if (from != &hbm_) Insert(hbm_, k, parent_of(i));  // the engine reads it on the device
    from->counters.hit_tokens += c_tokens;
    from->counters.read_bytes += config_.chunk_bytes;
    out.tiers.push_back(from == &hbm_   ? SimTier::kHbm
                        : from == &ram_ ? SimTier::kRam
                                        : SimTier::kSsd);
    ++out.reused;
  }
  hit_tokens_ += out.reused * c_tokens;
  // Store the new whole chunks, each after its parent.
  for (size_t i = out.reused; i < keys.size(); ++i) {
    const std::optional<storage::ChunkKey> parent = parent_of(i);
    if (parent && !Cached(*parent)) break;  // kvcached: FAILED_PRECONDITION, stream ends
    const storage::ChunkKey& k = keys[i];
    if (ssd_.enabled()) {
      if (!ssd_.Has(k) && !Insert(ssd_, k, parent)) break;  // full of pinned chunks
      Insert(ram_, k, parent);                              // write-through, clean
    } else if (!Insert(ram_, k, parent)) {
      break;
    }
    Insert(hbm_, k, parent);
    ++out.stored;
    ++stored_;
  }
  return out;
}

SimReport TierSimulator::Report(double trace_seconds) const {
  SimReport r;
  r.requests = requests_;
  r.prompt_tokens = prompt_tokens_;
  r.hit_tokens = hit_tokens_;
  const double all = prompt_tokens_ > 0 ? static_cast<double>(prompt_tokens_) : 1.0;
  r.hit_rate = static_cast<double>(hit_tokens_) / all;
  r.hbm = hbm_.counters;
  r.ram = ram_.counters;
  r.ssd = ssd_.counters;
  for (TierCounters* t : {&r.hbm, &r.ram, &r.ssd})
    t->hit_rate = static_cast<double>(t->hit_tokens) / all;
  r.stored_chunks = stored_;
  r.trace_seconds = trace_seconds;
  r.ssd_write_bytes_per_day =
      trace_seconds > 0 ? static_cast<double>(r.ssd.written_bytes) / trace_seconds * 86400.0 : 0;
  return r;
}

std::vector<std::vector<storage::ChunkKey>> RequestKeys(const std::vector<Request>& requests,
                                                        int64_t chunk_tokens, uint32_t vocab_size,
                                                        const storage::ChunkKey& root) {
  std::vector<std::vector<storage::ChunkKey>> keys;
  keys.reserve(requests.size());
  for (const Request& r : requests) {
    const std::vector<uint32_t> tokens = PromptTokens(r, vocab_size);
    keys.push_back(client::ChunkKeys(root, tokens, static_cast<uint32_t>(chunk_tokens)));
  }
  return keys;
}

SimReport SimulateKeys(const std::vector<Request>& requests,
                       const std::vector<std::vector<storage::ChunkKey>>& keys,
                       const SimConfig& config) {
  TierSimulator sim(config);
  for (size_t i = 0; i < requests.size(); ++i) sim.Serve(keys[i], requests[i].input_tokens);
  return sim.Report(TraceSeconds(requests));
}

SimReport Simulate(const std::vector<Request>& requests, const SimConfig& config,
                   uint32_t vocab_size, const storage::ChunkKey& root) {
  return SimulateKeys(requests, RequestKeys(requests, config.chunk_tokens, vocab_size, root),
                      config);
}

nlohmann::json ReportToJson(const SimReport& r) {
  auto tier = [](const TierCounters& t) {
    return nlohmann::json{{"capacity_chunks", t.capacity_chunks}, {"hit_rate", t.hit_rate},
                          {"hit_tokens", t.hit_tokens},           {"read_bytes", t.read_bytes},
                          {"written_bytes", t.written_bytes},     {"evictions", t.evictions}};
  };
  return {{"requests", r.requests},
          {"prompt_tokens", r.prompt_tokens},
          {"hit_tokens", r.hit_tokens},
          {"hit_rate", r.hit_rate},
          {"tiers", {{"hbm", tier(r.hbm)}, {"ram", tier(r.ram)}, {"ssd", tier(r.ssd)}}},
          {"stored_chunks", r.stored_chunks},
          {"trace_seconds", r.trace_seconds},
          {"ssd_write_bytes_per_day", r.ssd_write_bytes_per_day}};
}

}  // namespace kvc::trace
