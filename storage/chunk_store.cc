#include "storage/chunk_store.h"

#include <algorithm>
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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/chunk_index.h"
#include "storage/eviction.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"
#include "storage/ssd_tier.h"

namespace kvc::storage {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kNone:
      return "none";
    case Tier::kRam:
      return "ram";
    case Tier::kSsd:
      return "ssd";
  }
  return "?";
}

class ChunkStore::Impl {
 public:
  explicit Impl(StoreOptions o) : opt(std::move(o)) {
    if (!opt.now_s) {
      opt.now_s = [] {
        return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
      };
    }
  }

  absl::Status Open();
  void Close();

  // Group commit: makes written slots durable and commits their index entries, for all
  // concurrent callers at once. The first caller to arrive leads: it takes every request
  // queued so far, fdatasyncs each slab they touched once, then commits all their records
  // in one RocksDB write (WAL synced if any of them asked), and wakes the others. Callers
  // arriving meanwhile form the next group. Data is always synced before its index entry.
  absl::Status CommitDurably(const std::set<uint64_t>& slabs,
                             const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                             bool sync_index) {
    CommitRequest me{&slabs, &puts, sync_index, absl::OkStatus(), false};
    std::unique_lock lk(commit_mu);
    commit_queue.push_back(&me);
    commit_cv.wait(lk, [&] { return me.done || !commit_leader_active; });
    if (me.done) return me.result;
    commit_leader_active = true;
    std::vector<CommitRequest*> group;
    group.swap(commit_queue);
    lk.unlock();
    std::set<uint64_t> all_slabs;
    std::vector<std::pair<ChunkKey, IndexRecord>> all_puts;
    bool sync = false;
    for (CommitRequest* r : group) {
      all_slabs.insert(r->slabs->begin(), r->slabs->end());
      all_puts.insert(all_puts.end(), r->puts->begin(), r->puts->end());
      sync |= r->sync_index;
    }
    absl::Status status = ssd->SyncSlabs(all_slabs);
    if (status.ok()) status = index->Commit(all_puts, {}, sync);
    lk.lock();
    for (CommitRequest* r : group) {
      r->result = status;
      r->done = true;
    }
    commit_leader_active = false;
    lk.unlock();
    commit_cv.notify_all();
    return me.result;
  }

  int64_t NowS() const { return opt.now_s(); }
  // Whether the namespace's RAM pool has any slot.
  bool HasRam(NamespaceId ns) const { return ram && ram->arena(ram->PoolOf(ns)) != nullptr; }
  int64_t NextAccess() { return ++access_clock; }
  std::string Where(const ChunkKey& key) const { return absl::StrCat("chunk ", key.Hex()); }

  absl::Status CheckPayload(NamespaceId ns, size_t bytes) const {
    auto it = namespaces.find(ns);
    if (it == namespaces.end()) {
      return absl::NotFoundError(absl::StrCat("namespace ", ns, " is not registered"));
    }
    if (bytes != it->second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk payload is ", bytes, " bytes, namespace ", ns, " expects ", it->second));
    }
    return absl::OkStatus();
  }

  // ---- RAM tier (all under mu) ----
  void DropRam(const ChunkKey& key) {
    if (!ram || !ram->Contains(key)) return;
    ram->Remove(key);
    if (!ssd_map.contains(key)) LeftStore(key);
  }

  // A RAM copy whose bytes no longer match their checksum (memory corruption): a miss,
  // counted, and the copy is dropped. Never handed out.
  void DropCorruptRam(const ChunkKey& key) {
    ++stats.checksum_failures;
    ++stats.ram_checksum_failures;
    RamEntry* e = ram->Find(key);
    if (e == nullptr) return;
    // Still dirty: the only copy is bad, nothing to write to SSD.
    e->dirty = false;
    DropRam(key);
  }

  bool RamCopyVerifies(std::span<const uint8_t> bytes, uint64_t checksum) const {
    return PayloadChecksum(bytes) == checksum;
  }

  // `key` is in neither tier any more: the chunks after it can no longer be reached by
  // a lookup, so they are the first to go.
  void LeftStore(const ChunkKey& key) {
    if (ram) ram->MarkOrphansOf(key);
    ssd_order.MarkOrphansOf(key);
  }

