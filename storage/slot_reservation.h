// The slot reservation: which SSD slots writes may go to before the index next syncs.
//
// A durable put is acknowledged once its slot is written and the slab synced; its index
// entry is committed without a sync and reaches the disk later (with the next synced
// commit). A crash can lose such entries, so before any slot is written the store durably
// records the set of slots it may write (in the index, synced, with the evictions that
// freed them) and the lowest sequence number those writes will carry. At open the store
// reads back every reserved slot and indexes the ones that verify and were written after
// the reservation (sequence ≥ min_sequence) — a scan of at most one reservation, not the
// whole tier. Older bytes in a reserved slot carry smaller sequences and are never
// indexed; torn or half-synced slots fail their checksums.
//
// Each record also names the slot the next reservation's writes begin with, held out of
// every free list until then. The index's WAL may come back shorter than what was synced
// (RocksDB reads a damaged record length in the WAL's last block as a torn tail and stops
// there, silently); the reservations after the cut are then gone, and with them every
// chunk written into their slots. Those writes start on the named slot, so one read of it
// at open tells: a chunk there written after the record proves a later synced record was
// lost (its sequence is at least the record's sequence_bound), and the index is rebuilt
// from every slot.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::storage {

struct SlotReservation {
  uint64_t min_sequence = 0;
  std::vector<uint64_t> slots;
  // Every slot written before this record was committed carries a smaller sequence. The
  // open starts numbering there: a slot that left the list (its chunk erased) keeps bytes
  // whose sequence nothing else remembers, and a later reservation must not find them
  // "newer" than itself. 0 in records of earlier versions (min_sequence is then the best
  // bound known).
  uint64_t sequence_bound = 0;
  // The first slot the next reservation's writes go to (none: the tier had no free slot
  // to name, or the record was written by an earlier version).
  std::optional<uint64_t> next_first_slot;
};

// The index metadata name the reservation is kept under.
inline constexpr char kReservationMeta[] = "slot_reservation";

std::string EncodeSlotReservation(const SlotReservation& r);
// DataLoss if the bytes are not a reservation this version wrote.
absl::StatusOr<SlotReservation> DecodeSlotReservation(std::string_view bytes);

}  // namespace kvc::storage
