// The RAM and SSD tiers under the store's mutex: placement, eviction, demotion (write-back)
// and the write-behind writer.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/file.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

// ---- RAM tier (all under mu) ----
void ChunkStore::Impl::DropRam(const ChunkKey& key) {
  const RamEntry* e = ram ? ram->Find(key) : nullptr;
  if (e == nullptr) return;
  const NamespaceId ns = e->ns;
  ram->Remove(key);
  if (!ssd_map.contains(key)) LeftStore(ns, key);
}

// A RAM copy whose bytes no longer match their checksum (memory corruption): a miss,
// counted, and the copy is dropped. Never handed out.
void ChunkStore::Impl::DropCorruptRam(const ChunkKey& key) {
  ++stats.checksum_failures;
  ++stats.ram_checksum_failures;
  RamEntry* e = ram->Find(key);
  if (e == nullptr) return;
  // Clients holding leases in this arena hear of it before their next copy (ram_arena.h).
  if (const RamArena* arena = ram->arena(e->pool); arena != nullptr) arena->AddVerdict();
  // Still dirty: the only copy is bad, nothing to write to SSD.
  e->dirty = false;
  DropRam(key);
}

// `key` is in neither tier any more: the chunks after it can no longer be reached by
// a lookup, so they are the first to go.
void ChunkStore::Impl::LeftStore(NamespaceId ns, const ChunkKey& key) {
  if (ram) ram->MarkOrphansOf(key);
  ssd_order.MarkOrphansOf(key);
  if (hbm) hbm->Erase(ns, key);
}

// A free run of the RAM pool for a chunk of `bytes`, evicting from that pool as needed.
// With allow_writeback, dirty victims are written to SSD first (demotion); without, the
// call gives up instead of waiting on I/O.
absl::StatusOr<uint32_t> ChunkStore::Impl::AllocRamSlot(RamPoolId pool, uint64_t bytes,
                                                        bool allow_writeback) {
  while (true) {
    if (std::optional<uint32_t> slot = ram->TakeFreeSlot(pool, bytes)) return *slot;
    std::optional<ChunkKey> victim = PickRamVictim(pool);
    if (!victim) {
      // Says why, not how full the tier is or with whose chunks: the caller is one tenant
      // of many (docs/security.md); Stats gives an operator the counts.
      return absl::ResourceExhaustedError(absl::StrCat(
          pool == 0 ? std::string("the RAM tier") : absl::StrCat("RAM pool ", pool),
          " is full and nothing in it can give way (pinned, leased or unwritten chunks, or "
          "chunks of tenants within their quotas)"));
    }
    KVC_RETURN_IF_ERROR(ReleaseRam(*victim, allow_writeback));
  }
}

absl::Status ChunkStore::Impl::ReleaseRam(const ChunkKey& victim, bool allow_writeback) {
  RamEntry& e = *ram->Find(victim);
  if (e.dirty && HasSsd()) {
    if (!allow_writeback) return WouldBlockError("making room in RAM (a chunk not yet on SSD)");
    if (e.flushing) {
      flush_done.wait(mu);
      return absl::OkStatus();
    }
    FlushLocked({victim});
    const RamEntry* again = ram->Find(victim);
    if (again != nullptr && again->dirty && !again->flushing) {
      return absl::InternalError(absl::StrCat("cannot demote ", Where(victim), " to SSD"));
    }
    ++stats.demotions;
    return absl::OkStatus();
  }
  DropRam(victim);
  ++stats.ram_evictions;
  return absl::OkStatus();
}