  // A free slot of the RAM pool, evicting from that pool as needed. With allow_writeback,
  // dirty victims are written to SSD first (demotion); without, the call gives up instead
  // of waiting on I/O.
  absl::StatusOr<uint32_t> AllocRamSlot(std::unique_lock<std::mutex>& lk, RamPoolId pool,
                                        bool allow_writeback) {
    while (true) {
      if (std::optional<uint32_t> slot = ram->TakeFreeSlot(pool)) return *slot;
      std::optional<ChunkKey> victim = ram->PickVictim(pool, NowS());
      if (!victim) {
        return absl::ResourceExhaustedError(pool == 0
                                                ? std::string("RAM tier is full")
                                                : absl::StrCat("RAM pool ", pool, " is full"));
      }
      RamEntry& e = *ram->Find(*victim);
      if (e.dirty && ssd) {
        if (!allow_writeback)
          return absl::ResourceExhaustedError("RAM tier is full of unflushed chunks");
        if (e.flushing) {
          flush_done.wait(lk);
          continue;
        }
        FlushLocked(lk, {*victim}, /*sync_index=*/false);
        const RamEntry* again = ram->Find(*victim);
        if (again != nullptr && again->dirty && !again->flushing) {
          return absl::InternalError(absl::StrCat("cannot demote ", Where(*victim), " to SSD"));
        }
        ++stats.demotions;
        continue;
      }
      DropRam(*victim);
      ++stats.ram_evictions;
    }
  }

