// HbmTier: T0, chunks mirrored in device memory (HBM) for co-located engines, which map
// the whole arena once (CUDA IPC) and then copy a chunk device-to-device, or read it in
// place, while they hold a lease on it.
//
// T0 is a cache over the store's lower tiers: it only holds copies — of chunks whose bytes
// were verified when read from them (the service promotes a chunk after a verified read),
// or, written through, of the bytes as they were stored — so losing it (eviction,
// restart) loses nothing. Every chunk
// takes one fixed slot; when all slots are taken, the least recently used chunk without a
// lease goes. A deleted chunk leaves the index at once; its slot is reused only after the
// last lease on it ends. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "base/chunk_key.h"
#include "base/mutex.h"
#include "storage/device_arena.h"

namespace kvc::storage {

// The HBM slot a chunk of payload_bytes takes: rounded up to 512 B (CUDA IPC and
// copy-friendly slot starts).
inline uint64_t HbmSlotBytes(uint64_t payload_bytes) { return (payload_bytes + 511) / 512 * 512; }

class HbmTier;

// A chunk's place in the device arena; the slot keeps these bytes while the lease lives.
class HbmLease {
 public:
  HbmLease() = default;
  HbmLease(HbmLease&& o) noexcept { *this = std::move(o); }
  HbmLease& operator=(HbmLease&& o) noexcept;
  ~HbmLease();
  uint64_t offset() const { return offset_; }
  uint64_t length() const { return length_; }
  // PayloadChecksum (slot_format.h) of the bytes put in: a reader of the device copy (a
  // process that mapped the arena, which any such process can also write) checks it.
  uint64_t checksum() const { return checksum_; }

 private:
  friend class HbmTier;
  HbmTier* tier_ = nullptr;
  uint32_t slot_ = 0;
  uint64_t offset_ = 0, length_ = 0, checksum_ = 0;
};

struct HbmStats {
  uint64_t slots = 0, used = 0, leased = 0;
  uint64_t hits = 0, misses = 0, puts = 0, evictions = 0;
};

class HbmTier {
 public:
  // Slots of slot_bytes (rounded up to 512 B) fill the arena. InvalidArgument when not even
  // one fits.
  // The arena is shared: the store's options hold it too (chunk_store.h).
  static absl::StatusOr<std::unique_ptr<HbmTier>> Create(std::shared_ptr<DeviceArena> arena,
                                                         uint64_t slot_bytes);
  ~HbmTier();

  // Copies the chunk in unless T0 holds it already (then it only counts as recently used).
  // InvalidArgument when larger than a slot; ResourceExhausted when every slot is leased.
  [[nodiscard]] absl::Status Put(NamespaceId ns, const ChunkKey& key,
                                 std::span<const uint8_t> bytes);
  // Put, then a lease on the chunk (no window in which it could be evicted between them;
  // counts neither a hit nor a miss).
  absl::StatusOr<HbmLease> PutAndLease(NamespaceId ns, const ChunkKey& key,
                                       std::span<const uint8_t> bytes);
  // A lease on the chunk if T0 holds it (NotFound otherwise); counts a hit or a miss.
  absl::StatusOr<HbmLease> Lease(NamespaceId ns, const ChunkKey& key);
  bool Contains(NamespaceId ns, const ChunkKey& key) const;
  // Contains for each key, under one lock (a Lookup asks for thousands at once).
  std::vector<bool> ContainsEach(NamespaceId ns, std::span<const ChunkKey> keys) const;
  // How many chunks of these namespaces T0 holds (a walk over its index).
  uint64_t CountIn(const std::set<NamespaceId>& namespaces) const;
  // Drops the chunk (no-op when absent).
  void Erase(NamespaceId ns, const ChunkKey& key);

  const DeviceArena& arena() const { return *arena_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  HbmStats stats() const;

 private:
  friend class HbmLease;
  struct Id {
    NamespaceId ns;
    ChunkKey key;
    friend bool operator==(const Id&, const Id&) = default;
  };
  struct IdHash {
    size_t operator()(const Id& id) const { return ChunkKeyHash()(id.key) ^ id.ns; }
  };
  struct Slot {
    Id id{};
    uint64_t length = 0, checksum = 0;
    uint32_t leases = 0;
    bool indexed = false;               // in `index_` (false once erased)
    std::list<uint32_t>::iterator lru;  // valid while indexed and unleased
  };
  HbmTier(std::shared_ptr<DeviceArena> arena, uint64_t slot_bytes, uint32_t slots);
  void Unlease(uint32_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // Put; with `lease` (an empty one: assigning to it must not unlease under mu_), also
  // leases the chunk's slot into it.
  absl::Status PutImpl(NamespaceId ns, const ChunkKey& key, std::span<const uint8_t> bytes,
                       HbmLease* lease);
  HbmLease LeaseSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A slot to write into: a free one, or the LRU unleased chunk's.
  absl::StatusOr<uint32_t> TakeSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<DeviceArena> arena_;
  const uint64_t slot_bytes_;
  mutable Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  // Indexed, unleased slots; front = least recently used.
  std::list<uint32_t> lru_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<Id, uint32_t, IdHash> index_ ABSL_GUARDED_BY(mu_);
  HbmStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::storage
