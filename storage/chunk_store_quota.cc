// Per-owner quotas (quota.h): the groups, what they hold, and making room for a put by
// evicting the group's own chunks.
#include <algorithm>

#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

ChunkStore::Impl::QuotaState* ChunkStore::Impl::QuotaOf(NamespaceId ns) {
  auto g = quota_group_of.find(ns);
  if (g == quota_group_of.end()) return nullptr;
  return &quota_groups[g->second];
}

uint64_t ChunkStore::Impl::RamBytesOf(const QuotaState& q) const {
  uint64_t bytes = 0;
  if (ram) {
    for (NamespaceId ns : q.namespaces) bytes += ram->BytesOf(ns);
  }
  return bytes;
}

uint64_t ChunkStore::Impl::SsdBytesOf(const QuotaState& q) const {
  uint64_t bytes = 0;
  for (NamespaceId ns : q.namespaces) bytes += ssd_order.BytesOf(ns);
  return bytes;
}

uint64_t ChunkStore::Impl::PinnedChunks() const {
  const int64_t now = NowS();
  uint64_t n = 0;
  for (const auto& [key, until] : pins) {
    n += until > now && ((ram && ram->Find(key) != nullptr) || ssd_map.contains(key));
  }
  return n;
}

uint64_t ChunkStore::Impl::PinnedChunksOf(QuotaGroup group) const {
  // A walk over the pins (few: leases of live sessions), not over every chunk.
  const int64_t now = NowS();
  uint64_t n = 0;
  for (const auto& [key, until] : pins) {
    if (until <= now) continue;
    const RamEntry* r = ram ? ram->Find(key) : nullptr;
    auto d = ssd_map.find(key);
    const std::optional<NamespaceId> ns = r != nullptr ? std::optional(r->ns)
                                          : d != ssd_map.end()
                                              ? std::optional(d->second.namespace_id)
                                              : std::nullopt;
    if (!ns) continue;
    auto g = quota_group_of.find(*ns);
    n += g != quota_group_of.end() && g->second == group;
  }
  return n;
}

absl::StatusOr<ChunkStore::Impl::QuotaState*> ChunkStore::Impl::FitRamQuota(NamespaceId ns,
                                                                            uint64_t bytes,
                                                                            bool allow_writeback) {
  QuotaState* q = QuotaOf(ns);
  if (q == nullptr) return nullptr;
  const uint64_t limit = q->quota.ram_bytes;
  while (limit > 0 && RamBytesOf(*q) + q->ram_in_flight + bytes > limit) {
    std::optional<ChunkKey> victim = ram->PickVictimAmong(ram->PoolOf(ns), NowS(), q->namespaces);
    if (!victim) return absl::ResourceExhaustedError(QuotaFullError(*q, "RAM", limit));
    KVC_RETURN_IF_ERROR(ReleaseRam(*victim, allow_writeback));
  }
  q->ram_in_flight += bytes;
  return q;
}

void ChunkStore::Impl::FitSsdQuota(std::vector<PendingWrite>& writes) {
  if (quota_groups.empty()) return;
  // What each limited group asks for in this batch, and its largest chunk.
  struct Ask {
    uint64_t bytes = 0, largest = 0;
  };
  // (The lambdas run under the caller's lock; the analysis reads each on its own.)
  auto asks = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unordered_map<QuotaState*, Ask> a;
    for (const PendingWrite& w : writes) {
      QuotaState* q = QuotaOf(w.record.namespace_id);
      if (q == nullptr || q->quota.ssd_bytes == 0 || !w.status.ok()) continue;
      const uint64_t charge = SsdSlotBytesFor(w.payload.size());  // the whole slot it takes
      a[q].bytes += charge;
      a[q].largest = std::max(a[q].largest, charge);
    }
    return a;
  };
  auto used = [&](const QuotaState& q)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return SsdBytesOf(q) + q.ssd_in_flight; };
  auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (const auto& [q, ask] : asks()) {
      if (used(*q) + ask.bytes > q->quota.ssd_bytes) return true;
    }
    return false;
  };
  // Evict the groups' own chunks. Only committed chunks are in the eviction order
  // (WriteToSsd), so a victim's deletion can never be overtaken by its own put's commit,
  // and other writers go on meanwhile. They may take the room made while the commit runs:
  // look again until it fits or nothing is left to give up (bounded, against a livelock).
  absl::Status evicted_status;
  bool all_pinned = false;
  for (int round = 0; round < 64 && over(); ++round) {
    all_pinned = false;
    std::vector<ChunkKey> victims;
    std::vector<SsdSlot> slots;
    for (const auto& [q, ask] : asks()) {
      const uint64_t limit = q->quota.ssd_bytes;
      if (used(*q) + ask.bytes <= limit) continue;
      // Run ahead by up to 32 chunks (1/64 of the limit at most): a group at its limit
      // then pays one synced commit per 32 writes, not one per write.
      const uint64_t ahead = std::min(limit / 64, 32 * ask.largest);
      while (used(*q) + ask.bytes + ahead > limit) {
        std::optional<ChunkKey> victim = ssd_order.PickVictimAmong(NowS(), q->namespaces);
        if (!victim) {
          all_pinned = used(*q) + ask.bytes > limit;
          break;
        }
        const NamespaceId victim_ns = ssd_map.at(*victim).namespace_id;
        slots.push_back(TakeOffSsd(*victim));
        if (!ram || !ram->Contains(*victim)) LeftStore(victim_ns, *victim);
        victims.push_back(*victim);
        ++stats.ssd_evictions;
        ++stats.quota_evictions;
      }
    }
    if (victims.empty()) break;  // all it holds there is pinned or being written
    evicted_status = CommitSsdRemovals(victims, slots);
    if (!evicted_status.ok()) break;
  }
  for (PendingWrite& w : writes) {
    QuotaState* q = QuotaOf(w.record.namespace_id);
    if (q == nullptr || !w.status.ok()) continue;
    const uint64_t limit = q->quota.ssd_bytes;
    const uint64_t charge = SsdSlotBytesFor(w.payload.size());
    if (limit > 0 && used(*q) + charge > limit) {
      w.status = !evicted_status.ok() ? evicted_status
                 : all_pinned ? absl::ResourceExhaustedError(QuotaFullError(*q, "SSD", limit))
                              : absl::ResourceExhaustedError(absl::StrCat(
                                    q->quota.owner, " is at its SSD quota of ", limit,
                                    " bytes with writes of its own in flight; try again"));
      continue;
    }
    q->ssd_in_flight += charge;
    w.charged = charge;
    w.quota = q;
  }
}

