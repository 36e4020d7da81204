#include "storage/ram_tier.h"

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"

namespace kvc::storage {

absl::StatusOr<std::unique_ptr<RamTier>> RamTier::Create(uint64_t slot_bytes,
                                                         std::span<const uint64_t> pool_bytes,
                                                         bool prefault) {
  auto tier = std::make_unique<RamTier>();
  const uint64_t rounded = RamSlotBytes(slot_bytes);
  tier->pools_.resize(pool_bytes.size());
  for (size_t i = 0; i < pool_bytes.size(); ++i) {
    const uint64_t slots = rounded == 0 ? 0 : pool_bytes[i] / rounded;
    if (slots == 0) continue;
    if (slots > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("RAM pool ", i, " of ", pool_bytes[i], " bytes has too many slots"));
    }
    KVC_ASSIGN_OR_RETURN(std::unique_ptr<RamArena> arena,
                         RamArena::Create(rounded, static_cast<uint32_t>(slots),
                                          absl::StrCat("kvcache-ram-pool-", i), prefault));
    Pool& p = tier->pools_[i];
    p.arena = std::move(arena);
    p.refs.assign(slots, 0);
    p.state.assign(slots, kFree);
    p.keys.assign(slots, ChunkKey{});
    for (uint32_t s = static_cast<uint32_t>(slots); s-- > 0;) p.free.push_back(s);
    tier->capacity_slots_ += slots;
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

std::optional<uint32_t> RamTier::TakeFreeSlot(RamPoolId pool) {
  Pool& p = pools_.at(pool);
  if (p.free.empty()) return std::nullopt;
  const uint32_t slot = p.free.back();
  p.free.pop_back();
  KVC_CHECK(p.state[slot] == kFree) << "RAM pool " << pool << " slot " << slot
                                    << " was on the free list in state " << int{p.state[slot]};
  p.state[slot] = kReserved;
  return slot;
}

void RamTier::ReturnSlot(RamPoolId pool, uint32_t slot) {
  Pool& p = pools_.at(pool);
  KVC_CHECK(p.state.at(slot) == kReserved)
      << "RAM pool " << pool << " slot " << slot << " returned but not reserved";
  Free(p, slot);
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
  for (const Pool& p : pools_) bytes += p.arena ? p.arena->verdict_offset() : 0;  // the slots
  return bytes;
}

uint64_t RamTier::BytesOf(NamespaceId ns) const {
  uint64_t bytes = 0;
  for (const Pool& p : pools_) bytes += p.order.BytesOf(ns);
  return bytes;
}

void RamTier::Publish(const ChunkKey& key, const RamEntry& entry, int64_t access_us) {
  Pool& p = pools_.at(entry.pool);
  KVC_CHECK(p.state.at(entry.slot) == kReserved)
      << "RAM pool " << entry.pool << " slot " << entry.slot << " published but not reserved";
  KVC_CHECK(!entries_.contains(key)) << "chunk " << key.Hex() << " published twice";
  p.state[entry.slot] = kUsed;
  p.keys[entry.slot] = key;
  entries_[key] = entry;
  // Charged the whole slot it takes (quota.h), not its payload.
  p.order.Add(key, entry.parent, access_us, 0, entry.expires_s, entry.ns, p.arena->slot_bytes());
}

void RamTier::Remove(const ChunkKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Pool& p = pools_[it->second.pool];
  const uint32_t slot = it->second.slot;
  p.order.Remove(key);
  entries_.erase(it);
  KVC_CHECK(p.state[slot] == kUsed) << "RAM slot " << slot << " of a chunk was not in use";
  if (p.refs[slot] == 0) {
    Free(p, slot);
  } else {
    p.state[slot] = kFreeOnRelease;
  }
}

const ChunkKey* RamTier::KeyAt(RamPoolId pool, uint32_t slot) const {
  const Pool& p = pools_.at(pool);
  if (slot >= p.state.size() || p.state[slot] != kUsed) return nullptr;
  return &p.keys[slot];
}

uint32_t RamTier::SlotCount(RamPoolId pool) const {
  return static_cast<uint32_t>(pools_.at(pool).state.size());
}

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
  Pool& p = pools_.at(pool);
  KVC_CHECK(p.state.at(slot) == kUsed) << "lease taken on RAM pool " << pool << " slot " << slot
                                       << " in state " << int{p.state[slot]};
  ++p.refs[slot];
}

void RamTier::Unref(RamPoolId pool, uint32_t slot) {
  Pool& p = pools_.at(pool);
  KVC_CHECK(p.refs.at(slot) > 0) << "RAM pool " << pool << " slot " << slot
                                 << " released more often than leased";
  if (--p.refs[slot] == 0 && p.state[slot] == kFreeOnRelease) Free(p, slot);
}

absl::Status RamTier::CheckConsistency() const {
  std::vector<std::vector<uint32_t>> users(pools_.size());  // per pool and slot: chunks in it
  for (size_t i = 0; i < pools_.size(); ++i) users[i].assign(pools_[i].state.size(), 0);
  std::vector<size_t> chunks(pools_.size(), 0);
  for (const auto& [key, e] : entries_) {
    if (e.pool >= pools_.size() || e.slot >= pools_[e.pool].state.size()) {
      return absl::InternalError(absl::StrCat("RAM chunk ", key.Hex(), " names pool ", e.pool,
                                              " slot ", e.slot, ", which does not exist"));
    }
    if (pools_[e.pool].state[e.slot] != kUsed || ++users[e.pool][e.slot] > 1) {
      return absl::InternalError(absl::StrCat(
          "RAM pool ", e.pool, " slot ", e.slot, " holds chunk ", key.Hex(), " but is in state ",
          int{pools_[e.pool].state[e.slot]}, " with ", users[e.pool][e.slot], " chunks"));
    }
    if (!pools_[e.pool].order.Contains(key)) {
      return absl::InternalError(absl::StrCat("RAM chunk ", key.Hex(), " of pool ", e.pool,
                                              " is not in its eviction order"));
    }
    ++chunks[e.pool];
  }
  for (size_t i = 0; i < pools_.size(); ++i) {
    const Pool& p = pools_[i];
    std::vector<bool> listed(p.state.size(), false);
    for (uint32_t slot : p.free) {
      if (slot >= p.state.size() || p.state[slot] != kFree || listed[slot]) {
        return absl::InternalError(
            absl::StrCat("RAM pool ", i, " lists slot ", slot, " as free twice or while not free"));
      }
      listed[slot] = true;
    }
    for (size_t slot = 0; slot < p.state.size(); ++slot) {
      const bool fine = (p.state[slot] == kFree && listed[slot]) ||
                        (p.state[slot] == kUsed && users[i][slot] == 1) ||
                        (p.state[slot] == kFreeOnRelease && p.refs[slot] > 0);
      if (!fine || p.refs[slot] < 0) {
        return absl::InternalError(absl::StrCat(
            "RAM pool ", i, " slot ", slot, " is in state ", int{p.state[slot]}, " with ",
            p.refs[slot], " leases, ", users[i][slot], " chunks, ", listed[slot] ? "on" : "not on",
            " the free list (lost, or reserved by nobody)"));
      }
    }
    if (p.order.size() != chunks[i]) {
      return absl::InternalError(absl::StrCat("RAM pool ", i, " orders ", p.order.size(),
                                              " chunks for eviction but holds ", chunks[i]));
    }
  }
  return absl::OkStatus();
}

void RamTier::Free(Pool& p, uint32_t slot) {
  KVC_CHECK(p.state[slot] != kFree) << "RAM slot " << slot << " freed twice";
  p.state[slot] = kFree;
  p.free.push_back(slot);
}

}  // namespace kvc::storage
