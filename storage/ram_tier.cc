#include "storage/ram_tier.h"

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"

namespace kvc::storage {

absl::StatusOr<std::unique_ptr<RamTier>> RamTier::Create(uint64_t max_chunk_bytes,
                                                         std::span<const uint64_t> pool_bytes,
                                                         bool prefault) {
  auto tier = std::make_unique<RamTier>();
  tier->max_chunk_bytes_ = RamSlotBytes(max_chunk_bytes);
  tier->pools_.resize(pool_bytes.size());
  for (size_t i = 0; i < pool_bytes.size(); ++i) {
    const uint64_t pages = pool_bytes[i] / kRamPageBytes;
    if (pool_bytes[i] < tier->max_chunk_bytes_ || pages == 0) continue;  // not one chunk
    if (pages > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("RAM pool ", i, " of ", pool_bytes[i], " bytes has too many pages"));
    }
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<RamArena> arena,
                         RamArena::Create(kRamPageBytes, static_cast<uint32_t>(pages),
                                          absl::StrCat("kvcache-ram-pool-", i), prefault));
    Pool& p = tier->pools_[i];
    p.arena = std::move(arena);
    p.pages = static_cast<uint32_t>(pages);
    tier->AddFreeRun(p, 0, p.pages);
    tier->capacity_slots_ += pages * kRamPageBytes / tier->max_chunk_bytes_;
  }
  return tier;
}

absl::Status RamTier::SetPool(NamespaceId ns, RamPoolId pool) {
  if (pool >= pools_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RAM pool ", pool, " does not exist (", pools_.size(), " pools)"));
  }
  pool_of_[ns] = pool;
  return absl::OkStatus();
}

RamPoolId RamTier::PoolOf(NamespaceId ns) const {
  auto it = pool_of_.find(ns);
  return it == pool_of_.end() ? 0 : it->second;
}

