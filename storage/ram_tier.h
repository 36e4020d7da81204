// RamTier: the host-RAM tier's bookkeeping — which chunk sits in which slot of which pool,
// which slots are free, which are leased, and which chunk each pool gives up next.
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
// Not thread-safe: the store calls it under its own mutex. Slot reference counts and free
// lists are checked: a release without a reference, or a slot freed twice, aborts.
#pragma once

#include <cstdint>
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

// The RAM slot a chunk of payload_bytes takes: the payload rounded up to 4 KiB (pages).
inline uint64_t RamSlotBytes(uint64_t payload_bytes) {
  return (payload_bytes + 4095) / 4096 * 4096;
}

struct RamEntry {
  NamespaceId ns = 0;
  RamPoolId pool = 0;
  uint32_t slot = 0;
  uint32_t len = 0;
  uint64_t checksum = 0;  // PayloadChecksum of the payload
  std::optional<ChunkKey> parent;
  std::optional<ChunkOrigin> origin;
  int64_t expires_s = 0;
  bool dirty = false;     // accepted with memory durability, not yet on SSD
  bool flushing = false;  // being written to SSD right now
};

class RamTier {
 public:
  // One pool per entry of pool_bytes (a pool smaller than one slot has no slots). Each
  // slot holds up to slot_bytes (rounded up to 4 KiB). prefault: see RamArena::Create.
  static absl::StatusOr<std::unique_ptr<RamTier>> Create(uint64_t slot_bytes,
                                                         std::span<const uint64_t> pool_bytes,
                                                         bool prefault = false);

  bool empty_capacity() const { return capacity_slots_ == 0; }
  uint64_t capacity_slots() const { return capacity_slots_; }
  // Bytes of every slot of every pool.
  uint64_t capacity_bytes() const;
  // The bytes one chunk of the pool takes (its slot; 0 for a pool without slots).
  uint64_t SlotBytesOf(RamPoolId pool) const {
    return pools_.at(pool).arena ? pools_[pool].arena->slot_bytes() : 0;
  }
  size_t pool_count() const { return pools_.size(); }
  // Null for a pool without slots.
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
  // The chunk published in `slot` of `pool`, or null (free, reserved, or being freed): a
  // walk over the slots (the scrub) finds each chunk by where it lies.
  const ChunkKey* KeyAt(RamPoolId pool, uint32_t slot) const;
  uint32_t SlotCount(RamPoolId pool) const;
  // The entry if it is in RAM in namespace ns.
  RamEntry* FindIn(NamespaceId ns, const ChunkKey& key);
  bool Contains(const ChunkKey& key) const { return entries_.contains(key); }

  // A free slot of `pool`, reserved for the caller (nullopt when the pool is full).
  std::optional<uint32_t> TakeFreeSlot(RamPoolId pool);
  // A reserved slot the caller did not publish after all.
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
  // Bytes of the slots the namespace's chunks take, in all pools.
  uint64_t BytesOf(NamespaceId ns) const;

  // Publishes a chunk in a slot reserved by TakeFreeSlot.
  void Publish(const ChunkKey& key, const RamEntry& entry, int64_t access_us);
  // Removes the chunk; its slot becomes free once no lease holds it.
  void Remove(const ChunkKey& key);
  void Touch(const ChunkKey& key, int64_t access_us);
  // `parent` left the store: its children here go first (eviction.h).
  void MarkOrphansOf(const ChunkKey& parent);

  // Leases: a slot with a reference is never reused.
  void Ref(RamPoolId pool, uint32_t slot);
  void Unref(RamPoolId pool, uint32_t slot);

  // At a quiet moment (nothing reserved for a write in flight): every slot of every pool
  // is free (on its free list exactly once), in use by exactly one chunk of the pool (in
  // its eviction order), or removed and waiting for its leases; OK or the first mismatch.
  [[nodiscard]] absl::Status CheckConsistency() const;

  uint8_t* SlotData(RamPoolId pool, uint32_t slot) const { return pools_[pool].arena->slot(slot); }
  uint64_t SlotOffset(RamPoolId pool, uint32_t slot) const {
    return pools_[pool].arena->slot_offset(slot);
  }

 private:
  struct Pool {
    std::unique_ptr<RamArena> arena;
    std::vector<uint32_t> free;  // lowest slot on top
    std::vector<int> refs;
    std::vector<uint8_t> state;  // SlotState per slot
    std::vector<ChunkKey> keys;  // the chunk a kUsed slot holds
    EvictionOrder order;
  };
  enum SlotState : uint8_t { kFree, kReserved, kUsed, kFreeOnRelease };
  void Free(Pool& p, uint32_t slot);

  std::vector<Pool> pools_;
  uint64_t capacity_slots_ = 0;
  std::unordered_map<ChunkKey, RamEntry, ChunkKeyHash> entries_;
  std::unordered_map<NamespaceId, RamPoolId> pool_of_;
};

}  // namespace kvc::storage
