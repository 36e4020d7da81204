#include "storage/chunk_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "storage/chunk_store_impl.h"

namespace kvc::storage {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kNone:
      return "none";
    case Tier::kRam:
      return "ram";
    case Tier::kSsd:
      return "ssd";
    case Tier::kHbm:
      return "hbm";
    case Tier::kRados:
      return "rados";
  }
  return "?";
}

// ---- ChunkStore ----

RamLease& RamLease::operator=(RamLease&& o) noexcept {
  if (this != &o) {
    if (store_ != nullptr) store_->ReleaseRamSlot(pool_, slot_);
    store_ = std::exchange(o.store_, nullptr);
    pool_ = o.pool_;
    slot_ = o.slot_;
    offset_ = o.offset_;
    checksum_ = o.checksum_;
    bytes_ = o.bytes_;
  }
  return *this;
}

RamLease::~RamLease() {
  if (store_ != nullptr) store_->ReleaseRamSlot(pool_, slot_);
}

ChunkStore::ChunkStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ChunkStore::~ChunkStore() { impl_->Close(); }

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Open(StoreOptions options,
                                                             StoreSeams seams) {
  std::shared_ptr<SharedTier> shared = options.shared_tier;
  auto impl = std::make_unique<Impl>(std::move(options), std::move(seams));
  if (absl::Status s = impl->Open(); !s.ok()) {
    if (impl->writer.joinable()) impl->Close();
    return s;
  }
  if (shared) {
    impl->shared = std::make_unique<SharedTierLink>(
        std::move(shared), impl->opt.shared_write_behind, impl->opt.shared_backlog_bytes,
        impl->opt.shared_retry_after_s);
  }
  return std::unique_ptr<ChunkStore>(new ChunkStore(std::move(impl)));
}

absl::Status ChunkStore::RegisterNamespace(NamespaceId ns, uint64_t chunk_bytes) {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (chunk_bytes == 0 || chunk_bytes > s.opt.max_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("namespace ", ns, ": chunk size ", chunk_bytes,
                                                   " is not in [1, ", s.opt.max_chunk_bytes, "]"));
  }
  auto it = s.namespaces.find(ns);
  if (it != s.namespaces.end()) {
    if (it->second == chunk_bytes) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat("namespace ", ns, " already has chunk size ",
                                                 it->second, ", not ", chunk_bytes));
  }
  auto next = s.namespaces;
  next[ns] = chunk_bytes;
  KVC_RETURN_IF_ERROR(s.index->PutMeta("namespaces", EncodeNamespaces(next)));
  s.namespaces = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkStore::ChunkBytes(NamespaceId ns) const {
  MutexLock lk(impl_->mu);
  auto it = impl_->namespaces.find(ns);
  if (it == impl_->namespaces.end()) {
    return absl::NotFoundError(absl::StrCat("namespace ", ns, " is not registered"));
  }
  return it->second;
}

namespace {
constexpr char kWouldBlockPayload[] = "kvcache.storage/would-block";
}  // namespace

absl::Status WouldBlockError(const std::string& what) {
  absl::Status s = absl::UnavailableError(absl::StrCat(what, " would wait for I/O"));
  s.SetPayload(kWouldBlockPayload, absl::Cord("1"));
  return s;
}

bool IsWouldBlock(const absl::Status& status) {
  return absl::IsUnavailable(status) && status.GetPayload(kWouldBlockPayload).has_value();
}

absl::StatusOr<PutResult> ChunkStore::Put(const PutRequest& request, const PutOptions& options) {
  return PutBatch(std::span(&request, 1), options)[0];
}

