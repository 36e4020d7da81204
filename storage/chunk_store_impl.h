// ChunkStore's internals (not a public header): the state behind one mutex and the tier
// operations that the public calls (chunk_store.cc), opening and closing
// (chunk_store_open.cc) and the tiers' moves between RAM and SSD (chunk_store_tiers.cc)
// share. Every method here is called with `mu` held unless it says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "storage/chunk_index.h"
#include "storage/chunk_store.h"
#include "storage/eviction.h"
#include "storage/group_commit.h"
#include "storage/hbm_tier.h"
#include "storage/ram_tier.h"
#include "storage/shared_link.h"
#include "storage/slot_format.h"
#include "storage/slot_reservation.h"
#include "storage/ssd_catalog.h"
#include "storage/ssd_tier.h"

namespace kvc::storage {

class ChunkStore::Impl {
 public:
  // One size class of the SSD tier (docs/storage.md, "Size classes"): slots of one size in
  // their own slab folder, with their catalog and their reservation record. A chunk goes
  // to the class of its exact slot size (header + payload, rounded to 4 KiB), opened the
  // first time a chunk of that size is stored; every class draws on one device budget
  // (ssd_budget), and eviction frees the coldest chunks whatever their class.
  struct SsdClass {
    uint32_t code = 0;  // what index records name it by (IndexRecord::slot_class)
    uint64_t slot_bytes = 0;
    uint64_t slots_per_slab = 0;
    std::string reservation_meta;  // the index metadata its reservation is kept under
    std::unique_ptr<SsdTier> tier;
    std::unique_ptr<SsdCatalog> catalog;  // thread-safe; called under mu (see catalog)
    uint64_t SlotOf(const IndexRecord& r) const {
      return uint64_t{r.slab} * slots_per_slab + r.slot;
    }
    void Place(uint64_t slot, IndexRecord* r) const {
      r->slab = static_cast<uint32_t>(slot / slots_per_slab);
      r->slot = static_cast<uint32_t>(slot % slots_per_slab);
      r->slot_class = code;
    }
  };
  // A chunk's slot: its class and the slot within it.
  struct SsdSlot {
    SsdClass* cls = nullptr;
    uint64_t slot = 0;
  };
  Impl(StoreOptions o, StoreSeams s) : opt(std::move(o)), seams(std::move(s)) {
    if (!seams.now_s) seams.now_s = WallSeconds;
  }