// Copies bytes into a fresh slot of the namespace's RAM pool and publishes it. The copy
// runs without the lock: the reserved slot is in neither the free list nor the map, so
// nobody else sees it. `checksum` is the payload's, if the caller knows it (0: computed
// here from the copy).
absl::Status ChunkStore::Impl::InsertRam(NamespaceId ns, const ChunkKey& key,
                                         const std::optional<ChunkKey>& parent,
                                         const std::optional<ChunkOrigin>& origin,
                                         const Payload& bytes, uint64_t checksum, bool dirty,
                                         int64_t expires_s, bool allow_writeback) {
  const RamPoolId pool = ram->PoolOf(ns);
  const uint64_t charged = RamSlotBytes(bytes.size());  // the pages it takes (quota.h)
  KVC_ASSIGN_OR_RETURN(QuotaState * quota, FitRamQuota(ns, charged, allow_writeback));
  auto done_in_flight = [&] {
    if (quota != nullptr) quota->ram_in_flight -= charged;
  };
  absl::StatusOr<uint32_t> slot = AllocRamSlot(pool, bytes.size(), allow_writeback);
  if (!slot.ok()) {
    done_in_flight();
    return slot.status();
  }
  mu.unlock();
  uint8_t* dst = ram_arenas()->SlotData(pool, *slot);
  if (checksum == 0) {  // hashed block by block as copied: one pass over the bytes
    checksum = bytes.CopyWithChecksum(dst);
  } else {
    bytes.CopyTo(dst);
  }
  mu.lock();
  done_in_flight();
  if (ram->Contains(key)) {  // another writer won the race
    ram->ReturnSlot(pool, *slot);
    return absl::AlreadyExistsError(Where(key));
  }
  RamEntry e;
  e.ns = ns;
  e.pool = pool;
  e.slot = *slot;
  e.len = static_cast<uint32_t>(bytes.size());
  e.checksum = checksum;
  e.parent = parent;
  e.origin = origin;
  e.expires_s = expires_s;
  e.dirty = dirty;
  ram->Publish(key, e, NextAccess());
  if (dirty) {
    dirty_queue.push_back(key);
    work.notify_one();
  }
  return absl::OkStatus();
}

// ---- SSD tier (all under mu) ----
absl::StatusOr<std::unique_ptr<ChunkStore::Impl::SsdClass>> ChunkStore::Impl::OpenClass(
    uint32_t code, uint64_t bytes, uint64_t slots_per_slab, uint16_t format, bool lay_out_ahead) {
  auto c = std::make_unique<SsdClass>();
  c->code = code;
  c->slot_bytes = bytes;
  c->slots_per_slab = slots_per_slab;
  c->reservation_meta =
      code == 0 ? std::string(kReservationMeta) : absl::StrCat(kReservationMeta, "/c", bytes);
  // Every class may grow to the whole budget; the catalog and the tier cost what is used.
  const uint64_t capacity = ssd_budget / bytes;
  SsdTierOptions so;
  so.dir = code == 0 ? opt.data_dir + "/slabs" : absl::StrCat(opt.data_dir, "/slabs/c", bytes);
  so.slot_bytes = bytes;
  so.capacity_slots = capacity;
  so.slots_per_slab = slots_per_slab;
  so.backend = opt.io_backend;
  so.queue_depth = opt.queue_depth;
  so.lanes = opt.io_lanes;
  so.slot_format = format;
  so.faults = seams.faults;
  so.power_cut = seams.power_cut;
  so.lay_out_ahead = lay_out_ahead;
  KVC_ASSIGN_OR_RETURN(c->tier, SsdTier::Open(so));
  c->catalog = std::make_unique<SsdCatalog>(capacity, bytes, sequence);
  return c;
}

absl::StatusOr<std::unique_ptr<ChunkStore::Impl::SsdClass>> ChunkStore::Impl::OpenFurtherClass(
    uint64_t bytes) {
  return OpenClass(static_cast<uint32_t>(bytes), bytes, std::max<uint64_t>(1, slab_bytes / bytes),
                   kSlotFormatVersion, opt.preallocate_ssd_background);
}

std::string ChunkStore::Impl::FurtherClassList() const {
  ClassList cls;
  for (const auto& c : classes) cls.push_back(c.get());
  return FurtherClassListOf(cls);
}

