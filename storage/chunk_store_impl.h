// ChunkStore's internals (not a public header): the state behind one mutex and the tier
// operations that the public calls (chunk_store.cc), opening and closing
// (chunk_store_open.cc) and the tiers' moves between RAM and SSD (chunk_store_tiers.cc)
// share. Every method here is called with `mu` held unless it says otherwise.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "storage/chunk_index.h"
#include "storage/chunk_store.h"
#include "storage/eviction.h"
#include "storage/group_commit.h"
#include "storage/ram_tier.h"
#include "storage/slot_format.h"
#include "storage/ssd_tier.h"

namespace kvc::storage {

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

  // Data synced and index entries committed at once, for all concurrent writers (group_commit.h).
  absl::Status CommitDurably(const std::set<uint64_t>& slabs,
                             const std::vector<std::pair<ChunkKey, IndexRecord>>& puts,
                             bool sync_index) {
    return commits->Commit(slabs, puts, sync_index);
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
  void DropRam(const ChunkKey& key);

  // A RAM copy whose bytes no longer match their checksum (memory corruption): a miss,
  // counted, and the copy is dropped. Never handed out.
  void DropCorruptRam(const ChunkKey& key);

  bool RamCopyVerifies(std::span<const uint8_t> bytes, uint64_t checksum) const {
    return PayloadChecksum(bytes) == checksum;
  }

  // `key` is in neither tier any more: the chunks after it can no longer be reached by
  // a lookup, so they are the first to go.
  void LeftStore(const ChunkKey& key);

  // A free slot of the RAM pool, evicting from that pool as needed. With allow_writeback,
  // dirty victims are written to SSD first (demotion); without, the call gives up instead
  // of waiting on I/O.
  absl::StatusOr<uint32_t> AllocRamSlot(std::unique_lock<std::mutex>& lk, RamPoolId pool,
                                        bool allow_writeback);

  // Copies bytes into a fresh slot of the namespace's RAM pool and publishes it. The copy
  // runs without the lock: the reserved slot is in neither the free list nor the map, so
  // nobody else sees it. `checksum` is the payload's, if the caller knows it (0: computed
  // here from the copy).
  absl::Status InsertRam(std::unique_lock<std::mutex>& lk, NamespaceId ns, const ChunkKey& key,
                         const std::optional<ChunkKey>& parent, std::span<const uint8_t> bytes,
                         uint64_t checksum, bool dirty, int64_t expires_s, bool allow_writeback);

  // ---- SSD tier (all under mu) ----
  void FreeSsdSlot(uint64_t slot);

  void RemoveSsd(const ChunkKey& key);

  uint64_t GlobalSlot(const IndexRecord& r) const {
    return uint64_t{r.slab} * slots_per_slab + r.slot;
  }

  // A free SSD slot. Victims are removed from memory at once and their keys appended to
  // `evicted`; the caller commits those deletions (synced) before writing the slot, so a
  // crash can never leave an index entry pointing at another chunk's bytes.
  absl::StatusOr<uint64_t> AllocSsdSlot(std::vector<ChunkKey>* evicted);

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
                  bool sync_index);

  // Writes dirty RAM chunks to SSD (write-behind and demotion). Called with the lock.
  void FlushLocked(std::unique_lock<std::mutex>& lk, const std::vector<ChunkKey>& keys,
                   bool sync_index);

  void WriterLoop();

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

  std::unique_ptr<GroupCommit> commits;  // with the SSD tier; never called with mu held

  std::deque<ChunkKey> dirty_queue;
  int flushes_in_progress = 0;
  bool stopping = false;
  std::thread writer;
  StoreStats stats;
};

// The namespaces' chunk sizes as the index's metadata stores them ("id:bytes,...").
std::string EncodeNamespaces(const std::unordered_map<NamespaceId, uint64_t>& ns);

}  // namespace kvc::storage