std::vector<absl::StatusOr<PutResult>> ChunkStore::PutBatchLocal(
    std::span<const PutRequest> requests, const PutOptions& options) {
  Impl& s = *impl_;
  std::vector<absl::StatusOr<PutResult>> results(requests.size(), PutResult{});
  MutexLock lk(s.mu);
  if (absl::Status loaded = s.WaitLoaded(); !loaded.ok()) {
    results.assign(requests.size(), loaded);
    return results;
  }
  const int64_t now = s.NowS();
  const int64_t expires = options.ttl_s > 0 ? now + options.ttl_s : 0;
  std::vector<Impl::PendingWrite> writes;
  std::vector<size_t> memory_puts;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PutRequest& r = requests[i];
    if (absl::Status st = s.CheckPayload(r.namespace_id, r.payload.size()); !st.ok()) {
      results[i] = st;
      continue;
    }
    const bool durable = options.durability == Durability::kDurable || !s.HasRam(r.namespace_id);
    if (durable && !options.may_block) {
      results[i] = WouldBlockError(options.durability == Durability::kDurable
                                       ? "a durable put"
                                       : "a put to a namespace without RAM");
      continue;
    }
    if (durable && !s.HasSsd()) {
      results[i] = absl::FailedPreconditionError(
          s.ram ? "durable store asked of a store with no SSD tier"
                : absl::StrCat("namespace ", r.namespace_id, " has no RAM and no SSD tier"));
      continue;
    }
    auto on_ssd = s.ssd_map.find(r.key);
    const RamEntry* in_ram = s.ram ? s.ram->Find(r.key) : nullptr;
    const bool present = on_ssd != s.ssd_map.end() || (in_ram != nullptr && !durable);
    if (present) {
      const NamespaceId owner =
          on_ssd != s.ssd_map.end() ? on_ssd->second.namespace_id : in_ram->ns;
      if (owner != r.namespace_id) {
        results[i] =
            absl::AlreadyExistsError(absl::StrCat(s.Where(r.key), " exists in another namespace"));
      } else {
        results[i] = PutResult{true};
      }
      continue;
    }
    if (durable) {
      // A chunk only in RAM (memory-acknowledged) is written to SSD now, and reported as
      // already present: the cache had it.
      if (in_ram != nullptr && in_ram->ns == r.namespace_id) results[i] = PutResult{true};
      IndexRecord rec;
      rec.namespace_id = r.namespace_id;
      rec.parent = r.parent;
      rec.origin = r.origin;
      rec.created_s = rec.last_access_s = now;
      rec.expires_s = expires;
      writes.push_back({r.key, rec, r.payload, i, {}, 0});
    } else {
      memory_puts.push_back(i);
    }
  }
  if (!writes.empty()) {
    s.WriteToSsd(writes);
    for (Impl::PendingWrite& w : writes) {
      if (absl::IsAlreadyExists(w.status)) {
        results[w.result_index] = PutResult{true};
      } else if (!w.status.ok()) {
        results[w.result_index] = w.status;
      } else if (s.HasRam(w.record.namespace_id)) {
        // Keep a clean copy in RAM too (write-through); skipped if RAM is busy.
        // (results[w.result_index] keeps already_present for a chunk that was in RAM.)
        if (RamEntry* in_ram = s.ram->Find(w.key)) {
          in_ram->dirty = false;
        } else {
          const PutRequest& r = requests[w.result_index];
          (void)s.InsertRam(r.namespace_id, r.key, r.parent, r.origin, r.payload, w.record.checksum,
                            false, expires, false);
        }
      }
    }
  }
  for (size_t i : memory_puts) {
    const PutRequest& r = requests[i];
    absl::Status st =
        s.InsertRam(r.namespace_id, r.key, r.parent, r.origin, r.payload, 0,
                    /*dirty=*/s.HasSsd(), expires, /*allow_writeback=*/options.may_block);
    if (absl::IsAlreadyExists(st)) {
      results[i] = PutResult{true};
    } else if (!st.ok()) {
      results[i] = st;
    }
  }
  if (s.hbm && s.opt.hbm_write_through) s.WriteThroughHbm(requests, results);
  return results;
}

absl::Status ChunkStore::Get(NamespaceId ns, const ChunkKey& key, std::span<uint8_t> out) {
  std::span<uint8_t> outs[] = {out};
  return GetBatch(ns, std::span(&key, 1), outs)[0];
}

std::vector<absl::Status> ChunkStore::GetBatch(NamespaceId ns, std::span<const ChunkKey> keys,
                                               std::span<const std::span<uint8_t>> outs,
                                               std::vector<Tier>* served_from,
                                               bool outs_have_read_room) {
  std::vector<absl::Status> status =
      GetBatchImpl(ns, keys, outs, served_from, impl_->verify_ram_reads(), outs_have_read_room);
  if (impl_->shared) GetFromShared(ns, keys, outs, &status, served_from);
  return status;
}

ChunkStore::ReadRoom ChunkStore::ReadRoomFor(uint64_t payload_bytes) const {
  if (!impl_->HasSsd()) return {1, 0, payload_bytes};
  // The header of the chunk's class: the first class may keep an older format's.
  const uint16_t format = impl_->SsdFormatFor(payload_bytes);
  return {kSlotAlignment, SlotHeaderBytes(format), SlotBytesFor(payload_bytes, format)};
}