  // Copies bytes into a fresh slot of the namespace's RAM pool and publishes it. The copy
  // runs without the lock: the reserved slot is in neither the free list nor the map, so
  // nobody else sees it. `checksum` is the payload's, if the caller knows it (0: computed
  // here from the copy).
  absl::Status InsertRam(std::unique_lock<std::mutex>& lk, NamespaceId ns, const ChunkKey& key,
                         const std::optional<ChunkKey>& parent, std::span<const uint8_t> bytes,
                         uint64_t checksum, bool dirty, int64_t expires_s, bool allow_writeback) {
    const RamPoolId pool = ram->PoolOf(ns);
    absl::StatusOr<uint32_t> slot = AllocRamSlot(lk, pool, allow_writeback);
    if (!slot.ok()) return slot.status();
    lk.unlock();
    uint8_t* dst = ram->SlotData(pool, *slot);
    std::memcpy(dst, bytes.data(), bytes.size());
    if (checksum == 0) checksum = PayloadChecksum(std::span<const uint8_t>(dst, bytes.size()));
    lk.lock();
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
  void FreeSsdSlot(uint64_t slot) {
    if (ssd_readers.contains(slot)) {
      ssd_free_on_release.insert(slot);
    } else {
      ssd_free.push_back(slot);
    }
  }

  void RemoveSsd(const ChunkKey& key) {
    auto it = ssd_map.find(key);
    if (it == ssd_map.end()) return;
    const uint64_t slot = GlobalSlot(it->second);
    ssd_map.erase(it);
    ssd_order.Remove(key);
    FreeSsdSlot(slot);
    // A RAM copy stays, but it is no longer backed by SSD and is not rewritten.
    if (!ram || !ram->Contains(key)) LeftStore(key);
  }

  uint64_t GlobalSlot(const IndexRecord& r) const {
    return uint64_t{r.slab} * slots_per_slab + r.slot;
  }

  // A free SSD slot. Victims are removed from memory at once and their keys appended to
  // `evicted`; the caller commits those deletions (synced) before writing the slot, so a
  // crash can never leave an index entry pointing at another chunk's bytes.
  absl::StatusOr<uint64_t> AllocSsdSlot(std::vector<ChunkKey>* evicted) {
    while (ssd_free.empty()) {
      std::optional<ChunkKey> victim = ssd_order.PickVictim(NowS());
      if (!victim) return absl::ResourceExhaustedError("SSD tier is full of pinned chunks");
      RemoveSsd(*victim);
      evicted->push_back(*victim);
      ++stats.ssd_evictions;
      if (!ssd_free.empty()) break;
    }
    const uint64_t slot = ssd_free.back();
    ssd_free.pop_back();
    return slot;
  }

  // One chunk on its way to SSD.
  struct PendingWrite {
    ChunkKey key;
    IndexRecord record;
    std::span<const uint8_t> payload;
    size_t result_index = 0;
    absl::Status status;
    // The checksum the payload must have (a RAM copy's), or 0: a copy that no longer
    // matches it was corrupted in memory and is not written.
    uint64_t expected_checksum = 0;
  };

  // Writes chunks to SSD and commits their index entries, then publishes them. Called
  // with the lock held; releases it during I/O and commits. Fills each status.
  void WriteToSsd(std::unique_lock<std::mutex>& lk, std::vector<PendingWrite>& writes,
                  bool sync_index) {
    std::vector<ChunkKey> evicted;
    std::vector<SlotWrite> slot_writes;
    std::vector<size_t> which;
    for (size_t i = 0; i < writes.size(); ++i) {
      absl::StatusOr<uint64_t> slot = AllocSsdSlot(&evicted);
      if (!slot.ok()) {
        writes[i].status = slot.status();
        continue;
      }
      IndexRecord& r = writes[i].record;
      r.slab = static_cast<uint32_t>(*slot / slots_per_slab);
      r.slot = static_cast<uint32_t>(*slot % slots_per_slab);
      r.sequence = next_sequence++;
      r.payload_bytes = static_cast<uint32_t>(writes[i].payload.size());
      r.checksum = 0;  // computed by the SSD tier from the staged copy
      slot_writes.push_back(
          {*slot, SlotHeader{r.namespace_id, r.payload_bytes, writes[i].key, 0, r.sequence},
           writes[i].payload});
      which.push_back(i);
    }
    lk.unlock();
    absl::Status evict_status = index->Commit({}, evicted, /*sync=*/true);
    std::vector<absl::Status> io(slot_writes.size(), evict_status);
    if (evict_status.ok()) io = ssd->Write(slot_writes);
    for (size_t k = 0; k < slot_writes.size(); ++k) {
      writes[which[k]].record.checksum = slot_writes[k].header.payload_checksum;
    }
    lk.lock();
    // Publish what reached the disk; readers may find it before the commit, which is safe:
    // the bytes are there and verify. A failed commit unpublishes it again.
    std::vector<std::pair<ChunkKey, IndexRecord>> puts;
    std::set<uint64_t> slabs;
    for (size_t k = 0; k < slot_writes.size(); ++k) {
      PendingWrite& w = writes[which[k]];
      if (!io[k].ok()) {
        w.status = io[k];
        ++stats.write_errors;
        FreeSsdSlot(slot_writes[k].slot);
        continue;
      }
      if (w.expected_checksum != 0 && w.record.checksum != w.expected_checksum) {
        w.status = absl::DataLossError(
            absl::StrCat(Where(w.key), ": the RAM copy no longer matches its checksum"));
        FreeSsdSlot(slot_writes[k].slot);
        continue;
      }
      if (ssd_map.contains(w.key)) {  // a concurrent writer stored it first
        w.status = absl::AlreadyExistsError(Where(w.key));
        FreeSsdSlot(slot_writes[k].slot);
        continue;
      }
      auto pin = pins.find(w.key);
      w.record.pin_until_s = pin == pins.end() ? 0 : pin->second;
      ssd_map[w.key] = w.record;
      ssd_order.Add(w.key, w.record.parent, NextAccess(), w.record.pin_until_s, w.record.expires_s);
      puts.emplace_back(w.key, w.record);
      slabs.insert(w.record.slab);
    }
    lk.unlock();
    absl::Status commit = puts.empty() ? absl::OkStatus() : CommitDurably(slabs, puts, sync_index);
    lk.lock();
    if (!commit.ok()) {
      for (auto& [key, rec] : puts) {
        RemoveSsd(key);
        for (PendingWrite& w : writes) {
          if (w.key == key) w.status = commit;
        }
      }
    }
  }

  // Writes dirty RAM chunks to SSD (write-behind and demotion). Called with the lock.
  void FlushLocked(std::unique_lock<std::mutex>& lk, const std::vector<ChunkKey>& keys,
                   bool sync_index) {
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
    WriteToSsd(lk, writes, sync_index);
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

  void WriterLoop() {
    std::unique_lock lk(mu);
    while (true) {
      work.wait(lk, [&] { return stopping || !dirty_queue.empty(); });
      if (dirty_queue.empty() && stopping) break;
      std::vector<ChunkKey> batch;
      while (!dirty_queue.empty() && batch.size() < opt.queue_depth) {
        batch.push_back(dirty_queue.front());
        dirty_queue.pop_front();
      }
      const uint64_t errors_before = stats.write_errors;
      FlushLocked(lk, batch, /*sync_index=*/false);
      if (stats.write_errors != errors_before && !stopping) {
        // Back off on a failing disk instead of spinning on it.
        work.wait_for(lk, std::chrono::milliseconds(50));
      }
      if (stopping && stats.write_errors - errors_before > 0) {
        dirty_queue.clear();  // shutting down on a failing disk: give up on these
      }
    }
  }

  StoreOptions opt;
  uint64_t slot_bytes = 0;
  uint64_t slots_per_slab = 0;
  std::unique_ptr<ChunkIndex> index;
  std::unique_ptr<SsdTier> ssd;
  std::unique_ptr<RamTier> ram;  // null without a RAM tier

  mutable std::mutex mu;
  std::condition_variable work;        // the writer has something to do
  std::condition_variable flush_done;  // a flush finished
  std::unordered_map<NamespaceId, uint64_t> namespaces;
  std::unordered_map<ChunkKey, int64_t, ChunkKeyHash> pins;
  int64_t access_clock = 0;

  std::unordered_map<ChunkKey, IndexRecord, ChunkKeyHash> ssd_map;
  std::vector<uint64_t> ssd_free;
  std::unordered_map<uint64_t, int> ssd_readers;
  std::unordered_set<uint64_t> ssd_free_on_release;
  std::unordered_set<ChunkKey, ChunkKeyHash> access_dirty;  // last access to persist
  EvictionOrder ssd_order;
  uint64_t next_sequence = 1;

  std::mutex commit_mu;  // group commit state, never held with mu
  std::condition_variable commit_cv;
  struct CommitRequest {
    const std::set<uint64_t>* slabs;
    const std::vector<std::pair<ChunkKey, IndexRecord>>* puts;
    bool sync_index;
    absl::Status result;
    bool done = false;
  };
  std::vector<CommitRequest*> commit_queue;
  bool commit_leader_active = false;

  std::deque<ChunkKey> dirty_queue;
  int flushes_in_progress = 0;
  bool stopping = false;
  std::thread writer;
  StoreStats stats;
};

namespace {

std::string EncodeNamespaces(const std::unordered_map<NamespaceId, uint64_t>& ns) {
  std::vector<std::pair<NamespaceId, uint64_t>> sorted(ns.begin(), ns.end());
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (const auto& [id, bytes] : sorted)
    absl::StrAppend(&out, out.empty() ? "" : ",", id, ":", bytes);
  return out;
}

}  // namespace

absl::Status ChunkStore::Impl::Open() {
  if (opt.data_dir.empty()) return absl::InvalidArgumentError("data folder is empty");
  const bool adopt = opt.max_chunk_bytes == 0;  // tools: take the folder's geometry
  std::error_code ec;
  std::filesystem::create_directories(opt.data_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", opt.data_dir, ": ", ec.message()));
  absl::StatusOr<std::unique_ptr<ChunkIndex>> idx = ChunkIndex::Open(opt.data_dir + "/index");
  if (!idx.ok()) return idx.status();
  index = *std::move(idx);

  if (adopt) {
    for (auto [name, value] : {std::pair{"slot_bytes", &opt.max_chunk_bytes},
                               std::pair{"capacity_slots", &opt.ssd_bytes}}) {
      absl::StatusOr<std::optional<std::string>> stored = index->GetMeta(name);
      if (!stored.ok()) return stored.status();
      if (!stored->has_value() || !absl::SimpleAtoi(**stored, value)) {
        return absl::FailedPreconditionError(
            absl::StrCat(opt.data_dir, " holds no chunk store (no ", name, ")"));
      }
    }
    opt.ssd_bytes *= opt.max_chunk_bytes;  // capacity_slots × slot_bytes
    opt.max_chunk_bytes -= kSlotHeaderBytes;
    opt.ram_bytes = 0;
  }
  // The slot size and slab geometry are fixed when the folder is made.
  slot_bytes = SlotBytesFor(opt.max_chunk_bytes);
  slots_per_slab = std::max<uint64_t>(1, opt.slab_bytes / slot_bytes);
  for (auto [name, value] :
       {std::pair{"slot_bytes", &slot_bytes}, std::pair{"slots_per_slab", &slots_per_slab}}) {
    absl::StatusOr<std::optional<std::string>> stored = index->GetMeta(name);
    if (!stored.ok()) return stored.status();
    if (!stored->has_value()) {
      if (absl::Status s = index->PutMeta(name, std::to_string(*value)); !s.ok()) return s;
      continue;
    }
    uint64_t v = 0;
    if (!absl::SimpleAtoi(**stored, &v) || v == 0) {
      return absl::DataLossError(
          absl::StrCat("corrupt metadata ", name, "=", **stored, " in ", opt.data_dir));
    }
    if (std::string(name) == "slot_bytes" && v != slot_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("data folder ", opt.data_dir, " was made with ", v,
                       "-byte slots; max chunk size ", opt.max_chunk_bytes, " needs ", slot_bytes));
    }
    *value = v;  // slots_per_slab: the folder's geometry wins over the option
  }
  absl::StatusOr<std::optional<std::string>> ns = index->GetMeta("namespaces");
  if (!ns.ok()) return ns.status();
  if (ns->has_value()) {
    for (absl::string_view item : absl::StrSplit(**ns, ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
      NamespaceId id = 0;
      uint64_t bytes = 0;
      if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtoi(kv.second, &bytes)) {
        return absl::DataLossError(absl::StrCat("corrupt namespace list: ", **ns));
      }
      namespaces[id] = bytes;
    }
  }

  const uint64_t capacity_slots = opt.ssd_bytes / slot_bytes;
  if (absl::Status s = index->PutMeta("capacity_slots", std::to_string(capacity_slots)); !s.ok())
    return s;
  if (capacity_slots > 0) {
    SsdTierOptions so;
    so.dir = opt.data_dir + "/slabs";
    so.slot_bytes = slot_bytes;
    so.capacity_slots = capacity_slots;
    so.slots_per_slab = slots_per_slab;
    so.backend = opt.io_backend;
    so.queue_depth = opt.queue_depth;
    so.lanes = opt.io_lanes;
    so.faults = opt.faults;
    absl::StatusOr<std::unique_ptr<SsdTier>> tier = SsdTier::Open(so);
    if (!tier.ok()) return tier.status();
    ssd = *std::move(tier);
    if (opt.preallocate_ssd) {
      if (absl::Status s = ssd->PreallocateAll(); !s.ok()) return s;
    } else if (opt.preallocate_ssd_background) {
      ssd->PreallocateInBackground();
    }
  }

  // Load the index. Entries past the configured capacity (it shrank) are dropped;
  // two entries on one slot (impossible unless the index was edited) keep the newer.
  std::vector<bool> used(capacity_slots, false);
  std::unordered_map<uint64_t, ChunkKey> owner;
  std::vector<ChunkKey> stale;
  int64_t max_access = 0;
  absl::Status scan = index->ForEach([&](const ChunkKey& key, const IndexRecord& r) {
    const uint64_t slot = GlobalSlot(r);
    auto ns_it = namespaces.find(r.namespace_id);
    if (slot >= capacity_slots || ns_it == namespaces.end() || ns_it->second != r.payload_bytes) {
      stale.push_back(key);
      return;
    }
    if (used[slot]) {
      const ChunkKey other = owner[slot];
      if (ssd_map[other].sequence > r.sequence) {
        stale.push_back(key);
        return;
      }
      ssd_map.erase(other);
      stale.push_back(other);
    }
    used[slot] = true;
    owner[slot] = key;
    ssd_map[key] = r;
    next_sequence = std::max(next_sequence, r.sequence + 1);
    max_access = std::max(max_access, r.last_access_s);
  });
  if (!scan.ok()) return scan;
  if (absl::Status s = index->Commit({}, stale, true); !s.ok()) return s;
  access_clock = max_access * 1'000'000;
  for (const auto& [key, r] : ssd_map) {
    ssd_order.Add(key, r.parent, r.last_access_s * 1'000'000, r.pin_until_s, r.expires_s);
    if (r.pin_until_s > 0) pins[key] = r.pin_until_s;
  }
  // Chunks whose parent did not survive (evicted or dropped before the restart) are
  // unreachable: they go first.
  for (const auto& [key, r] : ssd_map) {
    if (r.parent && !ssd_map.contains(*r.parent)) ssd_order.MarkOrphansOf(*r.parent);
  }
  for (uint64_t s = capacity_slots; s-- > 0;) {
    if (!used[s]) ssd_free.push_back(s);  // lowest slot on top: slabs fill in order
  }

  std::vector<uint64_t> pool_bytes{opt.ram_bytes};
  pool_bytes.insert(pool_bytes.end(), opt.ram_pool_bytes.begin(), opt.ram_pool_bytes.end());
  absl::StatusOr<std::unique_ptr<RamTier>> tier = RamTier::Create(opt.max_chunk_bytes, pool_bytes);
  if (!tier.ok()) return tier.status();
  if (!(*tier)->empty_capacity()) ram = *std::move(tier);
  if (!ssd && !ram)
    return absl::InvalidArgumentError("neither a RAM nor an SSD tier has room for one chunk");

  stats.slot_bytes = slot_bytes;
  stats.ram_capacity_chunks = ram ? ram->capacity_slots() : 0;
  stats.ssd_capacity_chunks = capacity_slots;
  if (ssd) {
    stats.io_backend = ssd->backend_name();
    stats.io_fallback_reason = ssd->fallback_reason();
    if (!stats.io_fallback_reason.empty()) {
      std::fprintf(stderr, "kvcache storage: io_uring unavailable (%s); using pread/pwrite\n",
                   stats.io_fallback_reason.c_str());
    }
  }
  writer = std::thread([this] { WriterLoop(); });
  return absl::OkStatus();
}

void ChunkStore::Impl::Close() {
  {
    std::lock_guard lk(mu);
    stopping = true;
  }
  work.notify_all();
  if (writer.joinable()) writer.join();
  // Persist coarse last-access times so LRU order survives the restart.
  std::vector<std::pair<ChunkKey, IndexRecord>> puts;
  for (const ChunkKey& key : access_dirty) {
    auto it = ssd_map.find(key);
    if (it != ssd_map.end()) puts.emplace_back(key, it->second);
  }
  (void)index->Commit(puts, {}, /*sync=*/true);
}

// ---- ChunkStore ----

RamLease& RamLease::operator=(RamLease&& o) noexcept {
  if (this != &o) {
    if (store_ != nullptr) store_->ReleaseRamSlot(pool_, slot_);
    store_ = std::exchange(o.store_, nullptr);
    pool_ = o.pool_;
    slot_ = o.slot_;
    offset_ = o.offset_;
    bytes_ = o.bytes_;
  }
  return *this;
}

RamLease::~RamLease() {
  if (store_ != nullptr) store_->ReleaseRamSlot(pool_, slot_);
}

ChunkStore::ChunkStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ChunkStore::~ChunkStore() { impl_->Close(); }

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Open(StoreOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Open(); !s.ok()) {
    if (impl->writer.joinable()) impl->Close();
    return s;
  }
  return std::unique_ptr<ChunkStore>(new ChunkStore(std::move(impl)));
}

absl::Status ChunkStore::RegisterNamespace(NamespaceId ns, uint64_t chunk_bytes) {
  Impl& s = *impl_;
  std::lock_guard lk(s.mu);
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
  if (absl::Status st = s.index->PutMeta("namespaces", EncodeNamespaces(next)); !st.ok()) return st;
  s.namespaces = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ChunkStore::ChunkBytes(NamespaceId ns) const {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->namespaces.find(ns);
  if (it == impl_->namespaces.end()) {
    return absl::NotFoundError(absl::StrCat("namespace ", ns, " is not registered"));
  }
  return it->second;
}

absl::StatusOr<PutResult> ChunkStore::Put(const PutRequest& request, const PutOptions& options) {
  return PutBatch(std::span(&request, 1), options)[0];
}

std::vector<absl::StatusOr<PutResult>> ChunkStore::PutBatch(std::span<const PutRequest> requests,
                                                            const PutOptions& options) {
  Impl& s = *impl_;
  std::vector<absl::StatusOr<PutResult>> results(requests.size(), PutResult{});
  std::unique_lock lk(s.mu);
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
    if (durable && !s.ssd) {
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
      rec.created_s = rec.last_access_s = now;
      rec.expires_s = expires;
      writes.push_back({r.key, rec, r.payload, i, {}, 0});
    } else {
      memory_puts.push_back(i);
    }
  }
  if (!writes.empty()) {
    s.WriteToSsd(lk, writes, /*sync_index=*/true);
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
          (void)s.InsertRam(lk, r.namespace_id, r.key, r.parent, r.payload, w.record.checksum,
                            false, expires, false);
        }
      }
    }
  }
  for (size_t i : memory_puts) {
    const PutRequest& r = requests[i];
    absl::Status st = s.InsertRam(lk, r.namespace_id, r.key, r.parent, r.payload, 0,
                                  /*dirty=*/s.ssd != nullptr, expires, /*allow_writeback=*/true);
    if (absl::IsAlreadyExists(st)) {
      results[i] = PutResult{true};
    } else if (!st.ok()) {
      results[i] = st;
    }
  }
  return results;
}

