// SsdCatalog: the SSD tier's slot bookkeeping — where every slot is (free, listed free in
// the durable reservation, named as the next reservation's first, being reserved, being
// written, holding a chunk, waiting for its readers, held back by a failed removal), how
// many writes are in flight, who reads which slot, and the write sequence numbers.
//
// The rules it keeps (docs/storage.md, "Crash consistency"; slot_reservation.h):
// - a write only ever goes to a slot of the durable reservation (TakeForWrite), and a new
//   reservation is planned only while no write is in flight and no other record commit
//   runs (the store waits for both; record_busy, in_flight);
// - a freed slot that is still listed goes back among the reservation's free slots, every
//   other one to the free list (lowest slot on top: slabs fill in order);
// - a slot with readers is not freed until the last one ends;
// - the slot named as the next reservation's first is in no free list until a
//   reservation takes it.
// Every move between places is checked (KVC_CHECK: a slot freed twice, written outside
// the reservation or read while free aborts), and CheckInvariants() compares the whole
// catalog with the slots the store's map says hold chunks.
//
// Which chunk a slot holds, and the eviction order, are the store's (ChunkStore::Impl):
// the catalog knows slots only. It is thread-safe; the store calls it under its own mutex
// (so a sequence of calls is atomic there) and does its waiting on that mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "base/mutex.h"
#include "storage/slot_reservation.h"

namespace kvc::storage {

class SsdCatalog {
 public:
  enum class Place : uint8_t {
    kFree,           // on the free list
    kReservedFree,   // listed in the durable reservation, not written since
    kNamedNext,      // named as the next reservation's first write (in no free list)
    kReserving,      // taken by a reservation being committed
    kWriting,        // taken for a write, not yet published
    kUsed,           // holds a published chunk (or one being removed)
    kFreeOnRelease,  // its chunk is gone; free once its readers are done
    kHeldBack,       // its removal could not be committed: unused until the next open
  };
  static const char* PlaceName(Place p);

  // A catalog of `capacity_slots` slots of `slot_bytes` (0: unknown, for tests), every one
  // free until Load; sequences from 1. Slots are taken lowest first; a slot never taken
  // costs nothing (the catalog of a class that may grow to the whole device budget holds
  // what was used).
  // `sequence`: the counter of write sequences, shared with the store's other classes
  // (null: its own).
  explicit SsdCatalog(uint64_t capacity_slots, uint64_t slot_bytes = 0,
                      std::shared_ptr<std::atomic<uint64_t>> sequence = nullptr);