absl::StatusOr<ChunkStore::Impl::SsdClass*> ChunkStore::Impl::ClassFor(uint64_t payload_bytes) {
  const uint64_t bytes = SsdSlotBytesFor(payload_bytes);
  if (bytes == slot_bytes) return classes[0].get();
  for (const auto& c : classes) {
    if (c->code == bytes) return c.get();
  }
  if (bytes > ssd_budget || bytes > UINT32_MAX) {
    return absl::ResourceExhaustedError(absl::StrCat("a chunk of ", payload_bytes,
                                                     " bytes takes a slot of ", bytes,
                                                     ", more than the SSD tier's ", ssd_budget));
  }
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<SsdClass> c, OpenFurtherClass(bytes));
  // The class's folder entry, then the class in the index's list (synced), before any of
  // its slots is reserved: an open finds it either way (the list, or the folder; so a
  // class kept after a failed commit here is found again too).
  KVC_RETURN_IF_ERROR(SyncDirectory(opt.data_dir + "/slabs"));
  classes.push_back(std::move(c));
  KVC_RETURN_IF_ERROR(index->Commit({}, {}, /*sync=*/true, {{"ssd_classes", FurtherClassList()}}));
  return classes.back().get();
}

std::vector<absl::Status> ChunkStore::Impl::ReadSlots(std::span<SlotRead> reads,
                                                      std::span<SsdClass* const> cls) {
  // Nearly always one class (a namespace's chunks are of one size).
  if (std::all_of(cls.begin(), cls.end(), [&](SsdClass* c) { return c == cls[0]; }))
    return cls[0]->tier->Read(reads);
  std::vector<absl::Status> status(reads.size());
  std::vector<SsdClass*> done;
  for (size_t first = 0; first < reads.size(); ++first) {
    SsdClass* c = cls[first];
    if (std::find(done.begin(), done.end(), c) != done.end()) continue;
    done.push_back(c);
    std::vector<SlotRead> of_class;
    std::vector<size_t> at;
    for (size_t k = first; k < reads.size(); ++k) {
      if (cls[k] != c) continue;
      of_class.push_back(reads[k]);
      at.push_back(k);
    }
    std::vector<absl::Status> io = c->tier->Read(of_class);
    for (size_t j = 0; j < at.size(); ++j) status[at[j]] = std::move(io[j]);
  }
  return status;
}

void ChunkStore::Impl::GiveBackEmptySlabs() {
  // A class left empty names its lowest free slot for its next reservation (one synced
  // record), so that no slot in use holds its slabs above it.
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<SsdClass*> renamed;
  for (const auto& c : classes) {
    if (std::optional<SlotReservation> record = c->catalog->PlanRenameIfEmpty()) {
      meta.emplace_back(c->reservation_meta, EncodeSlotReservation(*record));
      renamed.push_back(c.get());
    }
  }
  if (!renamed.empty()) {
    mu.unlock();
    const absl::Status committed = index->Commit({}, {}, /*sync=*/true, meta);
    mu.lock();
    for (SsdClass* c : renamed) c->catalog->FinishRename(committed.ok());
    reservation_cv.notify_all();
  }
  for (const auto& c : classes) {
    const std::optional<uint64_t> kept = c->catalog->TrimFree();
    if (!kept) continue;
    // Whole slabs past the last slot kept; done before the lock is let go, so no write can
    // take one of their slots meanwhile. A failure costs disk space, nothing else.
    const uint64_t first = (*kept + c->slots_per_slab - 1) / c->slots_per_slab;
    if (absl::Status s = c->tier->RemoveSlabsFrom(first); !s.ok()) {
      std::fprintf(stderr, "kvcache storage: giving back empty slabs: %s\n",
                   std::string(s.message()).c_str());
    }
  }
}

void ChunkStore::Impl::RemoveSsd(const ChunkKey& key) {
  auto d = ssd_map.find(key);
  if (d == ssd_map.end()) return;
  const NamespaceId ns = d->second.namespace_id;
  const SsdSlot at = TakeOffSsd(key);
  at.cls->catalog->Free(at.slot);
  // A RAM copy stays, but it is no longer backed by SSD and is not rewritten.
  if (!ram || !ram->Contains(key)) LeftStore(ns, key);
}