absl::Status ChunkStore::Get(NamespaceId ns, const ChunkKey& key, std::span<uint8_t> out) {
  std::span<uint8_t> outs[] = {out};
  return GetBatch(ns, std::span(&key, 1), outs)[0];
}

std::vector<absl::Status> ChunkStore::GetBatch(NamespaceId ns, std::span<const ChunkKey> keys,
                                               std::span<const std::span<uint8_t>> outs) {
  Impl& s = *impl_;
  std::vector<absl::Status> status(keys.size());
  if (outs.size() != keys.size()) {
    status.assign(keys.size(), absl::InvalidArgumentError("one output buffer per key"));
    return status;
  }
  std::vector<SlotRead> reads;
  std::vector<size_t> read_index;
  struct RamHit {
    size_t index;
    RamPoolId pool;
    uint32_t slot;
    uint64_t checksum;
  };
  std::vector<RamHit> ram_hits;
  std::unique_lock lk(s.mu);
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
    const uint64_t slot = s.GlobalSlot(rec);
    ++s.ssd_readers[slot];
    s.ssd_order.Touch(keys[i], s.NextAccess());
    if (rec.last_access_s / 3600 != now / 3600) {  // coarse: hourly resolution on disk
      rec.last_access_s = now;
      s.access_dirty.insert(keys[i]);
    }
    reads.push_back(
        {slot, SlotHeader{ns, rec.payload_bytes, keys[i], rec.checksum, rec.sequence}, outs[i]});
    read_index.push_back(i);
  }
  lk.unlock();
  std::vector<size_t> corrupt;  // ram_hits entries whose copy did not verify
  for (size_t h = 0; h < ram_hits.size(); ++h) {
    const RamHit& hit = ram_hits[h];
    std::memcpy(outs[hit.index].data(), s.ram->SlotData(hit.pool, hit.slot),
                outs[hit.index].size());
    if (!s.RamCopyVerifies(outs[hit.index], hit.checksum)) corrupt.push_back(h);
  }
  std::vector<absl::Status> io;
  if (!reads.empty()) io = s.ssd->Read(reads);
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
    const uint64_t slot = reads[k].slot;
    if (--s.ssd_readers[slot] == 0) {
      s.ssd_readers.erase(slot);
      if (s.ssd_free_on_release.erase(slot) > 0) s.ssd_free.push_back(slot);
    }
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
      const int64_t expires = d->second.expires_s;
      const uint64_t checksum = d->second.checksum;
      if (s.InsertRam(lk, ns, keys[i], parent, outs[i], checksum, false, expires, false).ok())
        ++s.stats.promotions;
    }
  }
  return status;
}