ReadBuffer AllocateReadBuffer(const ChunkStore::ReadRoom& room) {
  // (aligned_alloc wants a size that is a multiple of the alignment.)
  const uint64_t bytes = (room.bytes + room.alignment - 1) / room.alignment * room.alignment;
  return ReadBuffer(static_cast<uint8_t*>(std::aligned_alloc(room.alignment, bytes)));
}

std::vector<absl::Status> ChunkStore::GetBatchImpl(NamespaceId ns, std::span<const ChunkKey> keys,
                                                   std::span<const std::span<uint8_t>> outs,
                                                   std::vector<Tier>* served_from, bool verify_ram,
                                                   bool outs_have_read_room) {
  Impl& s = *impl_;
  std::vector<absl::Status> status(keys.size());
  if (outs.size() != keys.size()) {
    status.assign(keys.size(), absl::InvalidArgumentError("one output buffer per key"));
    return status;
  }
  std::vector<SlotRead> reads;
  std::vector<Impl::SsdClass*> read_class;
  std::vector<size_t> read_index;
  struct RamHit {
    size_t index;
    RamPoolId pool;
    uint32_t slot;
    uint64_t checksum;
  };
  std::vector<RamHit> ram_hits;
  MutexLock lk(s.mu);
  if (s.loading) {  // read from the slots the index on disk names, without the lock
    std::vector<size_t> todo;
    for (size_t i = 0; i < keys.size(); ++i) {
      status[i] = s.CheckPayload(ns, outs[i].size());
      if (status[i].ok()) todo.push_back(i);
    }
    const std::shared_ptr<Impl::LoadingView> view = s.loading_view;
    lk.unlock();
    if (served_from != nullptr) served_from->assign(keys.size(), Tier::kNone);
    s.GetWhileLoading(*view, ns, keys, outs, todo, outs_have_read_room, &status, served_from);
    return status;
  }
  const int64_t now = s.NowS();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status st = s.CheckPayload(ns, outs[i].size()); !st.ok()) {
      status[i] = st;
      continue;
    }
    if (RamEntry* r = s.ram ? s.ram->FindIn(ns, keys[i]) : nullptr) {
      s.ram->Ref(r->pool, r->slot);
      const int64_t tick = s.NextAccess();
      s.ram->Touch(keys[i], tick);
      s.ssd_order.Touch(keys[i], tick);
      ram_hits.push_back({i, r->pool, r->slot, r->checksum});
      continue;
    }
    auto d = s.ssd_map.find(keys[i]);
    if (d == s.ssd_map.end() || d->second.namespace_id != ns) {
      status[i] = absl::NotFoundError(absl::StrCat(s.Where(keys[i]), " is not cached"));
      ++s.stats.misses;
      continue;
    }
    IndexRecord& rec = d->second;
    const Impl::SsdSlot at = s.SlotOf(rec);
    at.cls->catalog->BeginRead(at.slot);
    s.ssd_order.Touch(keys[i], s.NextAccess());
    if (rec.last_access_s / 3600 != now / 3600) {  // coarse: hourly resolution on disk
      rec.last_access_s = now;
      s.access_dirty.insert(keys[i]);
    }
    SlotHeader expect;
    expect.namespace_id = ns;
    expect.payload_bytes = rec.payload_bytes;
    expect.key = keys[i];
    expect.payload_checksum = rec.checksum;
    expect.sequence = rec.sequence;
    reads.push_back({at.slot, expect, outs[i], outs_have_read_room});
    read_class.push_back(at.cls);
    read_index.push_back(i);
  }
  lk.unlock();
  std::vector<size_t> corrupt;  // ram_hits entries whose copy did not verify
  for (size_t h = 0; h < ram_hits.size(); ++h) {
    const RamHit& hit = ram_hits[h];
    const std::span<const uint8_t> src(s.ram_arenas()->SlotData(hit.pool, hit.slot),
                                       outs[hit.index].size());
    if (!verify_ram) {
      // Verified when it entered RAM and by the scrub since; the arena is sealed.
      std::memcpy(outs[hit.index].data(), src.data(), src.size());
    } else if (CopyWithChecksum(outs[hit.index], src) != hit.checksum) {
      corrupt.push_back(h);
    }
  }
  std::vector<absl::Status> io;
  if (!reads.empty()) io = Impl::ReadSlots(reads, read_class);
  lk.lock();
  for (const RamHit& hit : ram_hits) s.ram->Unref(hit.pool, hit.slot);
  for (size_t h : corrupt) {
    const RamHit& hit = ram_hits[h];
    status[hit.index] = absl::NotFoundError(absl::StrCat(
        s.Where(keys[hit.index]), " in RAM does not match its checksum; copy dropped"));
    ++s.stats.misses;
    const RamEntry* e = s.ram->FindIn(ns, keys[hit.index]);
    if (e != nullptr && e->pool == hit.pool && e->slot == hit.slot)
      s.DropCorruptRam(keys[hit.index]);
  }
  s.stats.ram_hits += ram_hits.size() - corrupt.size();
  std::vector<ChunkKey> dropped;
  for (size_t k = 0; k < reads.size(); ++k) {
    const size_t i = read_index[k];
    read_class[k]->catalog->EndRead(reads[k].slot);
    if (io[k].ok()) {
      ++s.stats.ssd_hits;
      status[i] = absl::OkStatus();
      continue;
    }
    if (absl::IsDataLoss(io[k])) {
      // Bad bytes on disk: a miss, counted, and the entry is dropped.
      ++s.stats.checksum_failures;
      ++s.stats.misses;
      auto d = s.ssd_map.find(keys[i]);
      if (d != s.ssd_map.end() && d->second.sequence == reads[k].expected.sequence) {
        s.RemoveSsd(keys[i]);
        dropped.push_back(keys[i]);
      }
      status[i] = absl::NotFoundError(absl::StrCat(io[k].message(), "; entry dropped"));
    } else {
      ++s.stats.read_errors;
      status[i] = io[k];
    }
  }
  if (!dropped.empty()) {
    lk.unlock();
    (void)s.index->Commit({}, dropped, /*sync=*/true);
    lk.lock();
  }
  // Promote SSD hits into RAM (clean copies; never waits on a write-back).
  if (s.opt.promote_on_ssd_hit && s.HasRam(ns)) {
    for (size_t k = 0; k < reads.size(); ++k) {
      const size_t i = read_index[k];
      if (!status[i].ok() || s.ram->Contains(keys[i])) continue;
      auto d = s.ssd_map.find(keys[i]);
      if (d == s.ssd_map.end()) continue;
      const std::optional<ChunkKey> parent = d->second.parent;
      const std::optional<ChunkOrigin> origin = d->second.origin;
      const int64_t expires = d->second.expires_s;
      const uint64_t checksum = d->second.checksum;
      if (s.InsertRam(ns, keys[i], parent, origin, outs[i], checksum, false, expires, false).ok())
        ++s.stats.promotions;
    }
  }
  if (served_from != nullptr) {
    served_from->assign(keys.size(), Tier::kNone);
    for (const RamHit& hit : ram_hits) {
      if (status[hit.index].ok()) (*served_from)[hit.index] = Tier::kRam;
    }
    for (size_t i : read_index) {
      if (status[i].ok()) (*served_from)[i] = Tier::kSsd;
    }
  }
  return status;
}