absl::Status ChunkStore::Impl::CommitSsdRemovals(const std::vector<ChunkKey>& keys,
                                                 const std::vector<SsdSlot>& slots) {
  std::vector<SsdClass*> involved;
  for (const SsdSlot& at : slots) {
    if (std::find(involved.begin(), involved.end(), at.cls) == involved.end())
      involved.push_back(at.cls);
  }
  auto busy = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (SsdClass* c : involved) {
      if (c->catalog->record_busy()) return true;
    }
    return false;
  };
  while (busy()) reservation_cv.wait(mu);
  // A slot still listed in its class's reservation leaves the record in the same commit.
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<SsdClass*> recorded;
  for (SsdClass* c : involved) {
    std::vector<uint64_t> of_class;
    for (const SsdSlot& at : slots) {
      if (at.cls == c) of_class.push_back(at.slot);
    }
    if (const std::optional<SlotReservation> record = c->catalog->PlanRemoval(of_class)) {
      meta.emplace_back(c->reservation_meta, EncodeSlotReservation(*record));
      recorded.push_back(c);
    }
  }
  mu.unlock();
  const absl::Status committed = index->Commit({}, keys, /*sync=*/true, meta);
  mu.lock();
  for (SsdClass* c : recorded) c->catalog->FinishRemoval();
  if (!recorded.empty()) reservation_cv.notify_all();
  if (!committed.ok()) {
    for (const SsdSlot& at : slots) at.cls->catalog->HoldBack(at.slot);
    return committed;
  }
  for (const SsdSlot& at : slots) at.cls->catalog->Free(at.slot);
  return absl::OkStatus();
}

absl::Status ChunkStore::Impl::EnsureReserved(SsdClass& cls, size_t n) {
  SsdCatalog& catalog = *cls.catalog;
  while (catalog.record_busy()) reservation_cv.wait(mu);
  if (catalog.reserved_free() >= n) return absl::OkStatus();
  // Writes in flight go to slots of the current reservation; once their entries are
  // committed, this reservation's synced commit makes them durable, and the slots they
  // used need no listing any more.
  catalog.BeginReservation();
  while (catalog.in_flight() != 0) reservation_cv.wait(mu);
  const size_t missing = n - std::min(n, catalog.reserved_free());
  // The slots of this class the device budget has room for (what every class takes now
  // is counted, reserved slots included, less what other classes are releasing to it).
  uint64_t released_bytes = 0;
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const uint64_t taken = SsdTakenBytes() - released_bytes;
    return static_cast<size_t>(taken >= ssd_budget ? 0 : (ssd_budget - taken) / cls.slot_bytes);
  };
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<SsdClass*> released;
  std::vector<ChunkKey> evicted;
  const size_t ahead = catalog.EvictAhead();
  if (room() < missing + ahead) {
    // Before any chunk goes: the free slots other classes hold reserved and have not
    // written leave their reservations (in this commit), and their bytes come here.
    for (const auto& other : classes) {
      if (other.get() == &cls || other->catalog->record_busy()) continue;
      if (std::optional<SlotReservation> record = other->catalog->PlanRelease()) {
        released_bytes += other->catalog->releasing() * other->slot_bytes;
        meta.emplace_back(other->reservation_meta, EncodeSlotReservation(*record));
        released.push_back(other.get());
      }
    }
  }
  if (catalog.Obtainable() < missing || room() < missing) {
    // The coldest chunks go, whatever their class: a burst of large pages makes room from
    // cold small chunks too.
    while (catalog.Obtainable() < missing + ahead || room() < missing + ahead) {
      std::optional<ChunkKey> victim = PickSsdVictim();
      if (!victim) break;
      RemoveSsd(*victim);  // its slot to the free list (or the reservation's, still listed)
      evicted.push_back(*victim);
      ++stats.ssd_evictions;
    }
  }
  const SlotReservation record = catalog.PlanReservation(missing, room());
  meta.emplace_back(cls.reservation_meta, EncodeSlotReservation(record));
  mu.unlock();
  const absl::Status status = index->Commit({}, evicted, /*sync=*/true, meta);
  mu.lock();
  if (status.ok()) ++stats.reservations;
  for (SsdClass* other : released) other->catalog->FinishRelease(status.ok());
  catalog.FinishReservation(status.ok());
  reservation_cv.notify_all();
  if (!status.ok()) return status;
  if (!evicted.empty() || !released.empty()) GiveBackEmptySlabs();
  if (catalog.reserved_free() < n)
    return absl::ResourceExhaustedError(
        "the SSD tier is full and nothing in it can give way (pinned chunks, their ancestors, "
        "writes in flight)");
  return absl::OkStatus();
}