RamEntry* RamTier::Find(const ChunkKey& key) {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

const RamEntry* RamTier::Find(const ChunkKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

RamEntry* RamTier::FindIn(NamespaceId ns, const ChunkKey& key) {
  RamEntry* e = Find(key);
  return e != nullptr && e->ns == ns ? e : nullptr;
}

void RamTier::AddFreeRun(Pool& p, uint32_t first, uint32_t pages) {
  KVC_CHECK(pages > 0 && uint64_t{first} + pages <= p.pages);
  KVC_CHECK(p.free_runs.emplace(first, pages).second) << "RAM page " << first << " freed twice";
  p.free_by_size.emplace(pages, first);
}

void RamTier::EraseFreeRun(Pool& p, std::map<uint32_t, uint32_t>::iterator it) {
  p.free_by_size.erase({it->second, it->first});
  p.free_runs.erase(it);
}

std::optional<uint32_t> RamTier::TakeFreeSlot(RamPoolId pool, uint64_t payload_bytes) {
  Pool& p = pools_.at(pool);
  const uint64_t need = RamSlotBytes(payload_bytes) / kRamPageBytes;
  if (need > p.pages) return std::nullopt;
  // Best fit: the shortest free run that holds it, the lowest of those.
  auto fit = p.free_by_size.lower_bound({static_cast<uint32_t>(need), 0});
  if (fit == p.free_by_size.end()) return std::nullopt;
  const auto [pages, first] = *fit;
  EraseFreeRun(p, p.free_runs.find(first));
  if (pages > need) {
    AddFreeRun(p, first + static_cast<uint32_t>(need), pages - static_cast<uint32_t>(need));
  }
  Run& run = p.runs[first];
  run = Run{static_cast<uint32_t>(need), kReserved, 0, {}};
  return first;
}

RamTier::Run& RamTier::RunAt(RamPoolId pool, uint32_t first, const char* what) {
  Pool& p = pools_.at(pool);
  auto it = p.runs.find(first);
  KVC_CHECK(it != p.runs.end()) << what << " RAM pool " << pool << " page " << first
                                << ", where no run starts";
  return it->second;
}

void RamTier::ReturnSlot(RamPoolId pool, uint32_t slot) {
  KVC_CHECK(RunAt(pool, slot, "returned").state == kReserved)
      << "RAM pool " << pool << " page " << slot << " returned but not reserved";
  Free(pools_[pool], slot);
}

std::optional<ChunkKey> RamTier::PickVictim(RamPoolId pool, int64_t now_s) const {
  return pools_.at(pool).order.PickVictim(now_s);
}

std::optional<ChunkKey> RamTier::PickVictimAmong(RamPoolId pool, int64_t now_s,
                                                 std::span<const NamespaceId> namespaces) const {
  return pools_.at(pool).order.PickVictimAmong(now_s, namespaces);
}

uint64_t RamTier::capacity_bytes() const {
  uint64_t bytes = 0;
  for (const Pool& p : pools_) bytes += uint64_t{p.pages} * kRamPageBytes;
  return bytes;
}

uint64_t RamTier::FreeBytes(RamPoolId pool) const {
  uint64_t pages = 0;
  for (const auto& [first, n] : pools_.at(pool).free_runs) pages += n;
  return pages * kRamPageBytes;
}

uint64_t RamTier::BytesOf(NamespaceId ns) const {
  uint64_t bytes = 0;
  for (const Pool& p : pools_) bytes += p.order.BytesOf(ns);
  return bytes;
}

void RamTier::Publish(const ChunkKey& key, const RamEntry& entry, int64_t access_us) {
  Run& run = RunAt(entry.pool, entry.slot, "published at");
  KVC_CHECK(run.state == kReserved)
      << "RAM pool " << entry.pool << " page " << entry.slot << " published but not reserved";
  KVC_CHECK(RamSlotBytes(entry.len) == uint64_t{run.pages} * kRamPageBytes)
      << "a chunk of " << entry.len << " bytes published in a run of " << run.pages << " pages";
  KVC_CHECK(!entries_.contains(key)) << "chunk " << key.Hex() << " published twice";
  run.state = kUsed;
  run.key = key;
  entries_[key] = entry;
  // Charged the pages it takes (quota.h).
  pools_[entry.pool].order.Add(key, entry.parent, access_us, 0, entry.expires_s, entry.ns,
                               RamSlotBytes(entry.len));
}

void RamTier::Remove(const ChunkKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  const RamPoolId pool = it->second.pool;
  const uint32_t slot = it->second.slot;
  pools_[pool].order.Remove(key);
  entries_.erase(it);
  Run& run = RunAt(pool, slot, "removed from");
  KVC_CHECK(run.state == kUsed) << "RAM run at page " << slot << " of a chunk was not in use";
  if (run.refs == 0) {
    Free(pools_[pool], slot);
  } else {
    run.state = kFreeOnRelease;
  }
}

const ChunkKey* RamTier::KeyAt(RamPoolId pool, uint32_t slot) const {
  const Pool& p = pools_.at(pool);
  auto it = p.runs.find(slot);
  if (it == p.runs.end() || it->second.state != kUsed) return nullptr;
  return &it->second.key;
}

uint32_t RamTier::SlotCount(RamPoolId pool) const { return pools_.at(pool).pages; }

uint64_t RamTier::CountIn(const std::set<NamespaceId>& namespaces) const {
  uint64_t n = 0;
  for (const auto& [key, e] : entries_) n += namespaces.contains(e.ns);
  return n;
}

void RamTier::Touch(const ChunkKey& key, int64_t access_us) {
  if (const RamEntry* e = Find(key)) pools_[e->pool].order.Touch(key, access_us);
}

void RamTier::MarkOrphansOf(const ChunkKey& parent) {
  for (Pool& p : pools_) p.order.MarkOrphansOf(parent);
}

void RamTier::Ref(RamPoolId pool, uint32_t slot) {
  Run& run = RunAt(pool, slot, "lease taken on");
  KVC_CHECK(run.state == kUsed) << "lease taken on RAM pool " << pool << " page " << slot
                                << " in state " << int{run.state};
  ++run.refs;
}

void RamTier::Unref(RamPoolId pool, uint32_t slot) {
  Run& run = RunAt(pool, slot, "lease released on");
  KVC_CHECK(run.refs > 0) << "RAM pool " << pool << " page " << slot
                          << " released more often than leased";
  if (--run.refs == 0 && run.state == kFreeOnRelease) Free(pools_[pool], slot);
}

absl::Status RamTier::CheckConsistency() const {
  std::vector<size_t> chunks(pools_.size(), 0);
  for (const auto& [key, e] : entries_) {
    const Run* run = nullptr;
    if (e.pool < pools_.size()) {
      auto it = pools_[e.pool].runs.find(e.slot);
      if (it != pools_[e.pool].runs.end()) run = &it->second;
    }
    if (run == nullptr) {
      return absl::InternalError(absl::StrCat("RAM chunk ", key.Hex(), " names pool ", e.pool,
                                              " page ", e.slot, ", where no run starts"));
    }
    if (run->state != kUsed || !(run->key == key) ||
        uint64_t{run->pages} * kRamPageBytes != RamSlotBytes(e.len)) {
      return absl::InternalError(absl::StrCat(
          "RAM pool ", e.pool, " page ", e.slot, " holds chunk ", key.Hex(), " of ", e.len,
          " bytes but its run is in state ", int{run->state}, ", ", run->pages, " pages long"));
    }
    if (!pools_[e.pool].order.Contains(key)) {
      return absl::InternalError(absl::StrCat("RAM chunk ", key.Hex(), " of pool ", e.pool,
                                              " is not in its eviction order"));
    }
    ++chunks[e.pool];
  }
  for (size_t i = 0; i < pools_.size(); ++i) {
    const Pool& p = pools_[i];
    // Every page in exactly one run, free or taken; free runs never side by side.
    std::map<uint32_t, std::pair<uint32_t, bool>> all;  // first page → (pages, free)
    for (const auto& [first, pages] : p.free_runs) {
      all[first] = {pages, true};
      if (!p.free_by_size.contains({pages, first})) {
        return absl::InternalError(absl::StrCat("RAM pool ", i, " free run at page ", first,
                                                " is missing from the best-fit index"));
      }
    }
    if (p.free_by_size.size() != p.free_runs.size()) {
      return absl::InternalError(absl::StrCat("RAM pool ", i, " indexes ", p.free_by_size.size(),
                                              " free runs for ", p.free_runs.size()));
    }
    for (const auto& [first, run] : p.runs) {
      const bool fine = (run.state == kUsed && entries_.contains(run.key) &&
                         entries_.at(run.key).pool == i && entries_.at(run.key).slot == first) ||
                        (run.state == kFreeOnRelease && run.refs > 0);
      if (!fine || run.refs < 0) {
        return absl::InternalError(absl::StrCat("RAM pool ", i, " run at page ", first,
                                                " is in state ", int{run.state}, " with ", run.refs,
                                                " leases (lost, or reserved by nobody)"));
      }
      if (!all.emplace(first, std::pair{run.pages, false}).second) {
        return absl::InternalError(
            absl::StrCat("RAM pool ", i, " page ", first, " starts a free and a taken run"));
      }
    }
    uint32_t next = 0;
    bool last_free = false;
    for (const auto& [first, run] : all) {
      const auto [pages, free] = run;
      if (first != next || pages == 0) {
        return absl::InternalError(absl::StrCat("RAM pool ", i, " pages ", next, "..", first,
                                                first < next ? " are in two runs" : " are lost"));
      }
      if (free && last_free) {
        return absl::InternalError(
            absl::StrCat("RAM pool ", i, " free run at page ", first, " was not merged"));
      }
      last_free = free;
      next = first + pages;
    }
    if (next != p.pages) {
      return absl::InternalError(
          absl::StrCat("RAM pool ", i, " runs end at page ", next, " of ", p.pages));
    }
    if (p.order.size() != chunks[i]) {
      return absl::InternalError(absl::StrCat("RAM pool ", i, " orders ", p.order.size(),
                                              " chunks for eviction but holds ", chunks[i]));
    }
  }
  return absl::OkStatus();
}

void RamTier::Free(Pool& p, uint32_t first) {
  auto it = p.runs.find(first);
  KVC_CHECK(it != p.runs.end()) << "RAM page " << first << " freed twice";
  uint32_t start = first;
  uint32_t pages = it->second.pages;
  p.runs.erase(it);
  // Merge with the free runs just after and just before.
  if (auto after = p.free_runs.find(start + pages); after != p.free_runs.end()) {
    pages += after->second;
    EraseFreeRun(p, after);
  }
  if (auto before = p.free_runs.lower_bound(start); before != p.free_runs.begin()) {
    --before;
    if (before->first + before->second == start) {
      start = before->first;
      pages += before->second;
      EraseFreeRun(p, before);
    }
  }
  AddFreeRun(p, start, pages);
}

}  // namespace kvc::storage
