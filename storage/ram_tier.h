// RamTier: the host-RAM tier's bookkeeping — which chunk sits where in which pool, which
// memory is free, which is leased, and which chunk each pool gives up next.
//
// A pool's memory is 4 KiB pages. A chunk takes a run of whole pages — its payload rounded
// up to 4 KiB, which is also what it is charged (quotas, Stats) — taken best-fit from the
// pool's free runs (the shortest that holds it, the lowest of those); a freed run merges
// with free neighbours. So chunks of any size up to the largest a namespace may have share
// one pool, and a 20 KB chunk takes 20 KB, not the largest chunk's slot. A chunk's "slot"
// is the first page of its run (SlotData, SlotOffset: page × 4 KiB).
//
// The tier is split into pools, each its own sealed shared-memory arena (ram_arena.h) with
// its own slots and eviction order. Pool 0 is the default; a namespace assigned to another
// pool (SetPool) keeps all its RAM chunks there. The service gives every tenant allowed to
// map shared memory a pool of its own, so a mapping shows that tenant's chunks and no one
// else's, and one tenant's traffic never evicts another's pool.
//
// Each chunk carries the XXH3-64 of its payload (the SSD slot's checksum), so a reader or
// the scrub can verify it.
//
// Not thread-safe: the store calls it under its own mutex. Run reference counts and free
// runs are checked: a release without a reference, or a run freed twice, aborts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "storage/eviction.h"
#include "storage/ram_arena.h"

namespace kvc::storage {

using RamPoolId = uint32_t;

inline constexpr uint64_t kRamPageBytes = 4096;
// The RAM a chunk of payload_bytes takes, and is charged: the payload rounded up to whole
// 4 KiB pages (at least one).
inline uint64_t RamSlotBytes(uint64_t payload_bytes) {
  return std::max<uint64_t>(1, (payload_bytes + kRamPageBytes - 1) / kRamPageBytes) * kRamPageBytes;
}

struct RamEntry {
  NamespaceId ns = 0;
  RamPoolId pool = 0;
  uint32_t slot = 0;      // the first page of its run
  uint32_t len = 0;       // payload bytes
  uint64_t checksum = 0;  // PayloadChecksum of the payload
  std::optional<ChunkKey> parent;
  std::optional<ChunkOrigin> origin;
  int64_t expires_s = 0;
  bool dirty = false;     // accepted with memory durability, not yet on SSD
  bool flushing = false;  // being written to SSD right now
};

class RamTier {
 public:
  // One pool per entry of pool_bytes, of whole pages; a pool that cannot hold one chunk of
  // max_chunk_bytes has no memory at all. prefault: see RamArena::Create.
  static absl::StatusOr<std::unique_ptr<RamTier>> Create(uint64_t max_chunk_bytes,
                                                         std::span<const uint64_t> pool_bytes,
                                                         bool prefault = false);

  bool empty_capacity() const { return capacity_slots_ == 0; }
  // How many chunks of the largest size the pools hold together (more of smaller ones).
  uint64_t capacity_slots() const { return capacity_slots_; }
  // Bytes of every page of every pool.
  uint64_t capacity_bytes() const;
  // What the largest chunk takes in the pool (0 for a pool without memory).
  uint64_t LargestChunkBytesOf(RamPoolId pool) const {
    return pools_.at(pool).arena ? max_chunk_bytes_ : 0;
  }
  size_t pool_count() const { return pools_.size(); }
  // Null for a pool without memory.
  const RamArena* arena(RamPoolId pool) const { return pools_.at(pool).arena.get(); }
  size_t size() const { return entries_.size(); }
  // Chunks of the given namespaces (a walk over every chunk: for occasional questions).
  uint64_t CountIn(const std::set<NamespaceId>& namespaces) const;
  // Calls fn for every chunk, in no particular order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (const auto& [key, e] : entries_) fn(key, e);
  }

  // Namespaces not assigned stay in pool 0. InvalidArgument for a pool that does not exist.
  [[nodiscard]] absl::Status SetPool(NamespaceId ns, RamPoolId pool);
  RamPoolId PoolOf(NamespaceId ns) const;