absl::StatusOr<RamLease> ChunkStore::LeaseRam(NamespaceId ns, const ChunkKey& key) {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  RamEntry* r = s.ram ? s.ram->FindIn(ns, key) : nullptr;
  if (r == nullptr) return absl::NotFoundError(absl::StrCat(s.Where(key), " is not in RAM"));
  s.ram->Ref(r->pool, r->slot);
  s.ram->Touch(key, s.NextAccess());
  RamLease lease;
  lease.store_ = this;
  lease.pool_ = r->pool;
  lease.slot_ = r->slot;
  lease.offset_ = s.ram->SlotOffset(r->pool, r->slot);
  lease.bytes_ = std::span<const uint8_t>(s.ram->SlotData(r->pool, r->slot), r->len);
  const uint64_t checksum = r->checksum;
  lease.checksum_ = checksum;
  if (!s.verify_ram_reads()) {
    ++s.stats.ram_hits;  // verified when it entered RAM and by the scrub since
    return lease;
  }
  // Verified outside the lock; the lease keeps the slot, and no client can write it
  // (ram_arena.h), so what verifies here is what the holder reads.
  lk.unlock();
  const bool verifies = s.RamCopyVerifies(lease.bytes_, checksum);
  lk.lock();
  if (!verifies) {
    const RamEntry* e = s.ram->FindIn(ns, key);
    if (e != nullptr && e->pool == lease.pool_ && e->slot == lease.slot_) s.DropCorruptRam(key);
    ++s.stats.misses;
    lk.unlock();  // the lease's release takes the lock
    lease = RamLease();
    return absl::NotFoundError(
        absl::StrCat(s.Where(key), " in RAM does not match its checksum; copy dropped"));
  }
  ++s.stats.ram_hits;
  return lease;
}