// Writes chunks to reserved SSD slots, publishes them, commits their index entries and
// syncs the slabs. Called with the lock held; releases it during I/O and commits.
void ChunkStore::Impl::WriteToSsd(std::vector<PendingWrite>& writes) {
  FitSsdQuota(writes);
  // Each class's writes under its own reservation, one class after the other.
  std::vector<std::pair<SsdClass*, std::vector<PendingWrite*>>> by_class;
  for (PendingWrite& w : writes) {
    if (!w.status.ok()) continue;  // over its quota
    absl::StatusOr<SsdClass*> cls = ClassFor(w.payload.size());
    if (!cls.ok()) {
      w.status = cls.status();
      continue;
    }
    auto group = std::find_if(by_class.begin(), by_class.end(),
                              [&](const auto& g) { return g.first == *cls; });
    if (group == by_class.end()) group = by_class.insert(by_class.end(), {*cls, {}});
    group->second.push_back(&w);
  }
  for (auto& [cls, of_class] : by_class) WriteClassToSsd(*cls, of_class);
  // Committed chunks now count in their group's bytes (the eviction order's); the rest
  // never will.
  for (PendingWrite& w : writes) {
    if (w.quota == nullptr) continue;
    w.quota->ssd_in_flight -= w.charged;
    w.quota = nullptr;
  }
}

void ChunkStore::Impl::WriteClassToSsd(SsdClass& cls, std::vector<PendingWrite*>& writes) {
  SsdCatalog& catalog = *cls.catalog;
  const absl::Status reservation = EnsureReserved(cls, writes.size());
  std::vector<SlotWrite> slot_writes;
  std::vector<PendingWrite*> which;
  for (PendingWrite* w : writes) {
    const std::optional<uint64_t> taken = catalog.TakeForWrite();
    if (!taken) {
      w->status = reservation.ok() ? absl::ResourceExhaustedError(absl::StrCat(
                                         "the SSD tier is full: ", writes.size(),
                                         " chunks to write and no free slot of ", cls.slot_bytes,
                                         " bytes in its budget of ", ssd_budget))
                                   : reservation;
      continue;
    }
    IndexRecord& r = w->record;
    cls.Place(*taken, &r);
    r.sequence = catalog.TakeSequence();
    r.payload_bytes = static_cast<uint32_t>(w->payload.size());
    r.checksum = 0;  // computed by the SSD tier from the staged copy
    SlotHeader h;
    h.namespace_id = r.namespace_id;
    h.payload_bytes = r.payload_bytes;
    h.key = w->key;
    h.sequence = r.sequence;
    h.parent = r.parent;
    h.origin = r.origin;
    h.created_s = r.created_s;
    h.expires_s = r.expires_s;
    slot_writes.push_back({*taken, h, w->payload});
    which.push_back(w);
  }
  mu.unlock();
  std::vector<absl::Status> io = cls.tier->Write(slot_writes);
  for (size_t k = 0; k < slot_writes.size(); ++k) {
    which[k]->record.checksum = slot_writes[k].header.payload_checksum;
  }
  mu.lock();
  // Publish what reached the disk; readers may find it before the commit, which is safe:
  // the bytes are there and verify. A failed commit unpublishes it again.
  std::vector<std::pair<ChunkKey, IndexRecord>> puts;
  GroupCommit::SlabSet slabs;
  for (size_t k = 0; k < slot_writes.size(); ++k) {
    PendingWrite& w = *which[k];
    if (!io[k].ok()) {
      w.status = io[k];
      ++stats.write_errors;
      catalog.Free(slot_writes[k].slot);
      continue;
    }
    if (w.expected_checksum != 0 && w.record.checksum != w.expected_checksum) {
      w.status = absl::DataLossError(
          absl::StrCat(Where(w.key), ": the RAM copy no longer matches its checksum"));
      catalog.Free(slot_writes[k].slot);
      continue;
    }
    if (ssd_map.contains(w.key)) {  // a concurrent writer stored it first
      w.status = absl::AlreadyExistsError(Where(w.key));
      catalog.Free(slot_writes[k].slot);
      continue;
    }
    auto pin = pins.find(w.key);
    w.record.pin_until_s = pin == pins.end() ? 0 : pin->second;
    ssd_map[w.key] = w.record;
    catalog.Published(slot_writes[k].slot);
    puts.emplace_back(w.key, w.record);
    slabs.insert({cls.tier.get(), w.record.slab});
  }
  mu.unlock();
  absl::Status commit = puts.empty() ? absl::OkStatus() : CommitDurably(slabs, puts);
  mu.lock();
  if (!commit.ok()) {
    for (auto& [key, rec] : puts) {
      RemoveSsd(key);
      for (PendingWrite* w : writes) {
        if (w->key == key) w->status = commit;
      }
    }
  } else {
    // Only a committed chunk may be evicted: an eviction's deletion committed before the
    // chunk's own entry would leave that entry naming a slot that is reused.
    for (auto& [key, rec] : puts) {
      auto it = ssd_map.find(key);
      if (it == ssd_map.end() || it->second.sequence != rec.sequence) continue;  // erased since
      auto pin = pins.find(key);
      ssd_order.Add(key, rec.parent, NextAccess(), pin == pins.end() ? 0 : pin->second,
                    rec.expires_s, rec.namespace_id, cls.slot_bytes);  // the whole slot (quota.h)
    }
  }
  if (catalog.EndWrites(slot_writes.size())) reservation_cv.notify_all();
}