bool ChunkStore::Impl::Guarded(NamespaceId ns, bool in_ram) {
  const QuotaState* q = QuotaOf(ns);
  if (q == nullptr) return false;
  const uint64_t limit = in_ram ? q->quota.ram_bytes : q->quota.ssd_bytes;
  return limit > 0 && (in_ram ? RamBytesOf(*q) : SsdBytesOf(*q)) <= limit;
}

std::optional<ChunkKey> ChunkStore::Impl::PickRamVictim(RamPoolId pool) {
  if (quota_groups.empty()) return ram->PickVictim(pool, NowS());
  return ram->PickVictimIf(pool, NowS(), [&](NamespaceId ns) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !Guarded(ns, /*in_ram=*/true);
  });
}

std::optional<ChunkKey> ChunkStore::Impl::PickSsdVictim() {
  if (quota_groups.empty()) return ssd_order.PickVictim(NowS());
  return ssd_order.PickVictimIf(NowS(), [&](NamespaceId ns) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !Guarded(ns, /*in_ram=*/false);
  });
}

ChunkStore::QuotaRoom ChunkStore::Impl::QuotaRoomLocked() const {
  QuotaRoom room;
  if (ram) {
    room.ram_bytes = ram->capacity_bytes();
    room.ram_bytes_per_chunk = ram->LargestChunkBytesOf(0);
  }
  if (HasSsd()) {
    // Less what the tier keeps free for its own work: the slots eviction runs ahead by
    // (EnsureReserved) and the one a reservation names for the next — counted in the
    // first class's slots, which a typical chunk takes.
    const SsdCatalog& first = *classes[0]->catalog;
    const uint64_t slots = first.capacity();
    const uint64_t kept = first.EvictAhead() + 1;
    room.ssd_bytes = (slots > kept ? slots - kept : 0) * slot_bytes;
    room.ssd_bytes_per_chunk = slot_bytes;
  }
  return room;
}

// ---- the public calls ----

ChunkStore::QuotaRoom ChunkStore::QuotaCapacity() const {
  MutexLock lk(impl_->mu);
  return impl_->QuotaRoomLocked();
}

absl::Status ChunkStore::SetQuota(QuotaGroup group, const Quota& quota, bool must_fit) {
  if (group == 0) return absl::InvalidArgumentError("quota group 0 is the one without a quota");
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (must_fit) {
    uint64_t ram = quota.ram_bytes, ssd = quota.ssd_bytes;
    for (const auto& [g, q] : s.quota_groups) {
      if (g == group) continue;
      ram += q.quota.ram_bytes;
      ssd += q.quota.ssd_bytes;
    }
    const QuotaRoom room = s.QuotaRoomLocked();
    // Names the owner's own quota and the tier, not the others' sum: the owner is a
    // tenant, and the other tenants' quotas are not its to know (docs/security.md).
    auto refuse = [&](const char* tier, uint64_t, uint64_t) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the quota of ", quota.owner, " does not fit beside the quotas already granted in ", tier,
          " (a chunk is charged the whole slot it takes); the operator can lower them or "
          "give the tier more room"));
    };
    if (s.ram && quota.ram_bytes > 0 && ram > room.ram_bytes)
      return refuse("RAM", ram, room.ram_bytes);
    if (s.HasSsd() && quota.ssd_bytes > 0 && ssd > room.ssd_bytes)
      return refuse("SSD", ssd, room.ssd_bytes);
  }
  s.quota_groups[group].quota = quota;
  return absl::OkStatus();
}

void ChunkStore::SetQuotaGroup(NamespaceId ns, QuotaGroup group) {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (auto old = s.quota_group_of.find(ns); old != s.quota_group_of.end()) {
    std::vector<NamespaceId>& members = s.quota_groups[old->second].namespaces;
    members.erase(std::remove(members.begin(), members.end(), ns), members.end());
    s.quota_group_of.erase(old);
  }
  if (group == 0) return;
  s.quota_group_of[ns] = group;
  s.quota_groups[group].namespaces.push_back(ns);
}

QuotaUsage ChunkStore::Usage(QuotaGroup group) const {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  (void)s.WaitLoaded();
  QuotaUsage u;
  auto g = s.quota_groups.find(group);
  if (g == s.quota_groups.end()) return u;
  u.ram_bytes = s.RamBytesOf(g->second);
  u.ssd_bytes = s.SsdBytesOf(g->second);
  u.pinned_chunks = s.PinnedChunksOf(group);
  return u;
}

}  // namespace kvc::storage