  uint64_t capacity() const { return capacity_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Slots that are not free: holding chunks, being written, reserved, held back, waiting
  // for readers. What the class takes of the device budget is Taken() × slot_bytes().
  uint64_t Taken() const ABSL_LOCKS_EXCLUDED(mu_);
  // Slots holding a chunk (published, or being removed).
  uint64_t Used() const ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the free slots above the highest slot in any other place (they become never
  // taken, as before their first use) and returns how many slots are left, for the tier to
  // give the slabs past them back to the disk; nullopt if there were none to forget. The
  // caller gives them back before any other call can take one again.
  std::optional<uint64_t> TrimFree() ABSL_LOCKS_EXCLUDED(mu_);
  // A class left empty (no chunk, nothing reserved or being written) whose named slot sits
  // above a lower free one: the record naming the lowest instead (record_busy until
  // FinishRename), so the slabs above it can be given back; else nullopt.
  std::optional<SlotReservation> PlanRenameIfEmpty() ABSL_LOCKS_EXCLUDED(mu_);
  void FinishRename(bool committed) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- at open ----
  // Sequences resume above every one seen (index records, slots, the reservation record).
  void RaiseSequence(uint64_t at_least) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets every slot's place: `used[s]` holds a chunk (`used` may be shorter than the
  // capacity: past it nothing is); `named_next` is named as the next reservation's first
  // (it must not be used); the rest is free.
  void Load(const std::vector<bool>& used, std::optional<uint64_t> named_next)
      ABSL_LOCKS_EXCLUDED(mu_);

  // ---- sequences ----
  uint64_t TakeSequence() ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t next_sequence() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- writes ----
  // Free slots of the reservation (what writes may take without a new record).
  size_t reserved_free() const ABSL_LOCKS_EXCLUDED(mu_);
  // A slot of the reservation for one write (counted in flight), or nullopt if none is left.
  std::optional<uint64_t> TakeForWrite() ABSL_LOCKS_EXCLUDED(mu_);
  // A slot taken for a write now holds the chunk (readers may find it).
  void Published(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // `n` writes are done (published, or their slots freed); true if none is in flight now.
  bool EndWrites(size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  size_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- reads ----
  void BeginRead(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  void EndRead(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- frees ----
  // A slot nobody uses any more (it held a chunk, or was taken for a write): free now, or
  // once its readers are done.
  void Free(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_);
  // The removal of a slot's chunk could not be committed: its index entry may still be on
  // disk, so the slot stays unused until the next open.
  void HoldBack(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- the reservation ----
  // A record commit (a new reservation, or a removal of listed slots) is under way; the
  // store waits for it to end before planning another, and takes no slot meanwhile.
  bool record_busy() const ABSL_LOCKS_EXCLUDED(mu_);
  // Free slots a new reservation could take: the free list and the named slot.
  size_t Obtainable() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many slots a reservation takes beyond what is asked for: 1/8 of the tier, at most
  // 1,024 (one synced commit per 1,024 slots written once the tier is large) and at most
  // 128 MiB of slots.
  size_t ReserveAhead() const;
  // How many slots eviction frees beyond what a reservation needs when the tier is full:
  // 1/64 of the tier, at most 32 and at most 32 MiB of slots (none in a tier under 64).
  size_t EvictAhead() const;
  // A new reservation begins (no record busy): record_busy from now, so no other commit
  // or reservation starts, while the store waits for the writes in flight to end.
  void BeginReservation() ABSL_LOCKS_EXCLUDED(mu_);
  // Plans it, for `missing` more slots (no write in flight): the record to commit (synced)
  // — the reservation's free slots, then up to max(missing, ReserveAhead()) slots from the
  // named one and the free list, and a free slot named as the next one's first (one is
  // kept back for that unless every one is needed).
  // At most `limit` slots are taken (the device budget's room; the named one regardless).
  SlotReservation PlanReservation(size_t missing, size_t limit = SIZE_MAX) ABSL_LOCKS_EXCLUDED(mu_);
  // The planned record was committed (the slots are the reservation's now) or not (they
  // go back where they were).
  void FinishReservation(bool committed) ABSL_LOCKS_EXCLUDED(mu_);
  // Chunks in these slots are being removed (no record busy): if any slot is listed in the
  // reservation, it leaves the listing and the record to commit with the removal is
  // returned (record_busy until FinishRemoval); else nullopt.
  std::optional<SlotReservation> PlanRemoval(std::span<const uint64_t> slots)
      ABSL_LOCKS_EXCLUDED(mu_);
  void FinishRemoval() ABSL_LOCKS_EXCLUDED(mu_);
  // The reservation's free slots leave it (no record busy), for another size class that
  // needs the device budget they hold: the record to commit without them (record_busy until
  // FinishRelease), or nullopt if it has none. Writes in flight keep their listed slots.
  std::optional<SlotReservation> PlanRelease() ABSL_LOCKS_EXCLUDED(mu_);
  // Committed: the slots are free; not: they are the reservation's again.
  void FinishRelease(bool committed) ABSL_LOCKS_EXCLUDED(mu_);
  // Slots being released (their bytes are the budget's once the release commits).
  size_t releasing() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- checks ----
  // At a quiet moment (no write, reservation or read running): every slot in exactly one
  // place, the lists agreeing with the places, and the used slots exactly `chunk_slots`
  // (the store's map; a slot there twice is an error). OK or the first mismatch.
  [[nodiscard]] absl::Status CheckInvariants(std::span<const uint64_t> chunk_slots) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // What is running now, for a "not quiet" answer (empty when quiet).
  std::string Busy() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Moves a slot between places, checking where it was.
  void Move(uint64_t slot, std::initializer_list<Place> from, Place to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnFree(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The free slot to take next: the top of the free list, else the lowest never taken
  // (which then gets a place). nullopt when none is left.
  std::optional<uint64_t> TakeFree() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushFree(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record of what the reservation lists now (its min sequence, the sequence bound now),
  // naming `named` next: what a removal, release or rename commits.
  SlotReservation ListedNow(std::optional<uint64_t> named) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t capacity_;
  const uint64_t slot_bytes_;
  mutable Mutex mu_;
  // The places of the slots taken so far (every slot past them is free and in no list).
  std::vector<Place> place_ ABSL_GUARDED_BY(mu_);
  // The free slots among them, a min-heap: the lowest is taken first, so a class's chunks
  // stay in its first slabs and the slabs past them empty as it shrinks.
  std::vector<uint64_t> free_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, int> readers_ ABSL_GUARDED_BY(mu_);
  uint64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // slots in kUsed
  // The next write sequence: shared by the catalogs of one store's size classes, so that
  // sequences order writes across them (the eviction order resumes by them at open).
  const std::shared_ptr<std::atomic<uint64_t>> sequence_;

  // The reservation: `reserved_` is what the durable record lists (less slots whose chunks
  // were removed since), `reserved_free_` the unused ones among them (taken from the back).
  std::unordered_set<uint64_t> reserved_ ABSL_GUARDED_BY(mu_);
  uint64_t min_sequence_ ABSL_GUARDED_BY(mu_) = 0;  // the record's: its writes' lowest
  std::vector<uint64_t> reserved_free_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> named_next_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool record_busy_ ABSL_GUARDED_BY(mu_) = false;
  // A reservation being committed: the slots it takes (the named one last, if it takes
  // it), and the one it names next.
  struct Plan {
    std::vector<uint64_t> fresh;
    bool took_named = false;
    std::optional<uint64_t> following;
    SlotReservation record;
  };
  std::optional<Plan> plan_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> releasing_ ABSL_GUARDED_BY(mu_);   // PlanRelease's, until FinishRelease
  std::optional<uint64_t> renaming_ ABSL_GUARDED_BY(mu_);  // PlanRenameIfEmpty's new named slot
};

}  // namespace kvc::storage