uint64_t ChunkStore::ScrubRam(uint64_t max_bytes) { return impl_->ScrubRam(max_bytes); }

uint64_t ChunkStore::Impl::ScrubRam(uint64_t max_bytes) {
  Impl& s = *this;
  uint64_t verified = 0;
  MutexLock lk(s.mu);
  if (!s.ram) return 0;
  uint64_t total_slots = 0;
  for (RamPoolId p = 0; p < s.ram->pool_count(); ++p) total_slots += s.ram->SlotCount(p);
  if (total_slots == 0) return 0;
  for (uint64_t walked = 0; verified < max_bytes; ++walked) {
    if ((walked & 1023) == 1023) {  // a long walk over empty slots lets readers in
      lk.unlock();
      lk.lock();
    }
    const RamPoolId pool = s.scrub_pool;
    const uint32_t slot = s.scrub_slot;
    bool pass_done = false;
    if (++s.scrub_slot >= s.ram->SlotCount(s.scrub_pool)) {
      s.scrub_slot = 0;
      do {
        if (++s.scrub_pool >= s.ram->pool_count()) {
          s.scrub_pool = 0;
          pass_done = true;
        }
      } while (s.ram->SlotCount(s.scrub_pool) == 0);
    }
    ++s.scrub_slots_walked;
    const ChunkKey* at = slot < s.ram->SlotCount(pool) ? s.ram->KeyAt(pool, slot) : nullptr;
    const RamEntry* e = at != nullptr ? s.ram->Find(*at) : nullptr;
    if (e != nullptr && e->pool == pool && e->slot == slot) {
      const ChunkKey key = *at;
      const uint64_t checksum = e->checksum;
      const std::span<const uint8_t> bytes(s.ram->SlotData(pool, slot), e->len);
      // Hashed outside the lock; the reference keeps the slot from being reused meanwhile.
      s.ram->Ref(pool, slot);
      lk.unlock();
      const bool ok = s.RamCopyVerifies(bytes, checksum);
      lk.lock();
      const RamEntry* now = s.ram->Find(key);
      if (!ok && now != nullptr && now->pool == pool && now->slot == slot) {
        std::fprintf(stderr, "kvcache storage: the RAM scrub found %s corrupt; copy dropped\n",
                     s.Where(key).c_str());
        s.DropCorruptRam(key);
      }
      s.ram->Unref(pool, slot);
      verified += bytes.size();
      s.stats.ram_scrub_bytes += bytes.size();
    }
    if (pass_done) {  // a call ends with its pass: the next one starts the next pass
      ++s.stats.ram_scrub_passes;
      s.stats.ram_scrub_last_pass_s = s.NowS();
      s.scrub_slots_walked = 0;
      break;
    }
  }
  s.stats.ram_scrub_progress =
      static_cast<double>(s.scrub_slots_walked) / static_cast<double>(total_slots);
  return verified;
}

void ChunkStore::Impl::ScrubLoop() {
  // Steps of ~50 ms' worth of bytes, each followed by the rest of its time slice.
  const uint64_t rate = opt.ram_scrub_bytes_per_s;
  const uint64_t step = std::max<uint64_t>(rate / 20, 1);
  while (true) {
    const auto begun = std::chrono::steady_clock::now();
    const uint64_t done = ScrubRam(step);
    const auto due = begun + std::chrono::nanoseconds(
                                 static_cast<int64_t>(std::max<uint64_t>(done, step) * 1e9 / rate));
    MutexLock lk(mu);
    while (!stopping && std::chrono::steady_clock::now() < due) work.wait_until(mu, due);
    if (stopping) return;
  }
}

void ChunkStore::ReleaseRamSlot(RamPoolId pool, uint32_t slot) {
  MutexLock lk(impl_->mu);
  impl_->ram->Unref(pool, slot);
}

absl::Status ChunkStore::SetRamPool(NamespaceId ns, RamPoolId pool) {
  MutexLock lk(impl_->mu);
  if (!impl_->ram) return absl::FailedPreconditionError("this store has no RAM tier");
  return impl_->ram->SetPool(ns, pool);
}

RamPoolId ChunkStore::RamPoolOf(NamespaceId ns) const {
  MutexLock lk(impl_->mu);
  return impl_->ram ? impl_->ram->PoolOf(ns) : 0;
}

size_t ChunkStore::ram_pool_count() const {
  const RamTier* ram = impl_->ram_arenas();
  return ram ? ram->pool_count() : 0;
}