  RamEntry* Find(const ChunkKey& key);
  const RamEntry* Find(const ChunkKey& key) const;
  // The chunk published in a run starting at page `slot` of `pool`, or null (free,
  // reserved, being freed, or inside a run): a walk over the pages (the scrub) finds each
  // chunk by where it lies.
  const ChunkKey* KeyAt(RamPoolId pool, uint32_t slot) const;
  // The pool's pages.
  uint32_t SlotCount(RamPoolId pool) const;
  // The entry if it is in RAM in namespace ns.
  RamEntry* FindIn(NamespaceId ns, const ChunkKey& key);
  bool Contains(const ChunkKey& key) const { return entries_.contains(key); }

  // A free run of `pool` for a chunk of `payload_bytes`, reserved for the caller: its first
  // page (nullopt when no free run is long enough).
  std::optional<uint32_t> TakeFreeSlot(RamPoolId pool, uint64_t payload_bytes);
  // A reserved run the caller did not publish after all.
  void ReturnSlot(RamPoolId pool, uint32_t slot);
  // The pool's next chunk to give up (eviction.h), or nullopt if all are pinned.
  std::optional<ChunkKey> PickVictim(RamPoolId pool, int64_t now_s) const;
  // The same among these namespaces' chunks only (an owner over its quota, quota.h).
  std::optional<ChunkKey> PickVictimAmong(RamPoolId pool, int64_t now_s,
                                          std::span<const NamespaceId> namespaces) const;
  // The same among the namespaces `may_give_up` accepts.
  std::optional<ChunkKey> PickVictimIf(RamPoolId pool, int64_t now_s,
                                       const std::function<bool(NamespaceId)>& may_give_up) const {
    return pools_.at(pool).order.PickVictimIf(now_s, may_give_up);
  }
  // Bytes the namespace's chunks take, in all pools.
  uint64_t BytesOf(NamespaceId ns) const;

  // Publishes a chunk in the run TakeFreeSlot reserved for it (entry.len ≤ its size).
  void Publish(const ChunkKey& key, const RamEntry& entry, int64_t access_us);
  // Removes the chunk; its slot becomes free once no lease holds it.
  void Remove(const ChunkKey& key);
  void Touch(const ChunkKey& key, int64_t access_us);
  // `parent` left the store: its children here go first (eviction.h).
  void MarkOrphansOf(const ChunkKey& parent);

  // Leases: a run with a reference is never reused.
  void Ref(RamPoolId pool, uint32_t slot);
  void Unref(RamPoolId pool, uint32_t slot);

  // At a quiet moment (nothing reserved for a write in flight): every page of every pool
  // is in exactly one run — free (merged with no free neighbour, in both free indexes),
  // in use by exactly one chunk of the pool (in its eviction order), or removed and
  // waiting for its leases; OK or the first mismatch.
  [[nodiscard]] absl::Status CheckConsistency() const;

  uint8_t* SlotData(RamPoolId pool, uint32_t slot) const { return pools_[pool].arena->slot(slot); }
  // Free bytes of the pool (in runs of any length).
  uint64_t FreeBytes(RamPoolId pool) const;
  uint64_t SlotOffset(RamPoolId pool, uint32_t slot) const {
    return pools_[pool].arena->slot_offset(slot);
  }

 private:
  enum RunState : uint8_t { kReserved, kUsed, kFreeOnRelease };
  struct Run {
    uint32_t pages = 0;
    RunState state = kReserved;
    int refs = 0;
    ChunkKey key;  // the chunk a kUsed run holds
  };
  struct Pool {
    std::unique_ptr<RamArena> arena;
    uint32_t pages = 0;
    std::map<uint32_t, uint32_t> free_runs;                // first page → pages
    std::set<std::pair<uint32_t, uint32_t>> free_by_size;  // (pages, first page): best fit
    std::unordered_map<uint32_t, Run> runs;                // taken runs by first page
    EvictionOrder order;
  };
  // Gives a taken run back to the free runs, merged with free neighbours.
  void Free(Pool& p, uint32_t first);
  void AddFreeRun(Pool& p, uint32_t first, uint32_t pages);
  void EraseFreeRun(Pool& p, std::map<uint32_t, uint32_t>::iterator it);
  Run& RunAt(RamPoolId pool, uint32_t first, const char* what);

  std::vector<Pool> pools_;
  uint64_t max_chunk_bytes_ = 0;  // rounded up to pages
  uint64_t capacity_slots_ = 0;
  std::unordered_map<ChunkKey, RamEntry, ChunkKeyHash> entries_;
  std::unordered_map<NamespaceId, RamPoolId> pool_of_;
};

}  // namespace kvc::storage