// Writes dirty RAM chunks to SSD (write-behind and demotion). Called with the lock.
void ChunkStore::Impl::FlushLocked(const std::vector<ChunkKey>& keys) {
  std::vector<PendingWrite> writes;
  std::vector<std::pair<RamPoolId, uint32_t>> leased;
  for (const ChunkKey& key : keys) {
    RamEntry* e = ram->Find(key);
    if (e == nullptr || !e->dirty || e->flushing) continue;
    e->flushing = true;
    ram->Ref(e->pool, e->slot);
    leased.emplace_back(e->pool, e->slot);
    IndexRecord r;
    r.namespace_id = e->ns;
    r.parent = e->parent;
    r.origin = e->origin;
    r.created_s = r.last_access_s = NowS();
    r.expires_s = e->expires_s;
    writes.push_back({key,
                      r,
                      std::span<const uint8_t>(ram->SlotData(e->pool, e->slot), e->len),
                      0,
                      {},
                      e->checksum});
  }
  if (writes.empty()) return;
  ++flushes_in_progress;
  WriteToSsd(writes);
  for (const PendingWrite& w : writes) {
    RamEntry* e = ram->Find(w.key);
    if (e == nullptr) continue;
    e->flushing = false;
    // Stored, or already there: either way the SSD holds it now.
    if (w.status.ok() || absl::IsAlreadyExists(w.status)) {
      e->dirty = false;
    } else if (absl::IsDataLoss(w.status)) {
      DropCorruptRam(w.key);
    } else {
      dirty_queue.push_back(w.key);  // retried by the writer
    }
  }
  for (const auto& [pool, slot] : leased) ram->Unref(pool, slot);
  --flushes_in_progress;
  flush_done.notify_all();
}

void ChunkStore::Impl::WriterLoop() {
  MutexLock lk(mu);
  (void)WaitLoaded();  // nothing is queued before: every write waits for the load
  while (true) {
    while (!stopping && dirty_queue.empty()) work.wait(mu);
    if (dirty_queue.empty() && stopping) break;
    std::vector<ChunkKey> batch;
    while (!dirty_queue.empty() && batch.size() < opt.queue_depth) {
      batch.push_back(dirty_queue.front());
      dirty_queue.pop_front();
    }
    const uint64_t errors_before = stats.write_errors;
    FlushLocked(batch);
    if (stats.write_errors != errors_before && !stopping) {
      // Back off on a failing disk instead of spinning on it.
      work.wait_for(mu, std::chrono::milliseconds(50));
    }
    if (stopping && stats.write_errors - errors_before > 0) {
      dirty_queue.clear();  // shutting down on a failing disk: give up on these
    }
  }
}

}  // namespace kvc::storage