int ChunkStore::ram_arena_fd(RamPoolId pool) const {
  const RamTier* ram = impl_->ram_arenas();
  const RamArena* a = ram && pool < ram->pool_count() ? ram->arena(pool) : nullptr;
  return a ? a->read_only_fd() : -1;
}

uint64_t ChunkStore::ram_verdict_offset(RamPoolId pool) const {
  const RamTier* ram = impl_->ram_arenas();
  const RamArena* a = ram && pool < ram->pool_count() ? ram->arena(pool) : nullptr;
  return a && a->slots() > 0 ? a->verdict_offset() : 0;
}

uint64_t ChunkStore::ram_arena_bytes(RamPoolId pool) const {
  const RamTier* ram = impl_->ram_arenas();
  const RamArena* a = ram && pool < ram->pool_count() ? ram->arena(pool) : nullptr;
  return a ? a->bytes() : 0;
}

Tier ChunkStore::Contains(NamespaceId ns, const ChunkKey& key) const {
  return Lookup(ns, std::span(&key, 1))[0];
}

std::vector<Tier> ChunkStore::LookupLocal(NamespaceId ns, std::span<const ChunkKey> keys,
                                          bool leading_only) const {
  const Impl& s = *impl_;
  MutexLock lk(s.mu);
  if (s.loading) {  // answered from the index on disk, without the lock
    const std::shared_ptr<Impl::LoadingView> view = s.loading_view;
    lk.unlock();
    return s.LookupWhileLoading(*view, ns, keys, leading_only);
  }
  std::vector<Tier> tiers(keys.size(), Tier::kNone);
  size_t probed = 0;
  for (; probed < keys.size(); ++probed) {
    tiers[probed] = s.LowerTierOf(ns, keys[probed]);
    if (leading_only && tiers[probed] == Tier::kNone) break;
  }
  if (s.hbm) {  // T0 holds only chunks RAM or SSD holds (LeftStore drops the rest)
    const std::vector<bool> in_hbm = s.hbm->ContainsEach(ns, keys.first(probed));
    for (size_t i = 0; i < probed; ++i) {
      if (tiers[i] != Tier::kNone && in_hbm[i]) tiers[i] = Tier::kHbm;
    }
  }
  return tiers;
}

absl::Status ChunkStore::Erase(NamespaceId ns, const ChunkKey& key) {
  return EraseBatch(ns, std::span(&key, 1))[0];
}

std::vector<absl::Status> ChunkStore::EraseBatchLocal(NamespaceId ns,
                                                      std::span<const ChunkKey> keys) {
  Impl& s = *impl_;
  std::vector<absl::Status> status(keys.size());
  std::vector<ChunkKey> deletes;
  std::vector<Impl::SsdSlot> slots;
  MutexLock lk(s.mu);
  if (absl::Status loaded = s.WaitLoaded(); !loaded.ok()) {
    status.assign(keys.size(), loaded);
    return status;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const ChunkKey& key = keys[i];
    for (const RamEntry* r = s.ram ? s.ram->Find(key) : nullptr; r != nullptr && r->flushing;
         r = s.ram->Find(key)) {
      s.flush_done.wait(s.mu);
    }
    bool found = false;
    if (s.ram && s.ram->FindIn(ns, key) != nullptr) {
      s.DropRam(key);
      found = true;
    }
    auto d = s.ssd_map.find(key);
    if (d != s.ssd_map.end() && d->second.namespace_id == ns) {
      slots.push_back(s.TakeOffSsd(key));  // reused once the deletion is committed (below)
      deletes.push_back(key);
      found = true;
    }
    if (found && !(s.ram && s.ram->Contains(key)) && !s.ssd_map.contains(key)) {
      s.LeftStore(ns, key);
    }
    if (found) {
      s.pins.erase(key);
    } else {
      status[i] = absl::NotFoundError(absl::StrCat(s.Where(key), " is not cached"));
    }
  }
  if (absl::Status committed = s.CommitSsdRemovals(deletes, slots); !committed.ok()) {
    for (auto& st : status) {
      if (st.ok()) st = committed;
    }
  }
  return status;
}

absl::Status ChunkStore::Pin(NamespaceId ns, const ChunkKey& key, int64_t pin_until_s) {
  return PinBatch(ns, std::span(&key, 1), pin_until_s)[0];
}