  absl::Status Open() ABSL_LOCKS_EXCLUDED(mu);
  void Close() ABSL_LOCKS_EXCLUDED(mu);
  // Opens the index and, with `scan`, reads its records; a damaged index is salvaged
  // (index_damaged, and its records read whatever `scan` says).
  absl::Status OpenIndex(std::vector<std::pair<ChunkKey, IndexRecord>>* records, bool scan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The salvage of an index found damaged (`damage`): reopened keeping what still reads,
  // or made anew; its records read into *records.
  absl::Status SalvageIndex(const absl::Status& damage, bool open_failed,
                            std::vector<std::pair<ChunkKey, IndexRecord>>* records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Index entries committed and data synced, for all concurrent writers (group_commit.h).
  absl::Status CommitDurably(const GroupCommit::SlabSet& slabs,
                             const std::vector<std::pair<ChunkKey, IndexRecord>>& puts) {
    return commits->Commit(slabs, puts);
  }

  // ---- loading the index (chunk_store_open.cc) ----
  // What the index's records become in memory: built without mu (by the loader thread, or
  // by Open itself) from the records and the slots, then installed under mu in one step.
  struct Loaded {
    std::unordered_map<ChunkKey, IndexRecord, ChunkKeyHash> map;
    std::unordered_map<NamespaceId, uint64_t> namespaces;  // the store's, and any rebuilt
    EvictionOrder order;
    std::unordered_map<ChunkKey, int64_t, ChunkKeyHash> pins;
    int64_t access_clock = 0;
    bool damaged = false;           // the index was (or was found while loading) damaged
    uint64_t rebuilds = 0;          // damage found while loading (StoreStats::index_rebuilds)
    uint64_t recovered = 0;         // chunks indexed from their slots
    uint64_t unreadable_slots = 0;  // slots recovery could not read (StoreStats)
  };
  // How far numbering jumps past the highest known sequence when recovery could not read
  // a slot: past any number of writes between two syncs of the index.
  static constexpr uint64_t kSequenceGapAfterUnreadable = uint64_t{1} << 32;
  // The SSD classes as a load sees them: fixed while it runs (a class is opened only by a
  // write, and writes wait for the load), so it reads them without mu.
  using ClassList = std::vector<SsdClass*>;
  static size_t ClassIndexIn(const ClassList& cls, const IndexRecord& r);
  static std::string FurtherClassListOf(const ClassList& cls);  // as FurtherClassList
  // Builds *out from the records (dedupe, recovery from the slots, the eviction order)
  // and loads each class's catalog; commits what recovery found. Touches no state under mu.
  absl::Status BuildLoaded(std::vector<std::pair<ChunkKey, IndexRecord>> records,
                           const ClassList& cls, Loaded* out) ABSL_LOCKS_EXCLUDED(mu);
  void InstallLoaded(Loaded&& loaded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The loader thread: reads the records (salvaging an index found damaged), builds and
  // installs them; an error it cannot get past fails every later call on chunks.
  void LoadInBackground(ClassList cls) ABSL_LOCKS_EXCLUDED(mu);
  // Waits (releasing mu) until the index is loaded; then the load's error, if it failed.
  absl::Status WaitLoaded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (loading) loaded_cv.wait(mu);
    return load_error;
  }
  // While loading: Lookup and Get from the index on disk, without mu (Loading.readers
  // keeps the index from being replaced under them). Null where the store is loaded.
  struct LoadingView {
    std::unordered_map<NamespaceId, uint64_t> namespaces;  // as at open
    ClassList classes;
    std::atomic<bool> serving{true};  // false: the index is being salvaged (answer misses)
    std::atomic<int> readers{0};
  };
  // The record the index has for `key` in namespace `ns`, if the load would keep it.
  std::optional<IndexRecord> RecordWhileLoading(const LoadingView& v, NamespaceId ns,
                                                const ChunkKey& key) const;
  std::vector<Tier> LookupWhileLoading(LoadingView& v, NamespaceId ns,
                                       std::span<const ChunkKey> keys, bool leading_only) const;
  void GetWhileLoading(LoadingView& v, NamespaceId ns, std::span<const ChunkKey> keys,
                       std::span<const std::span<uint8_t>> outs, std::span<const size_t> todo,
                       bool outs_have_read_room, std::vector<absl::Status>* status,
                       std::vector<Tier>* served_from) const;

  // ---- recovery (chunk_store_recovery.cc; part of a load, without mu) ----
  // Brings the loaded records (l->map) up to date with the slots: the reserved slots
  // written after the reservation, or with whole_tier every slot (the index was damaged:
  // slots are then the only truth, and entries whose slot does not verify are dropped).
  // Keys whose entries go are appended to `stale`; recovered entries to `recovered`.
  absl::Status RecoverFromSlots(SsdClass& cls, const SlotReservation& reservation, bool whole_tier,
                                Loaded* l, std::vector<ChunkKey>* stale,
                                std::vector<std::pair<ChunkKey, IndexRecord>>* recovered);

  // Whether the slot the reservation names as the next one's first holds a chunk written
  // after the reservation (sequence ≥ its sequence_bound): a later synced reservation was lost (the
  // index's WAL came back short), and with it the entries of every chunk written under it.
  absl::StatusOr<bool> LaterReservationLost(SsdClass& cls, const SlotReservation& reservation);

  int64_t NowS() const { return seams.now_s(); }
  // Whether the namespace's RAM pool has any slot.
  bool HasRam(NamespaceId ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return ram && ram->arena(ram->PoolOf(ns)) != nullptr;
  }
  int64_t NextAccess() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return ++access_clock; }
  std::string Where(const ChunkKey& key) const { return absl::StrCat("chunk ", key.Hex()); }

  absl::Status CheckPayload(NamespaceId ns, size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
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
  void DropRam(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A RAM copy whose bytes no longer match their checksum (memory corruption): a miss,
  // counted, and the copy is dropped. Never handed out.
  void DropCorruptRam(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  bool RamCopyVerifies(std::span<const uint8_t> bytes, uint64_t checksum) const {
    return PayloadChecksum(bytes) == checksum;
  }
  bool verify_ram_reads() const { return opt.ram_verify == RamVerify::kEveryRead; }

  // `key` is in neither tier any more: the chunks after it can no longer be reached by
  // a lookup, so they are the first to go, and its T0 copy goes now.
  void LeftStore(NamespaceId ns, const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The tier holding the chunk in this namespace — kRam before kSsd — or kNone (T0 aside).
  Tier LowerTierOf(NamespaceId ns, const ChunkKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const RamEntry* r = ram ? ram->Find(key) : nullptr;
    if (r != nullptr && r->ns == ns) return Tier::kRam;
    auto d = ssd_map.find(key);
    return d != ssd_map.end() && d->second.namespace_id == ns ? Tier::kSsd : Tier::kNone;
  }
  // Whether RAM or SSD holds the chunk in this namespace.
  bool Holds(NamespaceId ns, const ChunkKey& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return LowerTierOf(ns, key) != Tier::kNone;
  }

  // ---- T0 (chunk_store_hbm.cc) ----
  // Copies the chunks just stored to T0 (write-through); takes and releases the lock.
  void WriteThroughHbm(std::span<const PutRequest> requests,
                       const std::vector<absl::StatusOr<PutResult>>& results)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A copy was put into T0 without the lock: keeps it only if the store still holds the
  // chunk (an erase or eviction in between dropped nothing from T0). Needs mu.
  bool KeepHbmCopy(NamespaceId ns, const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (Holds(ns, key)) return true;
    hbm->Erase(ns, key);
    return false;
  }

  // A free run of the RAM pool for a chunk of `bytes` (its first page), evicting from that
  // pool as needed. With allow_writeback, dirty victims are written to SSD first
  // (demotion); without, the call gives up instead of waiting on I/O.
  absl::StatusOr<uint32_t> AllocRamSlot(RamPoolId pool, uint64_t bytes, bool allow_writeback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Copies bytes into a fresh slot of the namespace's RAM pool and publishes it. The copy
  // runs without the lock: the reserved slot is in neither the free list nor the map, so
  // nobody else sees it. `checksum` is the payload's, if the caller knows it (0: computed
  // here from the copy).
  absl::Status InsertRam(NamespaceId ns, const ChunkKey& key, const std::optional<ChunkKey>& parent,
                         const std::optional<ChunkOrigin>& origin, const Payload& bytes,
                         uint64_t checksum, bool dirty, int64_t expires_s, bool allow_writeback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- SSD tier (all under mu) ----
  // Where in `classes` the class an index record names is (classes.size(): none).
  size_t ClassIndexOf(const IndexRecord& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    size_t c = 0;
    while (c < classes.size() && classes[c]->code != r.slot_class) ++c;
    return c;
  }
  // The class an index record names (null: none this store has).
  SsdClass* ClassOf(const IndexRecord& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t c = ClassIndexOf(r);
    return c < classes.size() ? classes[c].get() : nullptr;
  }
  SsdSlot SlotOf(const IndexRecord& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    SsdClass* c = ClassOf(r);
    return {c, c->SlotOf(r)};
  }
  // The class for chunks of `payload_bytes`: the one of their slot size, opened (its
  // folder made, its existence committed) if this is the first such chunk.
  absl::StatusOr<SsdClass*> ClassFor(uint64_t payload_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Opens a class's slab folder (slabs/ for code 0, slabs/c<slot bytes>/ for the others)
  // and makes its catalog: every slot free until the open loads them.
  absl::StatusOr<std::unique_ptr<SsdClass>> OpenClass(uint32_t code, uint64_t slot_bytes,
                                                      uint64_t slots_per_slab, uint16_t slot_format,
                                                      bool lay_out_ahead)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The same for a class after the first: slots of `bytes`, format 3, the folder's slabs.
  absl::StatusOr<std::unique_ptr<SsdClass>> OpenFurtherClass(uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The classes after the first, as the index's "ssd_classes" metadata lists them.
  std::string FurtherClassList() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What the classes take of the device budget now: every slot not free, at its size.
  uint64_t SsdTakenBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    uint64_t bytes = 0;
    for (const auto& c : classes) bytes += c->catalog->Taken() * c->slot_bytes;
    return bytes;
  }
  bool HasSsd() const { return ssd_budget > 0; }
  // The slot format of a chunk of `payload_bytes`: the first class's (which may keep an
  // older folder's) if the chunk is of its size, else format 3.
  uint16_t SsdFormatFor(uint64_t payload_bytes) const {
    return SlotBytesFor(payload_bytes, legacy_format) == slot_bytes ? legacy_format
                                                                    : kSlotFormatVersion;
  }
  // The slot size of a chunk of `payload_bytes`: its class's (what it is charged on SSD).
  uint64_t SsdSlotBytesFor(uint64_t payload_bytes) const {
    return SlotBytesFor(payload_bytes, SsdFormatFor(payload_bytes));
  }

  void RemoveSsd(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Each class's free slots past its last slot in use are forgotten and the whole slabs
  // past them removed, so the disk a class takes follows what it holds when the mix of
  // sizes moves (called after evictions).
  void GiveBackEmptySlabs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Reads slots of several classes (reads[k] of cls[k]), each class's in one batch, without
  // the lock (the catalogs' BeginRead keeps the slots). One status per read.
  static std::vector<absl::Status> ReadSlots(std::span<SlotRead> reads,
                                             std::span<SsdClass* const> cls);

  // Makes at least n free slots of the class reserved (slot_reservation.h), evicting the
  // coldest chunks of any class as needed — until the class has the slots and the device
  // budget has their bytes: the new reservation and the evictions are committed (synced)
  // together, after every write in flight to the class has committed its index entry.
  // Releases the lock while it waits or commits. Fewer than n only when the tier is full of
  // pinned chunks (ResourceExhausted) or the commit failed (its error).
  absl::Status EnsureReserved(SsdClass& cls, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Takes a chunk that is on SSD off the tier's map and eviction order, and returns its
  // slot — not yet free: CommitSsdRemovals frees it once the removal is durable.
  SsdSlot TakeOffSsd(const ChunkKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto d = ssd_map.find(key);
    const SsdSlot slot = SlotOf(d->second);
    ssd_map.erase(d);
    ssd_order.Remove(key);
    return slot;
  }
  // Commits (synced) the removal of chunks taken off the tier, then frees their slots. A
  // slot still listed in its class's reservation leaves it in the same commit, or its bytes
  // would be indexed again after a crash. On failure the entries may still be on disk:
  // their slots stay unused until the next open. Releases the lock while it commits.
  absl::Status CommitSsdRemovals(const std::vector<ChunkKey>& keys,
                                 const std::vector<SsdSlot>& slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- quotas (quota.h; all under mu) ----
  struct QuotaState {
    Quota quota;
    std::vector<NamespaceId> namespaces;
    // Bytes being written, not yet counted by the tiers (so concurrent writers of one
    // group cannot pass its limit together).
    uint64_t ram_in_flight = 0, ssd_in_flight = 0;
  };
  // The namespace's group, or null if it is in none (group 0).
  QuotaState* QuotaOf(NamespaceId ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  uint64_t RamBytesOf(const QuotaState& q) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  uint64_t SsdBytesOf(const QuotaState& q) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  uint64_t PinnedChunksOf(QuotaGroup group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Chunks pinned now and held in either tier (once each), whoever pinned them.
  uint64_t PinnedChunks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string QuotaFullError(const QuotaState& q, const char* tier, uint64_t limit) const {
    return absl::StrCat(
        q.quota.owner, " is at its ", tier, " quota of ", limit,
        " bytes and nothing it holds there can be evicted (pinned, or being written)");
  }
  // Makes room for `bytes` more of the namespace's chunks in RAM under its group's quota,
  // giving up the group's own chunks; counts them in flight in the group returned (null:
  // none), from which the caller subtracts them once published. ResourceExhausted when
  // the group's chunks there are all pinned.
  absl::StatusOr<QuotaState*> FitRamQuota(NamespaceId ns, uint64_t bytes, bool allow_writeback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tier pressure (quota.h): the next chunk to give up for a write that finds the tier (or
  // RAM pool) full — never one of a group within its guaranteed share of that tier.
  std::optional<ChunkKey> PickRamVictim(RamPoolId pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<ChunkKey> PickSsdVictim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether the namespace's chunks are guarded in RAM (ram = true) or on SSD: its group
  // has a limit there and holds no more than it.
  bool Guarded(NamespaceId ns, bool ram) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What each tier holds for guaranteed quotas (QuotaCapacity in chunk_store.h).
  ChunkStore::QuotaRoom QuotaRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::unordered_map<QuotaGroup, QuotaState> quota_groups ABSL_GUARDED_BY(mu);
  std::unordered_map<NamespaceId, QuotaGroup> quota_group_of ABSL_GUARDED_BY(mu);

  // Gives up one RAM chunk of `pool`: a dirty one is demoted to SSD first (with
  // allow_writeback; without, WouldBlockError). OK means progress: the caller looks again.
  absl::Status ReleaseRam(const ChunkKey& victim, bool allow_writeback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // One chunk on its way to SSD.
  struct PendingWrite {
    ChunkKey key;
    IndexRecord record;
    Payload payload;
    size_t result_index = 0;
    absl::Status status;
    // The checksum the payload must have (a RAM copy's), or 0: a copy that no longer
    // matches it was corrupted in memory and is not written.
    uint64_t expected_checksum = 0;
    QuotaState* quota = nullptr;  // the group whose ssd_in_flight counts its bytes
    uint64_t charged = 0;         // the bytes counted there
  };
  // The same for writes to SSD: evicts the groups' own SSD chunks (one synced commit for
  // all, running ahead so a group at its limit does not pay one per write), counts the
  // writes that fit in flight (PendingWrite::quota) and fails the others.
  void FitSsdQuota(std::vector<PendingWrite>& writes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Writes chunks to reserved SSD slots, publishes them, commits their index entries and
  // syncs the slabs. Called with the lock held; releases it during I/O and commits. Fills
  // each status; OK means durable.
  void WriteToSsd(std::vector<PendingWrite>& writes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The same for writes of one class.
  void WriteClassToSsd(SsdClass& cls, std::vector<PendingWrite*>& writes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Writes dirty RAM chunks to SSD (write-behind and demotion). Called with the lock.
  void FlushLocked(const std::vector<ChunkKey>& keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu);

  StoreOptions opt;
  StoreSeams seams;
  // The folder's first class (slabs/): its slot size, which is also what the RAM and HBM
  // tiers size a typical chunk by.
  uint64_t slot_bytes = 0;
  uint64_t slab_bytes = 0;     // a new class's slab size (whole slots)
  uint64_t ssd_budget = 0;     // device bytes all classes may take; 0: no SSD tier
  uint16_t legacy_format = 0;  // the first class's slot format (older folders: 1 or 2)
  std::unique_ptr<ChunkIndex> index;
  std::unique_ptr<RamTier> ram ABSL_PT_GUARDED_BY(mu);  // null without a RAM tier
  // The RAM arenas themselves never change after open: their count, fds, sizes and slot
  // addresses may be read without mu (a slot's bytes belong to whoever reserved or leased
  // it). Everything else of the RAM tier goes through `ram`, under mu.
  const RamTier* ram_arenas() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return ram.get(); }
  std::unique_ptr<HbmTier> hbm;  // null without T0; thread-safe, locked inside mu

  mutable Mutex mu;
  std::condition_variable_any work;        // the writer has something to do
  std::condition_variable_any flush_done;  // a flush finished
  std::unordered_map<NamespaceId, uint64_t> namespaces ABSL_GUARDED_BY(mu);
  std::unordered_map<ChunkKey, int64_t, ChunkKeyHash> pins ABSL_GUARDED_BY(mu);
  int64_t access_clock ABSL_GUARDED_BY(mu) = 0;

  std::unordered_map<ChunkKey, IndexRecord, ChunkKeyHash> ssd_map ABSL_GUARDED_BY(mu);
  // The SSD tier's size classes (none without one). Each class's catalog says where every
  // slot of it is (ssd_catalog.h); they are called under mu so that they and ssd_map
  // change together. Classes are added under mu and never removed: a pointer taken under
  // mu stays valid, and its tier may be used without mu.
  std::vector<std::unique_ptr<SsdClass>> classes ABSL_GUARDED_BY(mu);
  // The write sequence, shared by every class's catalog.
  std::shared_ptr<std::atomic<uint64_t>> sequence = std::make_shared<std::atomic<uint64_t>>(1);
  uint64_t NextSequence() const { return sequence->load(); }
  std::unordered_set<ChunkKey, ChunkKeyHash> access_dirty
      ABSL_GUARDED_BY(mu);  // last access to persist
  EvictionOrder ssd_order ABSL_GUARDED_BY(mu);
  bool index_damaged = false;  // found at open: rebuilt from every slot

  // The index's records are loading (Loaded, LoadInBackground): calls on chunks wait on
  // loaded_cv, and Lookup / Get answer through `loading_view`.
  bool loading ABSL_GUARDED_BY(mu) = true;
  absl::Status load_error ABSL_GUARDED_BY(mu);  // the background load's, if it failed
  mutable std::condition_variable_any loaded_cv;
  std::shared_ptr<LoadingView> loading_view ABSL_GUARDED_BY(mu);
  // The shared tier's link (null without one): set at open, before any call; called
  // outside mu (chunk_store_shared.cc).
  std::unique_ptr<SharedTierLink> shared;
  std::thread loader;
  std::chrono::steady_clock::time_point opened_at = std::chrono::steady_clock::now();
  // The metadata a new or salvaged index is given at open (geometry, namespaces).
  std::vector<std::pair<std::string, std::string>> folder_meta ABSL_GUARDED_BY(mu);

  // Signalled (with mu) when the catalog's record commit ends or its last write in
  // flight does: a new reservation waits for both (the writes' index entries become
  // durable with its synced commit; one record commit at a time, so the last one written
  // is the newest).
  std::condition_variable_any reservation_cv;

  std::unique_ptr<GroupCommit> commits;  // with the SSD tier; never called with mu held

  std::deque<ChunkKey> dirty_queue ABSL_GUARDED_BY(mu);
  int flushes_in_progress ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread writer;
  // The RAM scrub (ChunkStore::ScrubRam): where the walk over every pool's slots stands,
  // and the thread that runs it at ram_scrub_bytes_per_s (woken early to stop).
  RamPoolId scrub_pool ABSL_GUARDED_BY(mu) = 0;
  uint32_t scrub_slot ABSL_GUARDED_BY(mu) = 0;
  uint64_t scrub_slots_walked ABSL_GUARDED_BY(mu) = 0;  // of the current pass
  std::thread scrubber;
  uint64_t ScrubRam(uint64_t max_bytes) ABSL_LOCKS_EXCLUDED(mu);
  void ScrubLoop() ABSL_LOCKS_EXCLUDED(mu);
  StoreStats stats ABSL_GUARDED_BY(mu);
};

// Every chunk record of the index, appended to *out (open and the background load).
absl::Status LoadRecords(ChunkIndex& index, std::vector<std::pair<ChunkKey, IndexRecord>>* out);
absl::StatusOr<std::vector<std::pair<ChunkKey, IndexRecord>>> LoadRecords(ChunkIndex& index);

// The namespaces' chunk sizes as the index's metadata stores them ("id:bytes,...").
std::string EncodeNamespaces(const std::unordered_map<NamespaceId, uint64_t>& ns);

}  // namespace kvc::storage