absl::StatusOr<RamLease> ChunkStore::LeaseRam(NamespaceId ns, const ChunkKey& key) {
  Impl& s = *impl_;
  std::unique_lock lk(s.mu);
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

void ChunkStore::ReleaseRamSlot(RamPoolId pool, uint32_t slot) {
  std::lock_guard lk(impl_->mu);
  impl_->ram->Unref(pool, slot);
}

absl::Status ChunkStore::SetRamPool(NamespaceId ns, RamPoolId pool) {
  std::lock_guard lk(impl_->mu);
  if (!impl_->ram) return absl::FailedPreconditionError("this store has no RAM tier");
  return impl_->ram->SetPool(ns, pool);
}

RamPoolId ChunkStore::RamPoolOf(NamespaceId ns) const {
  std::lock_guard lk(impl_->mu);
  return impl_->ram ? impl_->ram->PoolOf(ns) : 0;
}

size_t ChunkStore::ram_pool_count() const { return impl_->ram ? impl_->ram->pool_count() : 0; }

int ChunkStore::ram_arena_fd(RamPoolId pool) const {
  const RamArena* a =
      impl_->ram && pool < impl_->ram->pool_count() ? impl_->ram->arena(pool) : nullptr;
  return a ? a->read_only_fd() : -1;
}

uint64_t ChunkStore::ram_arena_bytes(RamPoolId pool) const {
  const RamArena* a =
      impl_->ram && pool < impl_->ram->pool_count() ? impl_->ram->arena(pool) : nullptr;
  return a ? a->bytes() : 0;
}

Tier ChunkStore::Contains(NamespaceId ns, const ChunkKey& key) const {
  return Lookup(ns, std::span(&key, 1))[0];
}

std::vector<Tier> ChunkStore::Lookup(NamespaceId ns, std::span<const ChunkKey> keys) const {
  const Impl& s = *impl_;
  std::lock_guard lk(s.mu);
  std::vector<Tier> tiers(keys.size(), Tier::kNone);
  for (size_t i = 0; i < keys.size(); ++i) {
    const RamEntry* r = s.ram ? s.ram->Find(keys[i]) : nullptr;
    if (r != nullptr && r->ns == ns) {
      tiers[i] = Tier::kRam;
      continue;
    }
    auto d = s.ssd_map.find(keys[i]);
    if (d != s.ssd_map.end() && d->second.namespace_id == ns) tiers[i] = Tier::kSsd;
  }
  return tiers;
}

absl::Status ChunkStore::Erase(NamespaceId ns, const ChunkKey& key) {
  return EraseBatch(ns, std::span(&key, 1))[0];
}

std::vector<absl::Status> ChunkStore::EraseBatch(NamespaceId ns, std::span<const ChunkKey> keys) {
  Impl& s = *impl_;
  std::vector<absl::Status> status(keys.size());
  std::vector<ChunkKey> deletes;
  std::vector<uint64_t> slots;
  std::unique_lock lk(s.mu);
  for (size_t i = 0; i < keys.size(); ++i) {
    const ChunkKey& key = keys[i];
    s.flush_done.wait(lk, [&] {
      const RamEntry* r = s.ram ? s.ram->Find(key) : nullptr;
      return r == nullptr || !r->flushing;
    });
    bool found = false;
    if (s.ram && s.ram->FindIn(ns, key) != nullptr) {
      s.DropRam(key);
      found = true;
    }
    auto d = s.ssd_map.find(key);
    if (d != s.ssd_map.end() && d->second.namespace_id == ns) {
      // The slot is reused only after the deletion is committed (below).
      slots.push_back(s.GlobalSlot(d->second));
      s.ssd_map.erase(d);
      s.ssd_order.Remove(key);
      deletes.push_back(key);
      found = true;
    }
    if (found && !(s.ram && s.ram->Contains(key)) && !s.ssd_map.contains(key)) s.LeftStore(key);
    if (found) {
      s.pins.erase(key);
    } else {
      status[i] = absl::NotFoundError(absl::StrCat(s.Where(key), " is not cached"));
    }
  }
  lk.unlock();
  absl::Status committed = s.index->Commit({}, deletes, /*sync=*/true);
  lk.lock();
  if (!committed.ok()) {
    // The entries may still be on disk: leave their slots unused until the next open.
    for (auto& st : status) {
      if (st.ok()) st = committed;
    }
    return status;
  }
  for (uint64_t slot : slots) s.FreeSsdSlot(slot);
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
  std::unique_lock lk(s.mu);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto d = s.ssd_map.find(keys[i]);
    const bool in_ram = s.ram && s.ram->FindIn(ns, keys[i]) != nullptr;
    const bool on_ssd = d != s.ssd_map.end() && d->second.namespace_id == ns;
    if (!in_ram && !on_ssd) {
      status[i] = absl::NotFoundError(absl::StrCat(s.Where(keys[i]), " is not cached"));
      continue;
    }
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
  std::unique_lock lk(s.mu);
  s.work.notify_all();
  const uint64_t errors = s.stats.write_errors;
  while (!s.dirty_queue.empty() || s.flushes_in_progress > 0) {
    s.flush_done.wait_for(lk, std::chrono::milliseconds(20));
    if (s.stats.write_errors != errors) return absl::InternalError("writing to SSD failed");
  }
  return absl::OkStatus();
}

std::vector<std::pair<NamespaceId, ChunkKey>> ChunkStore::ListSsd() const {
  std::lock_guard lk(impl_->mu);
  std::vector<std::pair<NamespaceId, ChunkKey>> out;
  out.reserve(impl_->ssd_map.size());
  for (const auto& [key, rec] : impl_->ssd_map) out.emplace_back(rec.namespace_id, key);
  return out;
}

StoreStats ChunkStore::Stats() const {
  std::lock_guard lk(impl_->mu);
  StoreStats st = impl_->stats;
  st.ram_chunks = impl_->ram ? impl_->ram->size() : 0;
  st.ssd_chunks = impl_->ssd_map.size();
  st.pending_write_behind = impl_->dirty_queue.size();
  return st;
}

}  // namespace kvc::storage