std::vector<absl::Status> ChunkStore::PinBatch(NamespaceId ns, std::span<const ChunkKey> keys,
                                               int64_t pin_until_s) {
  Impl& s = *impl_;
  std::vector<absl::Status> status(keys.size());
  std::vector<std::pair<ChunkKey, IndexRecord>> puts;
  MutexLock lk(s.mu);
  if (absl::Status loaded = s.WaitLoaded(); !loaded.ok()) {
    status.assign(keys.size(), loaded);
    return status;
  }
  // A pin limit counts the chunks pinned now, these included.
  const int64_t now = s.NowS();
  Impl::QuotaState* quota = s.QuotaOf(ns);
  const uint64_t pin_limit = quota != nullptr ? quota->quota.pinned_chunks : 0;
  uint64_t pinned = pin_limit > 0 ? s.PinnedChunksOf(s.quota_group_of.at(ns)) : 0;
  // The tier's share for pins, whoever pins (StoreOptions::max_pinned_share): of the SSD's
  // slots, where pins hold chunks from eviction (a pinned chunk now only in RAM goes there
  // when written); of RAM's in a store without SSD.
  const bool tier_share = s.opt.max_pinned_share < 1.0 && pin_until_s > now;
  uint64_t tier_pinned = 0, tier_share_slots = 0;
  if (tier_share) {
    tier_pinned = s.PinnedChunks();
    const uint64_t slots =
        s.HasSsd() ? s.classes[0]->catalog->capacity() : (s.ram ? s.ram->capacity_slots() : 0);
    tier_share_slots = static_cast<uint64_t>(s.opt.max_pinned_share * static_cast<double>(slots));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    auto d = s.ssd_map.find(keys[i]);
    const bool in_ram = s.ram && s.ram->FindIn(ns, keys[i]) != nullptr;
    const bool on_ssd = d != s.ssd_map.end() && d->second.namespace_id == ns;
    if (!in_ram && !on_ssd) {
      status[i] = absl::NotFoundError(absl::StrCat(s.Where(keys[i]), " is not cached"));
      continue;
    }
    auto p = s.pins.find(keys[i]);
    const bool was_pinned = p != s.pins.end() && p->second > now;
    const bool new_in_share = tier_share && !was_pinned;
    if (new_in_share && tier_pinned >= tier_share_slots) {
      // Says which tier, not how full it is: that is every tenant's state, not the caller's.
      status[i] = absl::ResourceExhaustedError(
          absl::StrCat("the ", s.HasSsd() ? "SSD" : "RAM",
                       " tier's share for pinned chunks is taken (kvcached --max-pinned-share ",
                       s.opt.max_pinned_share, "); unpin chunks or pin fewer"));
      continue;
    }
    if (pin_limit > 0 && pin_until_s > now) {
      if (!was_pinned && pinned >= pin_limit) {
        status[i] = absl::ResourceExhaustedError(absl::StrCat(
            quota->quota.owner, " may pin ", pin_limit, " chunks at once and has pinned them"));
        continue;
      }
      pinned += !was_pinned;
    }
    tier_pinned += new_in_share;
    if (pin_until_s > 0) {
      s.pins[keys[i]] = pin_until_s;
    } else {
      s.pins.erase(keys[i]);
    }
    if (on_ssd) {
      d->second.pin_until_s = pin_until_s;
      s.ssd_order.SetPin(keys[i], pin_until_s);
      puts.emplace_back(keys[i], d->second);
    }
  }
  lk.unlock();
  if (absl::Status st = s.index->Commit(puts, {}, /*sync=*/true); !st.ok()) {
    for (auto& x : status) {
      if (x.ok()) x = st;
    }
  }
  return status;
}

