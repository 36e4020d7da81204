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
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::storage {

struct SlotReservation {
  uint64_t min_sequence = 0;
  std::vector<uint64_t> slots;
};

// The index metadata name the reservation is kept under.
inline constexpr char kReservationMeta[] = "slot_reservation";

std::string EncodeSlotReservation(const SlotReservation& r);
// DataLoss if the bytes are not a reservation this version wrote.
absl::StatusOr<SlotReservation> DecodeSlotReservation(std::string_view bytes);

}  // namespace kvc::storage