absl::Status ChunkStore::Flush() {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  KVC_RETURN_IF_ERROR(s.WaitLoaded());
  s.work.notify_all();
  const uint64_t errors = s.stats.write_errors;
  while (!s.dirty_queue.empty() || s.flushes_in_progress > 0) {
    s.flush_done.wait_for(s.mu, std::chrono::milliseconds(20));
    if (s.stats.write_errors != errors) return absl::InternalError("writing to SSD failed");
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::WaitForIndex() const {
  MutexLock lk(impl_->mu);
  return impl_->WaitLoaded();
}

ChunkStore::ChunkCounts ChunkStore::CountChunks(const std::set<NamespaceId>& namespaces) const {
  MutexLock lk(impl_->mu);
  (void)impl_->WaitLoaded();  // after a failed load: nothing is counted
  ChunkCounts c;
  if (impl_->ram) c.ram = impl_->ram->CountIn(namespaces);
  for (NamespaceId ns : namespaces) c.ssd_bytes += impl_->ssd_order.BytesOf(ns);
  for (const auto& [key, rec] : impl_->ssd_map) c.ssd += namespaces.contains(rec.namespace_id);
  if (impl_->hbm) c.hbm = impl_->hbm->CountIn(namespaces);
  return c;
}

std::vector<std::pair<NamespaceId, ChunkKey>> ChunkStore::ListSsd() const {
  MutexLock lk(impl_->mu);
  (void)impl_->WaitLoaded();
  std::vector<std::pair<NamespaceId, ChunkKey>> out;
  out.reserve(impl_->ssd_map.size());
  for (const auto& [key, rec] : impl_->ssd_map) out.emplace_back(rec.namespace_id, key);
  return out;
}

std::vector<ChunkStore::ChunkListing> ChunkStore::ListPinned() const {
  Impl& s = *impl_;
  MutexLock lk(s.mu);
  (void)s.WaitLoaded();
  const int64_t now = s.NowS();
  std::vector<ChunkListing> out;
  for (const auto& [key, until] : s.pins) {
    if (until <= now) continue;
    if (auto d = s.ssd_map.find(key); d != s.ssd_map.end()) {
      const IndexRecord& rec = d->second;
      out.push_back({rec.namespace_id, key, rec.origin, rec.payload_bytes, rec.checksum,
                     rec.expires_s, until});
    } else if (const RamEntry* r = s.ram ? s.ram->Find(key) : nullptr; r != nullptr) {
      out.push_back({r->ns, key, r->origin, r->len, r->checksum, r->expires_s, until});
    }
  }
  return out;
}

std::vector<ChunkStore::ChunkListing> ChunkStore::ListChunks(uint32_t shard,
                                                             uint32_t shards) const {
  std::vector<ChunkListing> out;
  if (shards == 0) return out;
  auto mine = [shard, shards](const ChunkKey& key) { return key.Prefix64() % shards == shard; };
  {
    MutexLock lk(impl_->mu);
    (void)impl_->WaitLoaded();
    for (const auto& [key, rec] : impl_->ssd_map) {
      if (!mine(key)) continue;
      out.push_back(
          {rec.namespace_id, key, rec.origin, rec.payload_bytes, rec.checksum, rec.expires_s, 0});
    }
    if (impl_->ram) {  // a chunk in both tiers is listed once (its SSD entry), below
      impl_->ram->ForEach([&out, &mine](const ChunkKey& key, const RamEntry& e) {
        if (mine(key)) out.push_back({e.ns, key, e.origin, e.len, e.checksum, e.expires_s, 0});
      });
    }
    for (ChunkListing& c : out) {
      auto p = impl_->pins.find(c.key);
      if (p != impl_->pins.end()) c.pin_until_s = p->second;
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ChunkListing& a, const ChunkListing& b) { return a.key < b.key; });
  out.erase(
      std::unique(out.begin(), out.end(),
                  [](const ChunkListing& a, const ChunkListing& b) { return a.key == b.key; }),
      out.end());
  return out;
}

StoreStats ChunkStore::Stats() const {
  {
    MutexLock lk(impl_->mu);
    (void)impl_->WaitLoaded();
  }
  return StatsNow();
}

StoreStats ChunkStore::StatsNow() const {
  MutexLock lk(impl_->mu);
  StoreStats st = impl_->stats;
  st.ram_chunks = impl_->ram ? impl_->ram->size() : 0;
  st.ssd_chunks = impl_->ssd_map.size();
  st.index_loading = impl_->loading;
  st.ssd_capacity_bytes = impl_->ssd_budget;
  st.ssd_taken_bytes = impl_->SsdTakenBytes();
  for (const auto& [ns, bytes] : impl_->namespaces) st.ssd_bytes += impl_->ssd_order.BytesOf(ns);
  for (const auto& c : impl_->classes)
    st.ssd_classes.push_back({c->slot_bytes, c->catalog->Used()});
  st.pending_write_behind = impl_->dirty_queue.size();
  if (impl_->hbm) {
    const HbmStats h = impl_->hbm->stats();
    st.hbm_chunks = h.used;
    st.hbm_capacity_chunks = h.slots;
    st.hbm_leased = h.leased;
    st.hbm_hits = h.hits;
    st.hbm_misses = h.misses;
    st.hbm_evictions = h.evictions;
  }
  if (impl_->shared) st.shared = impl_->shared->Stats();  // (its own lock, taken inside mu)
  return st;
}

}  // namespace kvc::storage
